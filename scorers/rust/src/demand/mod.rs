//! The demand scorer (docs/specs/demand-scorer.md): `Demand::load(dir, now)` verifies a
//! demand artifact and reads its flat trees; `Demand::hint(request, now_ms)` answers a
//! pre-dispatch hint as `replaylab.runtime.DemandPredictor` does.
//!
//! - `scorer`: the artifact's sections, a request's feature row, the hint;
//! - `request`: reading the request's fields as the Python runtime reads them;
//! - `trees`: `trees.safetensors`, walked as LightGBM walks its trees;
//! - `golden`: the artifact's golden vectors, checked; a hint as one JSON line.

pub mod golden;
pub mod request;
pub mod scorer;
pub mod trees;

pub use scorer::{Demand, Hint};
