//! What every part of the crate uses: the error type, a strict JSON reader with
//! Python-compatible writers (canonical JSON, `repr(float)`), SHA-256 and ISO 8601 times.

pub mod error;
pub mod json;
pub mod sha256;
pub mod timefmt;
