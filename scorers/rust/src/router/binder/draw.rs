//! The exploration draw of a session (docs/specs/binder.md, "Exploration"), bit for bit
//! `replaylab.runtime.binder.exploration_draw` / `explored_index`: which sessions are
//! explored, and which other candidate an explored session opens on.

use crate::util::sha256::Sha256;

pub const SEPARATOR: u8 = 0x1f;
const TWO_POW_MINUS_53: f64 = 1.0 / 9_007_199_254_740_992.0;

/// u(s) in [0, 1) on a 2^-53 grid: SHA-256 of salt, 0x1f, session id (UTF-8); the first
/// 8 bytes big-endian, top 53 bits, times 2^-53 (exact).
pub fn exploration_draw(salt: &str, session_id: &str) -> f64 {
    let mut h = Sha256::new();
    h.update(salt.as_bytes());
    h.update(&[SEPARATOR]);
    h.update(session_id.as_bytes());
    let d = h.finish();
    let x = u64::from_be_bytes(d[..8].try_into().expect("8 bytes")) >> 11;
    x as f64 * TWO_POW_MINUS_53
}

/// Index among the K - 1 other candidates of an explored session: min(floor(u / rate *
/// (K - 1)), K - 2); None when not explored (u >= rate, rate <= 0 or NaN, or K < 2).
#[allow(clippy::neg_cmp_op_on_partial_ord)] // NaN rate: not explored, as in Python
pub fn explored_index(u: f64, rate: f64, k: usize) -> Option<usize> {
    if k < 2 || !(rate > 0.0) || !(u < rate) {
        return None;
    }
    let j = (u / rate * (k - 1) as f64).floor();
    Some((j as usize).min(k - 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_draw_is_sha256_top_53_bits() {
        // hashlib.sha256(b"\x1f").digest()[:8] (empty salt, empty id)
        let d = crate::util::sha256::sha256(&[0x1f]);
        let want = (u64::from_be_bytes(d[..8].try_into().unwrap()) >> 11) as f64 / 9_007_199_254_740_992.0;
        assert_eq!(exploration_draw("", "").to_bits(), want.to_bits());
        assert!((0.0..1.0).contains(&exploration_draw("salt", "s1")));
        assert_ne!(exploration_draw("a", "b"), exploration_draw("ab", ""));
    }

    #[test]
    fn explored_index_splits_the_rate_evenly() {
        assert_eq!(explored_index(0.5, 0.1, 2), None);
        assert_eq!(explored_index(0.0, 0.0, 2), None);
        assert_eq!(explored_index(0.01, 0.1, 1), None);
        assert_eq!(explored_index(0.09999, 0.1, 2), Some(0));
        assert_eq!(explored_index(0.049, 0.1, 3), Some(0));
        assert_eq!(explored_index(0.051, 0.1, 3), Some(1));
        assert_eq!(explored_index(0.1 - 1e-17, 0.1, 3), Some(1));
        assert_eq!(explored_index(0.0, f64::NAN, 3), None);
    }
}
