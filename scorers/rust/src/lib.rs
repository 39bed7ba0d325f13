//! replaylab-scorer: the reference scorer of replaylab's static-tier router artifacts,
//! standard library only (docs/specs/router-scorer.md is the specification it implements).
//!
//! `Router::load(dir, now)` verifies the artifact (both manifests: sizes, sha256,
//! content hashes, validity), reads the static encoder (charmap.tsv, vocab.txt,
//! embeddings.safetensors) and the head (head.safetensors); `Router::route(text,
//! category, prompt_tokens)` tokenizes, embeds, runs the head and decides.
//!
//! `Binder::new(router, config)`: sticky session bindings over a router, with
//! exploration, escalation and a bounded memory (docs/specs/binder.md).
//!
//! `Demand::load(dir, now)` verifies a demand artifact and reads its flat trees
//! (trees.safetensors); `Demand::hint(request, now_ms)` answers a pre-dispatch demand
//! hint (docs/specs/demand-scorer.md).

pub mod binder;
pub mod demand;
pub mod demand_golden;
pub mod demand_trees;
pub mod encoder;
pub mod error;
pub mod golden;
pub mod head;
pub mod json;
pub mod manifest;
pub mod router;
pub mod routing;
pub mod safetensors;
pub mod sha256;
pub mod timefmt;
pub mod tokenizer;

pub use binder::{Binder, Receipt};
pub use demand::{Demand, Hint};
pub use error::Error;
pub use router::{Decision, Router};
