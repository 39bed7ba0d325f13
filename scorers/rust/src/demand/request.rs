//! A request's fields read as `replaylab.runtime.demand` reads them (docs/specs/demand-scorer.md
//! section 4): numbers (a bool counts, null is the default), Python's `str()` of a scalar
//! (a category's vocabulary key), ISO 8601 and epoch timestamps (`datetime.fromisoformat`,
//! `int(dt.timestamp() * 1000)`), the request id. A field none of these can read makes the
//! hint fall back with `bad_request`.

use std::collections::BTreeMap;

use crate::util::json::{self, py_float_repr, Json};
use crate::util::timefmt;

/// A request field the scorer cannot read (the hint falls back with `bad_request`).
pub struct BadRequest;

/// `_number`: None/null -> default; a number or a bool as f64; anything else is a bad request.
#[inline]
pub fn number(v: Option<&Json>, default: f64) -> Result<f64, BadRequest> {
    match v {
        None | Some(Json::Null) => Ok(default),
        Some(Json::Num(n)) => Ok(n.value),
        Some(Json::Bool(b)) => Ok(if *b { 1.0 } else { 0.0 }),
        _ => Err(BadRequest),
    }
}

pub fn lenient(v: Option<&Json>) -> f64 {
    number(v, f64::NAN).unwrap_or(f64::NAN)
}

/// Python's `str(value)` of a scalar JSON value (None for null; a bad request for arrays
/// and objects, whose Python str() no vocabulary holds).
pub fn py_str(v: &Json) -> Result<Option<String>, BadRequest> {
    Ok(match v {
        Json::Null => None,
        Json::Str(s) => Some(s.clone()),
        Json::Bool(b) => Some(if *b { "True" } else { "False" }.to_string()),
        Json::Num(n) => Some(match &n.int {
            Some(d) => d.clone(),
            None => py_float_repr(n.value),
        }),
        _ => return Err(BadRequest),
    })
}

/// `datetime.fromisoformat` (the RFC 3339 / ISO 8601 extended forms), naive = UTC ->
/// epoch ms exactly as Python's `int(dt.timestamp() * 1000)`.
pub fn iso_ms(s: &str) -> Option<i128> {
    let b = s.as_bytes();
    let digits = |a: usize, n: usize| -> Option<i64> {
        let p = s.get(a..a + n)?;
        p.bytes().all(|c| c.is_ascii_digit()).then(|| p.parse().ok()).flatten()
    };
    if b.len() < 10 || b[4] != b'-' || b[7] != b'-' {
        return None;
    }
    let (y, mo, d) = (digits(0, 4)?, digits(5, 2)?, digits(8, 2)?);
    let (mut h, mut mi, mut sec, mut us) = (0, 0, 0, 0i64);
    let mut i = 10;
    let mut offset = 0i64;
    if i < b.len() {
        if !matches!(b[i], b'T' | b' ') {
            return None;
        }
        h = digits(i + 1, 2)?;
        i += 3;
        if b.get(i) == Some(&b':') {
            mi = digits(i + 1, 2)?;
            i += 3;
            if b.get(i) == Some(&b':') {
                sec = digits(i + 1, 2)?;
                i += 3;
                if matches!(b.get(i), Some(b'.' | b',')) {
                    let start = i + 1;
                    i = start;
                    while i < b.len() && b[i].is_ascii_digit() {
                        i += 1;
                    }
                    if i == start {
                        return None;
                    }
                    // microseconds: the first 6 digits, padded (Python ignores the rest)
                    let mut f: String = s[start..i].chars().take(6).collect();
                    while f.len() < 6 {
                        f.push('0');
                    }
                    us = f.parse().ok()?;
                }
            }
        }
        match &s[i..] {
            "" => {}
            "Z" | "z" => {}
            z if z.len() == 6 && matches!(z.as_bytes()[0], b'+' | b'-') && z.as_bytes()[3] == b':' => {
                let v = digits(i + 1, 2)? * 3600 + digits(i + 4, 2)? * 60;
                if digits(i + 1, 2)? > 23 || digits(i + 4, 2)? > 59 {
                    return None;
                }
                offset = if z.starts_with('-') { -v } else { v };
            }
            _ => return None,
        }
    }
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let mdays = [31, if leap { 29 } else { 28 }, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    if y < 1 || !(1..=12).contains(&mo) || d < 1 || d > mdays[(mo - 1) as usize] || h > 23 || mi > 59 || sec > 59 {
        return None;
    }
    let days = timefmt::days_from_civil(y, mo, d);
    let total_us = ((days * 86400 + h * 3600 + mi * 60 + sec - offset) as i128) * 1_000_000 + us as i128;
    // timedelta.total_seconds(): microseconds / 10**6 (correctly rounded), then * 1000, int()
    let secs = total_us as f64 / 1e6;
    Some((secs * 1000.0).trunc() as i128)
}

/// `_epoch_ms`: null/absent -> now; a number -> int(value) (NaN/inf -> now); a string ->
/// ISO 8601; anything else is a bad request.
pub fn epoch_ms(v: Option<&Json>, now_ms: i64) -> Result<i128, BadRequest> {
    match v {
        None | Some(Json::Null) => Ok(now_ms as i128),
        Some(Json::Str(s)) => iso_ms(s).ok_or(BadRequest),
        other => {
            let x = number(other, f64::NAN)?;
            Ok(if x.is_finite() { x.trunc() as i128 } else { now_ms as i128 })
        }
    }
}

pub fn request_id(r: Option<&BTreeMap<String, Json>>) -> Option<String> {
    match r.and_then(|r| r.get("request_id")) {
        None | Some(Json::Null) => None,
        Some(v) => py_str(v).ok().flatten().or_else(|| json::canonical(v).ok()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso_timestamps_are_pythons() {
        // int(datetime.fromisoformat(s).timestamp() * 1000), computed in CPython 3.11
        assert_eq!(iso_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(iso_ms("2023-11-16T00:41:37.747Z"), Some(1700095297747));
        assert_eq!(iso_ms("2023-11-16T02:41:37.747+02:00"), Some(1700095297747));
        assert_eq!(iso_ms("2023-11-16 00:41:37.7479999"), Some(1700095297747));
        assert_eq!(iso_ms("2023-11-16"), Some(1700092800000));
        assert_eq!(iso_ms("1969-12-31T23:59:59.9995Z"), Some(0)); // -0.5 ms truncates toward 0
        assert_eq!(iso_ms("2023-02-29T00:00:00Z"), None);
        assert_eq!(iso_ms("yesterday"), None);
    }

    #[test]
    fn python_str_of_json_scalars() {
        let s = |t: &str| py_str(&json::parse(t).unwrap()).ok().flatten();
        assert_eq!(s("3"), Some("3".into()));
        assert_eq!(s("3.0"), Some("3.0".into()));
        assert_eq!(s("1e20"), Some("1e+20".into()));
        assert_eq!(s("true"), Some("True".into()));
        assert_eq!(s("\"chat\""), Some("chat".into()));
        assert_eq!(s("null"), None);
        assert!(py_str(&json::parse("[1]").unwrap()).is_err());
    }
}
