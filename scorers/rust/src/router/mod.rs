//! The router scorer (docs/specs/router-scorer.md) and the session binder over it
//! (docs/specs/binder.md).
//!
//! - `scorer`: `Router::load(dir, now)` verifies the artifact (both manifests) and reads
//!   it; `Router::route(text, category, prompt_tokens)` decides (static tier);
//!   `Router::route_embedding(emb, category, prompt_tokens)` decides on the host's own
//!   embedding (either tier; the MiniLM tier loads for this only);
//! - `tokenizer`, `encoder`: the static encoder (charmap.tsv + vocab.txt, embeddings);
//! - `head`: the MLP head's forward pass from head.safetensors;
//! - `routing`: the decision rule; `golden`: the artifact's golden vectors, checked, and
//!   a host's encoder checked on the MiniLM tier's golden triples (`verify_encoder`);
//! - `binder`: sticky session bindings with exploration, escalation and bounded memory.

pub mod binder;
pub mod encoder;
pub mod golden;
pub mod head;
pub mod routing;
pub mod scorer;
pub mod tokenizer;

pub use scorer::{Decision, Router, Tier};
