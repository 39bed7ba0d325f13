//! A small strict JSON reader and Python-compatible writers (standard library only).
//!
//! Reading follows RFC 8259 (what Python's `json.loads` accepts, minus its
//! NaN / Infinity extensions): objects, arrays, strings with `\u` escapes
//! (surrogate pairs joined; a lone surrogate is refused, since it is no
//! Unicode text), numbers, `true`, `false`, `null`. A number keeps whether it
//! was an integer literal (Python reads it as `int`) or not (`float`), so that
//! [`canonical`] re-serialises it exactly as `replaylab.contracts.manifest.
//! canonical_json` does. Floats are parsed with `str::parse::<f64>`, which
//! rounds correctly, as CPython's `float()`.
//!
//! Duplicate keys: the last value wins (Python's dict).
//!
//! Here: the value types, the reader and the accessors; `write.rs`: the writers
//! ([`canonical`], [`py_float_repr`], [`write_str`]).

use std::collections::BTreeMap;

mod write;

pub use write::{canonical, py_float_repr, write_str};

/// A JSON number: its f64 value and, for an integer literal, its digits.
#[derive(Clone, Debug, PartialEq)]
pub struct Number {
    pub value: f64,
    /// `Some(digits)` (an optional `-` and decimal digits, `-0` written `0`) when the
    /// literal had neither a fraction nor an exponent: Python's `int`.
    pub int: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    Num(Number),
    Str(String),
    Arr(Vec<Json>),
    /// Keys in byte order of their UTF-8, which is codepoint order: Python's `sort_keys`.
    Obj(BTreeMap<String, Json>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct JsonError {
    pub offset: usize,
    pub message: String,
}

impl std::fmt::Display for JsonError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at byte {}", self.message, self.offset)
    }
}

impl std::error::Error for JsonError {}

const MAX_DEPTH: usize = 512;

/// Parse one JSON document (surrounding whitespace allowed).
pub fn parse(text: &str) -> Result<Json, JsonError> {
    let mut p = Parser { s: text.as_bytes(), i: 0, depth: 0 };
    p.ws();
    let v = p.value()?;
    p.ws();
    if p.i != p.s.len() {
        return Err(p.err("extra data after the JSON value"));
    }
    Ok(v)
}

/// Parse JSON from bytes that must be UTF-8.
pub fn parse_bytes(data: &[u8]) -> Result<Json, JsonError> {
    let text = std::str::from_utf8(data).map_err(|e| JsonError {
        offset: e.valid_up_to(),
        message: "not UTF-8".into(),
    })?;
    parse(text)
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
    depth: usize,
}

impl<'a> Parser<'a> {
    fn err(&self, message: &str) -> JsonError {
        JsonError { offset: self.i, message: message.to_string() }
    }

    fn ws(&mut self) {
        while self.i < self.s.len() && matches!(self.s[self.i], b' ' | b'\t' | b'\n' | b'\r') {
            self.i += 1;
        }
    }

    fn lit(&mut self, word: &str, v: Json) -> Result<Json, JsonError> {
        if self.s[self.i..].starts_with(word.as_bytes()) {
            self.i += word.len();
            Ok(v)
        } else {
            Err(self.err("invalid literal"))
        }
    }

    fn value(&mut self) -> Result<Json, JsonError> {
        match self.s.get(self.i) {
            None => Err(self.err("unexpected end of input")),
            Some(b'{') => self.object(),
            Some(b'[') => self.array(),
            Some(b'"') => Ok(Json::Str(self.string()?)),
            Some(b't') => self.lit("true", Json::Bool(true)),
            Some(b'f') => self.lit("false", Json::Bool(false)),
            Some(b'n') => self.lit("null", Json::Null),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(_) => Err(self.err("unexpected character")),
        }
    }

    fn enter(&mut self) -> Result<(), JsonError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.err("nesting too deep"));
        }
        Ok(())
    }

    fn object(&mut self) -> Result<Json, JsonError> {
        self.enter()?;
        self.i += 1;
        let mut map = BTreeMap::new();
        self.ws();
        if self.s.get(self.i) == Some(&b'}') {
            self.i += 1;
            self.depth -= 1;
            return Ok(Json::Obj(map));
        }
        loop {
            self.ws();
            if self.s.get(self.i) != Some(&b'"') {
                return Err(self.err("expected a string key"));
            }
            let key = self.string()?;
            self.ws();
            if self.s.get(self.i) != Some(&b':') {
                return Err(self.err("expected ':'"));
            }
            self.i += 1;
            self.ws();
            let v = self.value()?;
            map.insert(key, v);
            self.ws();
            match self.s.get(self.i) {
                Some(b',') => self.i += 1,
                Some(b'}') => {
                    self.i += 1;
                    self.depth -= 1;
                    return Ok(Json::Obj(map));
                }
                _ => return Err(self.err("expected ',' or '}'")),
            }
        }
    }

    fn array(&mut self) -> Result<Json, JsonError> {
        self.enter()?;
        self.i += 1;
        let mut out = Vec::new();
        self.ws();
        if self.s.get(self.i) == Some(&b']') {
            self.i += 1;
            self.depth -= 1;
            return Ok(Json::Arr(out));
        }
        loop {
            self.ws();
            out.push(self.value()?);
            self.ws();
            match self.s.get(self.i) {
                Some(b',') => self.i += 1,
                Some(b']') => {
                    self.i += 1;
                    self.depth -= 1;
                    return Ok(Json::Arr(out));
                }
                _ => return Err(self.err("expected ',' or ']'")),
            }
        }
    }

    fn hex4(&mut self) -> Result<u32, JsonError> {
        let h = self.s.get(self.i..self.i + 4).ok_or_else(|| self.err("short \\u escape"))?;
        let mut v = 0u32;
        for &b in h {
            let d = (b as char).to_digit(16).ok_or_else(|| self.err("bad \\u escape"))?;
            v = v * 16 + d;
        }
        self.i += 4;
        Ok(v)
    }

    fn string(&mut self) -> Result<String, JsonError> {
        self.i += 1; // the opening quote
        let mut out = String::new();
        loop {
            let start = self.i;
            while self.i < self.s.len() && !matches!(self.s[self.i], b'"' | b'\\' | 0..=0x1f) {
                self.i += 1;
            }
            // the input is a &str, and we stopped at an ASCII byte: a char boundary
            out.push_str(std::str::from_utf8(&self.s[start..self.i]).expect("utf-8 input"));
            match self.s.get(self.i) {
                None => return Err(self.err("unterminated string")),
                Some(b'"') => {
                    self.i += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.i += 1;
                    let c = *self.s.get(self.i).ok_or_else(|| self.err("unterminated string"))?;
                    self.i += 1;
                    match c {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let hi = self.hex4()?;
                            let cp = if (0xD800..0xDC00).contains(&hi) {
                                if self.s.get(self.i..self.i + 2) != Some(b"\\u") {
                                    return Err(self.err("lone high surrogate"));
                                }
                                self.i += 2;
                                let lo = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&lo) {
                                    return Err(self.err("high surrogate without a low one"));
                                }
                                0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                            } else if (0xDC00..0xE000).contains(&hi) {
                                return Err(self.err("lone low surrogate"));
                            } else {
                                hi
                            };
                            out.push(char::from_u32(cp).ok_or_else(|| self.err("bad codepoint"))?);
                        }
                        _ => return Err(self.err("bad escape")),
                    }
                }
                Some(_) => return Err(self.err("control character in string")),
            }
        }
    }

    fn number(&mut self) -> Result<Json, JsonError> {
        let start = self.i;
        let s = self.s;
        let digits = |i: &mut usize| {
            let b = *i;
            while *i < s.len() && s[*i].is_ascii_digit() {
                *i += 1;
            }
            *i - b
        };
        if s[self.i] == b'-' {
            self.i += 1;
        }
        match s.get(self.i) {
            Some(b'0') => self.i += 1,
            Some(b'1'..=b'9') => {
                digits(&mut self.i);
            }
            _ => return Err(self.err("bad number")),
        }
        let mut integer = true;
        if s.get(self.i) == Some(&b'.') {
            self.i += 1;
            integer = false;
            if digits(&mut self.i) == 0 {
                return Err(self.err("bad number: no digit after '.'"));
            }
        }
        if matches!(s.get(self.i), Some(b'e' | b'E')) {
            self.i += 1;
            integer = false;
            if matches!(s.get(self.i), Some(b'+' | b'-')) {
                self.i += 1;
            }
            if digits(&mut self.i) == 0 {
                return Err(self.err("bad number: no exponent digits"));
            }
        }
        let lit = std::str::from_utf8(&s[start..self.i]).expect("ascii");
        let value: f64 = lit.parse().map_err(|_| self.err("bad number"))?;
        if !integer && !value.is_finite() {
            // Python reads 1e999 as inf; canonical_json (allow_nan=False) refuses it
            return Err(self.err("number out of the float range"));
        }
        let int = integer.then(|| if lit == "-0" { "0".to_string() } else { lit.to_string() });
        Ok(Json::Num(Number { value, int }))
    }
}

// ------------------------------------------------------------------------- accessors
impl Json {
    pub fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Obj(m) => m.get(key),
            _ => None,
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Json::Str(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Json::Num(n) => Some(n.value),
            _ => None,
        }
    }
    /// An integer literal that fits i64 (Python `type(x) is int`).
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Json::Num(Number { int: Some(d), .. }) => d.parse().ok(),
            _ => None,
        }
    }
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Json::Bool(b) => Some(*b),
            _ => None,
        }
    }
    pub fn as_array(&self) -> Option<&[Json]> {
        match self {
            Json::Arr(a) => Some(a),
            _ => None,
        }
    }
    pub fn as_object(&self) -> Option<&BTreeMap<String, Json>> {
        match self {
            Json::Obj(m) => Some(m),
            _ => None,
        }
    }
    pub fn is_null(&self) -> bool {
        matches!(self, Json::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_values_and_escapes() {
        let v = parse(r#" {"a": [1, -0, 2.5, -1e-7, true, false, null], "b": "x\u00e9\ud83d\ude00\n\"", "a2": {}} "#).unwrap();
        let a = v.get("a").unwrap().as_array().unwrap();
        assert_eq!(a[0].as_i64(), Some(1));
        assert_eq!(a[1], Json::Num(Number { value: -0.0, int: Some("0".into()) }));
        assert_eq!(a[2].as_f64(), Some(2.5));
        assert_eq!(a[3].as_f64(), Some(-1e-7));
        assert_eq!(v.get("b").unwrap().as_str(), Some("x\u{e9}\u{1F600}\n\""));
        assert_eq!(canonical(&v).unwrap(),
                   "{\"a\":[1,0,2.5,-1e-07,true,false,null],\"a2\":{},\"b\":\"x\u{e9}\u{1F600}\\n\\\"\"}");
    }

    #[test]
    fn refuses_bad_json() {
        for bad in ["", "{", "[1,]", "{\"a\" 1}", "01", "1.", "1e", "NaN", "Infinity", "\"\\ud800\"",
                    "\"\\udc00x\"", "\"a\u{1}\"", "tru", "[1] 2", "\"\\x\"", "1e999", "-"] {
            assert!(parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn duplicate_keys_last_wins() {
        let v = parse(r#"{"k": 1, "k": 2}"#).unwrap();
        assert_eq!(v.get("k").unwrap().as_i64(), Some(2));
    }
}
