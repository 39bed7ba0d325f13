//! The writers: Python's `repr(float)`, a string literal as `json.dumps(...,
//! ensure_ascii=False)` writes it, and replaylab's `canonical_json` (the bytes every
//! content hash and golden record is taken over).

use std::fmt::Write as _;

use super::{Json, Number};

/// Python's `repr(float)`: the shortest digits that round-trip, in fixed notation when
/// the decimal exponent is in [-4, 16), else `d.ddde[+-]XX`; integral values end in `.0`.
/// Rust's `{:e}` gives the same shortest digits (both pick the closest shortest string).
pub fn py_float_repr(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0.0".into() } else { "0.0".into() };
    }
    let e = format!("{:e}", x);
    let (neg, body) = match e.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, e.as_str()),
    };
    let (mant, exp) = body.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("exponent");
    let digits: String = mant.chars().filter(|c| *c != '.').collect();
    let (digits, exp) = half_even(digits, exp, x);
    let decpt = exp + 1; // value = 0.DIGITS x 10^decpt
    let mut out = String::with_capacity(digits.len() + 8);
    if neg {
        out.push('-');
    }
    let n = digits.len() as i32;
    if decpt <= -4 || decpt > 16 {
        out.push_str(&digits[..1]);
        if n > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let e = decpt - 1;
        let _ = write!(out, "e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs());
    } else if decpt <= 0 {
        out.push_str("0.");
        for _ in 0..(-decpt) {
            out.push('0');
        }
        out.push_str(&digits);
    } else if decpt >= n {
        out.push_str(&digits);
        for _ in 0..(decpt - n) {
            out.push('0');
        }
        out.push_str(".0");
    } else {
        out.push_str(&digits[..decpt as usize]);
        out.push('.');
        out.push_str(&digits[decpt as usize..]);
    }
    out
}

/// Shortest digits of `x` (`d.ddd` x 10^exp) with Python's tie rule. When x lies exactly
/// halfway between two shortest candidates (e.g. 750491719877574.25 between ...574.2 and
/// ...574.3), Python's dtoa picks the even last digit; Rust's `{:e}` may pick the other.
fn half_even(digits: String, exp: i32, x: f64) -> (String, i32) {
    let n = digits.len();
    if digits.as_bytes()[n - 1].is_multiple_of(2) {
        return (digits, exp);
    }
    // A tie's exact expansion ends in a 5 within n + 1 significant digits, so x correctly
    // rounded to n + 1 digits (short and cheap) is that expansion padded with zeros: when
    // its last non-zero digit is not 5 there is no tie, and the 800-digit expansion below
    // (the cost of most calls before this check) is skipped.
    let short = format!("{:.*e}", n, x.abs());
    let short_mant = short.split_once('e').expect("exponent").0.trim_end_matches('0');
    if !short_mant.ends_with('5') {
        return (digits, exp);
    }
    // the exact decimal expansion of x (an f64 has at most 767 significant digits)
    let e = format!("{:.800e}", x.abs());
    let (m, ee) = e.split_once('e').expect("exponent");
    let ee: i32 = ee.parse().expect("exponent");
    let mut exact: String = m.chars().filter(|c| *c != '.').collect();
    if ee == exp - 1 {
        exact.insert(0, '0');
    } else if ee != exp {
        return (digits, exp);
    }
    let b = exact.as_bytes();
    if b.len() <= n || b[n] != b'5' || !b[n + 1..].iter().all(|&c| c == b'0') {
        return (digits, exp); // not a tie
    }
    let lower = exact[..n].to_string();
    let (cand, cexp) = if lower.as_bytes()[n - 1].is_multiple_of(2) {
        (lower, exp)
    } else {
        // lower + 1 in the last place, with carry
        let mut v = lower.into_bytes();
        let mut i = n;
        loop {
            if i == 0 {
                v.insert(0, b'1');
                break;
            }
            i -= 1;
            if v[i] == b'9' {
                v[i] = b'0';
            } else {
                v[i] += 1;
                break;
            }
        }
        let carried = v.len() > n;
        (String::from_utf8(v).expect("digits"), if carried { exp + 1 } else { exp })
    };
    let trimmed = cand.trim_start_matches('0');
    let cexp = cexp - (cand.len() - trimmed.len()) as i32; // a leading 0 moves the point
    let cand = trimmed.trim_end_matches('0');
    if cand.is_empty() {
        return (digits, exp);
    }
    let back: Option<f64> = format!("{}.{}e{}", &cand[..1], &cand[1..], cexp).parse().ok();
    if back == Some(x.abs()) {
        (cand.to_string(), cexp)
    } else {
        (digits, exp)
    }
}

/// A JSON string literal as Python's `json.dumps(..., ensure_ascii=False)` writes it.
pub fn write_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `canonical_json` of replaylab (sort_keys, separators (",", ":"), ensure_ascii=False,
/// allow_nan=False), as UTF-8 text. Errors on a non-finite float.
pub fn canonical(v: &Json) -> Result<String, String> {
    let mut out = String::new();
    canonical_into(&mut out, v)?;
    Ok(out)
}

fn canonical_into(out: &mut String, v: &Json) -> Result<(), String> {
    match v {
        Json::Null => out.push_str("null"),
        Json::Bool(true) => out.push_str("true"),
        Json::Bool(false) => out.push_str("false"),
        Json::Num(Number { int: Some(d), .. }) => out.push_str(d),
        Json::Num(Number { value, int: None }) => {
            if !value.is_finite() {
                return Err("non-finite number".into());
            }
            out.push_str(&py_float_repr(*value));
        }
        Json::Str(s) => write_str(out, s),
        Json::Arr(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical_into(out, x)?;
            }
            out.push(']');
        }
        Json::Obj(m) => {
            out.push('{');
            for (i, (k, x)) in m.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_str(out, k);
                out.push(':');
                canonical_into(out, x)?;
            }
            out.push('}');
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_is_pythons() {
        // expected strings: Python's repr()
        let cases = [(1e-5, "1e-05"), (0.0001, "0.0001"), (1e16, "1e+16"), (1.5e16, "1.5e+16"),
                     (1234567890123456.0, "1234567890123456.0"), (0.1, "0.1"), (100.0, "100.0"),
                     (-0.0, "-0.0"), (5e-324, "5e-324"), (1.7976931348623157e308, "1.7976931348623157e+308"),
                     (0.30000000000000004, "0.30000000000000004"), (-0.22785193094041978, "-0.22785193094041978"),
                     (123.456, "123.456"), (1e22, "1e+22"), (2.0 / 3.0, "0.6666666666666666"),
                     (0.00012, "0.00012"), (9.999999999999999e-5, "9.999999999999999e-05"),
                     // ties between two shortest candidates: the even digit, as Python
                     (750491719877574.2, "750491719877574.2"), (-1827198780960226.2, "-1827198780960226.2"),
                     (0.5, "0.5"), (2.5, "2.5"), (0.125, "0.125"), (1.5e-7, "1.5e-07"), (3.0, "3.0")];
        for (x, want) in cases {
            assert_eq!(py_float_repr(x), want, "{x:e}");
        }
    }

    #[test]
    fn strings_escape_as_python() {
        let mut s = String::new();
        write_str(&mut s, "a\u{1}\u{7f}\u{2028}é\t");
        assert_eq!(s, "\"a\\u0001\u{7f}\u{2028}é\\t\"");
    }
}
