//! replaylab-scorer: the reference scorers of replaylab's artifacts, standard library only.
//!
//! - `router`: static-tier router artifacts (docs/specs/router-scorer.md).
//!   `Router::load(dir, now)` verifies the artifact (both manifests: sizes, sha256,
//!   content hashes, validity), reads the static encoder (charmap.tsv, vocab.txt,
//!   embeddings.safetensors) and the head (head.safetensors); `Router::route(text,
//!   category, prompt_tokens)` tokenizes, embeds, runs the head and decides.
//!   `Binder::new(router, config)` (`router::binder`): sticky session bindings over a
//!   router, with exploration, escalation and a bounded memory (docs/specs/binder.md).
//! - `demand`: demand artifacts (docs/specs/demand-scorer.md). `Demand::load(dir, now)`
//!   verifies one and reads its flat trees (trees.safetensors); `Demand::hint(request,
//!   now_ms)` answers a pre-dispatch demand hint.
//! - `artifact`: what both load through: manifest verification, safetensors.
//! - `ffi`: the C ABI over `demand`, `router` and the binder (docs/specs/c-abi.md, header
//!   include/replaylab.h), built into libreplaylab_scorer.so and .a.
//! - `util`: the error type, JSON (Python-compatible writers), SHA-256, ISO 8601 times.
//!
//! tests/fixtures holds a tiny artifact of each kind (scripts/make_rust_fixtures.py), which
//! `cargo test` checks.

pub mod artifact;
pub mod demand;
pub mod ffi;
pub mod router;
pub mod util;

pub use demand::{Demand, Hint};
pub use router::binder::{Binder, Receipt};
pub use router::{Decision, Router};
pub use util::error::Error;
