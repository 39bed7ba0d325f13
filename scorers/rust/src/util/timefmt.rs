//! ISO 8601 timestamps as the manifests write them (`2026-12-04T06:30:43.284413Z`, or an
//! explicit `+HH:MM` offset) -> seconds since the Unix epoch. A timestamp without a zone
//! is refused, as by the Python verifier.

use crate::util::error::Error;

pub fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    // Howard Hinnant's algorithm: days since 1970-01-01 of a proleptic Gregorian date
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146097 + doe - 719468
}

pub fn parse_iso(s: &str, field: &str) -> Result<f64, Error> {
    let bad = |why: &str| Error::new("malformed", format!("{field} is not ISO 8601 ({why}): {s:?}"));
    let b = s.as_bytes();
    let num = |a: usize, n: usize| -> Result<i64, Error> {
        let part = s.get(a..a + n).ok_or_else(|| bad("too short"))?;
        if !part.bytes().all(|c| c.is_ascii_digit()) {
            return Err(bad("not a digit"));
        }
        Ok(part.parse().expect("digits"))
    };
    if b.len() < 16 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b' ') || b[13] != b':' {
        return Err(bad("layout"));
    }
    let (y, mo, d, h, mi) = (num(0, 4)?, num(5, 2)?, num(8, 2)?, num(11, 2)?, num(14, 2)?);
    let mut i = 16;
    let mut sec = 0.0;
    if b.get(i) == Some(&b':') {
        sec = num(i + 1, 2)? as f64;
        i += 3;
        if b.get(i) == Some(&b'.') {
            let start = i + 1;
            i = start;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            if i == start {
                return Err(bad("empty fraction"));
            }
            sec += format!("0.{}", &s[start..i]).parse::<f64>().expect("digits");
        }
    }
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec >= 61.0 {
        return Err(bad("field out of range"));
    }
    let offset = match &s[i..] {
        "Z" | "z" => 0,
        "" => return Err(Error::new("malformed", format!("{field} has no timezone"))),
        z if z.len() == 6 && matches!(z.as_bytes()[0], b'+' | b'-') && z.as_bytes()[3] == b':' => {
            let v = num(i + 1, 2)? * 3600 + num(i + 4, 2)? * 60;
            if z.starts_with('-') { -v } else { v }
        }
        _ => return Err(bad("zone")),
    };
    let days = days_from_civil(y, mo, d);
    Ok((days * 86400 + h * 3600 + mi * 60 - offset) as f64 + sec)
}

/// Now, in seconds since the Unix epoch.
pub fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_manifest_times() {
        assert_eq!(parse_iso("1970-01-01T00:00:00Z", "t").unwrap(), 0.0);
        // date -u -d 2026-12-04T06:30:43Z +%s
        assert_eq!(parse_iso("2026-12-04T06:30:43Z", "t").unwrap(), 1796365843.0);
        let f = parse_iso("2026-12-04T06:30:43.25Z", "t").unwrap();
        assert!((f - 1796365843.25).abs() < 1e-6);
        assert_eq!(parse_iso("2026-12-04T08:30:43+02:00", "t").unwrap(), 1796365843.0);
        assert!(parse_iso("2026-12-04T06:30:43", "t").is_err());
        assert!(parse_iso("2026-13-04T06:30:43Z", "t").is_err());
    }
}
