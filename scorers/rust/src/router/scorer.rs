//! Load a router artifact (verified) and route one query.
//!
//! Load order (as `replaylab.runtime.Router.load`): the router manifest (kind `router`)
//! and every file it lists -> `router.json` (tier `static` or `minilm`) -> the encoder
//! manifest (kind `encoder`) under `router.json` `encoder.dir` and every file it lists ->
//! the encoder manifest's content_hash equals the router manifest's
//! `features[0].encoder_content_hash` -> (static tier) `static_config.json`, vocab,
//! charmap, embeddings; (MiniLM tier) the encoder manifest's `outputs.dimension` ->
//! `head.safetensors` -> candidates, threshold, rule, fallback.
//!
//! The MiniLM tier loads for embedding-only routing (docs/specs/router-scorer.md,
//! "Routing on the host's embedding"): this crate has no transformer, so `route(text)`
//! answers `embedding_only` and `route_embedding(emb)` scores the head on an
//! all-MiniLM-L6-v2 embedding the host computed; the encoder's ONNX files are verified
//! (hashed) but not kept.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use crate::router::encoder::StaticEncoder;
use crate::util::error::Error;
use crate::router::head::Head;
use crate::util::json::{self, py_float_repr, write_str, Json};
use crate::artifact::manifest::{self, Store, Verified};
use crate::router::routing::{self, Rule};
use crate::artifact::safetensors;
use crate::router::tokenizer::{parse_vocab, Charmap, Tokenizer};

/// Which encoder the artifact ships (`router.json` `encoder.tier`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    /// the static encoder: this crate embeds text itself
    Static,
    /// the MiniLM ONNX encoder: routed only on the host's embedding (`route_embedding`)
    Minilm,
}

impl Tier {
    pub fn name(self) -> &'static str {
        match self {
            Tier::Static => "static",
            Tier::Minilm => "minilm",
        }
    }
}

pub struct Router {
    pub tier: Tier,
    /// the embedding dimension the head takes (the encoder manifest's `outputs.dimension`)
    pub dimension: usize,
    /// the encoder's model id (`outputs.model_id`), what a host's embedding must come from
    pub encoder_model_id: String,
    pub candidates: Vec<String>,
    pub threshold: f64,
    pub rule: Rule,
    pub fallback: usize,
    pub chars_per_token: f64,
    pub categories: HashMap<String, usize>,
    pub head: Head,
    /// the static encoder; None for the MiniLM tier (embedding-only routing)
    pub encoder: Option<StaticEncoder>,
    /// `<version>+<first 12 hex of content_hash>`, as the Python router reports it
    pub version: String,
    pub manifest: Verified,
    pub encoder_manifest: Verified,
}

/// One routing answer.
#[derive(Clone, Debug)]
pub struct Decision {
    pub candidate: usize,
    pub success_prob: Vec<f64>,
    pub margin: f64,
    /// the static encoder's token ids; empty for a route on the host's embedding
    pub token_ids: Vec<u32>,
}

fn cfg(m: String) -> Error {
    Error::new("bad_config", m)
}

fn utf8(b: &[u8], name: &str) -> Result<String, Error> {
    String::from_utf8(b.to_vec()).map_err(|_| Error::new("encoder_config", format!("{name} is not UTF-8")))
}

fn parse_json(b: &[u8], name: &str, reason: &'static str) -> Result<Json, Error> {
    json::parse_bytes(b).map_err(|e| Error::new(reason, format!("{name} is not JSON: {e}")))
}

impl Router {
    /// Verify and load `dir`; `now` in seconds since the Unix epoch (validity period).
    pub fn load(dir: &Path, now: f64) -> Result<Router, Error> {
        let mut store = Store::new(dir)?;
        let mut m = manifest::verify(&mut store, "", "router", now)?;
        let config = parse_json(&m.bytes("router.json")?, "router.json", "bad_config")?;
        let enc = config.get("encoder");
        let tier = match enc.and_then(|e| e.get("tier")).and_then(Json::as_str).unwrap_or("minilm") {
            "static" => Tier::Static,
            "minilm" => Tier::Minilm,
            other => return Err(Error::new("unsupported_tier",
                                           format!("router.json encoder tier {other:?}: this scorer reads \"static\" and \"minilm\""))),
        };
        let enc_dir = enc.and_then(|e| e.get("dir")).and_then(Json::as_str).unwrap_or("encoder").to_string();
        let mut em = manifest::verify(&mut store, &enc_dir, "encoder", now)?;
        let outputs = em.json.get("outputs");
        let dim = outputs.and_then(|o| o.get("dimension")).and_then(Json::as_i64);
        let encoder_model_id = outputs.and_then(|o| o.get("model_id")).and_then(Json::as_str).unwrap_or("").to_string();
        // the encoder is the one the head was trained with (its manifest, as verified
        // by the router manifest, carries the content hash features[0] pins)
        let want = m.json.get("features").and_then(Json::as_array).and_then(|f| f.first())
            .and_then(|f| f.get("encoder_content_hash")).and_then(Json::as_str);
        let listed = m.bytes(&format!("{enc_dir}/manifest.json"))?;
        let listed = parse_json(&listed, "encoder manifest", "invalid_json")?;
        let have = listed.get("content_hash").and_then(Json::as_str);
        if want.is_none() || have != want || em.content_hash() != want.unwrap_or("") {
            return Err(Error::new("encoder_mismatch", "the encoder is not the one the head was trained with"));
        }
        let (encoder, dimension) = match tier {
            Tier::Static => {
                let e = static_encoder(&em)?;
                if dim != Some(e.d as i64) {
                    return Err(Error::new("dimension", format!("manifest outputs.dimension {dim:?} != {}", e.d)));
                }
                let d = e.d;
                (Some(e), d)
            }
            Tier::Minilm => {
                let d = dim.and_then(|d| usize::try_from(d).ok()).filter(|&d| d > 0).ok_or_else(|| {
                    Error::new("dimension", format!("encoder manifest outputs.dimension {dim:?} is not a positive int"))
                })?;
                // verified (hashed) above; the ONNX graphs and the tokenizer are not used here
                let keep = |k: &String| !k.ends_with(".onnx") && !k.ends_with("tokenizer.json");
                em.files.retain(|k, _| keep(k));
                m.files.retain(|k, _| keep(k));
                (None, d)
            }
        };

        let labels: Vec<String> = config.get("category_vocabulary").and_then(Json::as_array)
            .and_then(|a| a.iter().map(|x| x.as_str().map(str::to_string)).collect())
            .ok_or_else(|| cfg("router.json category_vocabulary is not a list of strings".into()))?;
        let head_t = safetensors::read(&m.bytes("head.safetensors")?, "head.safetensors")?;
        let head = Head::from_tensors(&head_t, labels.len())?;
        if head.d != dimension {
            return Err(Error::new("dimension", format!("head takes {} dims, the encoder gives {dimension}", head.d)));
        }
        let candidates: Vec<String> = config.get("candidates").and_then(Json::as_array)
            .and_then(|a| a.iter().map(|x| x.as_str().map(str::to_string)).collect())
            .ok_or_else(|| cfg("router.json candidates is not a list of strings".into()))?;
        if candidates.len() != head.k {
            return Err(cfg(format!("{} candidates, the head scores {}", candidates.len(), head.k)));
        }
        let threshold = config.get("threshold").and_then(Json::as_f64)
            .ok_or_else(|| cfg("router.json threshold is not a number".into()))?;
        let rule = match config.get("rule") {
            None => Rule::Absolute,
            Some(r) => r.as_str().and_then(Rule::parse).ok_or_else(|| cfg(format!("router.json rule {r:?}")))?,
        };
        let fallback = match config.get("fallback_candidate") {
            None => candidates.len() - 1,
            Some(f) => f.as_str().and_then(|f| candidates.iter().position(|c| c == f))
                .ok_or_else(|| cfg("router.json fallback_candidate is not a candidate".into()))?,
        };
        let chars_per_token = config.get("prompt_tokens").and_then(|p| p.get("chars_per_token"))
            .and_then(Json::as_f64).ok_or_else(|| cfg("router.json prompt_tokens.chars_per_token".into()))?;
        let mut categories = HashMap::new();
        for (i, l) in labels.into_iter().enumerate() {
            categories.insert(l, i); // a label listed twice: its last position (Python's dict)
        }
        let version = format!("{}+{}", m.json.get("version").and_then(Json::as_str).unwrap_or(""),
                              m.content_hash().trim_start_matches("sha256:").chars().take(12).collect::<String>());
        drop(store); // the file bytes the router keeps are held by the Verified manifests
        Ok(Router { tier, dimension, encoder_model_id, candidates, threshold, rule, fallback, chars_per_token,
                    categories, head, encoder, version, manifest: m, encoder_manifest: em })
    }

    /// `load`, then the host's encoder proved on the artifact's golden texts
    /// (`golden::verify_encoder_with`): a host whose embeddings drift past the spec's
    /// tolerances is refused here, with reason `encoder_drift` and the figures, rather than
    /// routed on another embedding space. `embed(text)` is the host's encoder.
    pub fn load_with_encoder(dir: &Path, now: f64, embed: impl FnMut(&str) -> Result<Vec<f32>, Error>)
                             -> Result<Router, Error> {
        let router = Router::load(dir, now)?;
        let (ok, summary) = crate::router::golden::verify_encoder_with(&router, embed)?;
        if !ok {
            let f = |k: &str| summary.get(k).and_then(Json::as_f64).map_or("null".to_string(), |x| format!("{x}"));
            return Err(Error::new("encoder_drift", format!(
                "the host's encoder does not reproduce this artifact's {} embeddings of its {} golden texts: \
                 min cosine {} (needs >= {}), max |difference| {} (needs <= {}), stable decisions equal {} of {}; \
                 the head would score another embedding space", router.encoder_model_id, f("n_cases"),
                f("min_cosine"), f("host_min_cosine"), f("max_abs_diff"), f("host_max_abs"),
                f("stable_decisions_equal"), f("n_stable"))));
        }
        Ok(router)
    }

    /// Category code: the label's position in `category_vocabulary`, else V (other).
    pub fn code(&self, category: Option<&str>) -> usize {
        category.and_then(|c| self.categories.get(c).copied()).unwrap_or(self.head.v)
    }

    /// prompt_tokens when missing: ceil(len(text) in codepoints / chars_per_token).
    pub fn prompt_tokens(&self, text: &str, given: Option<f64>) -> f64 {
        given.unwrap_or_else(|| (text.chars().count() as f64 / self.chars_per_token).ceil())
    }

    /// Route one query from its text (the static tier; a MiniLM-tier router answers
    /// `embedding_only`: see `route_embedding`). `prompt_tokens` None: from the text's length.
    pub fn route(&self, text: &str, category: Option<&str>, prompt_tokens: Option<f64>) -> Result<Decision, Error> {
        let encoder = self.text_encoder()?;
        let (token_ids, emb) = encoder.encode(text);
        Ok(self.decide(&emb, category, self.prompt_tokens(text, prompt_tokens), token_ids))
    }

    /// The static encoder, or `embedding_only` (a MiniLM-tier artifact: no text routing here).
    pub fn text_encoder(&self) -> Result<&StaticEncoder, Error> {
        self.encoder.as_ref().ok_or_else(|| Error::new("embedding_only", format!(
            "this router's encoder tier is {:?}: the Rust scorer routes it only on the host's own \
             {}-dimensional {} embedding (route_embedding); routing from text needs the static tier",
            self.tier.name(), self.dimension, self.encoder_model_id)))
    }

    /// Route one query on an embedding the host computed (docs/specs/router-scorer.md,
    /// "Routing on the host's embedding"): the head scored on `emb` and the decision rule,
    /// the same decision as `replaylab.runtime.Router.route_embedding`.
    ///
    /// - `emb`: `dimension` float32 values, the encoder's output as the artifact's encoder
    ///   makes it (all-MiniLM-L6-v2: mean pooling, L2-normalized). Check the host's encoder
    ///   once with `golden::verify_encoder` (or load with `Router::load_with_encoder`).
    /// - `category`: a label of `router.json` `category_vocabulary`; None or an unknown
    ///   label is the `other` code.
    /// - `prompt_tokens`: the prompt's token count; NaN when unknown (the training mean;
    ///   `route` computes ceil(chars / chars_per_token) from the text instead).
    ///
    /// Errors: `dimension` (wrong length), `bad_input` (a NaN or infinite value). Works on
    /// either tier; `token_ids` is empty. `decision_json` writes the answer.
    pub fn route_embedding(&self, emb: &[f32], category: Option<&str>, prompt_tokens: f64) -> Result<Decision, Error> {
        if emb.len() != self.dimension {
            return Err(Error::new("dimension", format!("the embedding has {} values, the head takes {}",
                                                       emb.len(), self.dimension)));
        }
        if let Some(i) = emb.iter().position(|x| !x.is_finite()) {
            return Err(Error::new("bad_input", format!("embedding value {i} is {}", emb[i])));
        }
        if prompt_tokens.is_infinite() {
            return Err(Error::new("bad_input", "prompt_tokens is infinite"));
        }
        Ok(self.decide(emb, category, prompt_tokens, Vec::new()))
    }

    fn decide(&self, emb: &[f32], category: Option<&str>, prompt_tokens: f64, token_ids: Vec<u32>) -> Decision {
        let p = self.head.proba(emb, self.code(category), prompt_tokens);
        let candidate = routing::choose(&p, self.threshold, self.fallback, self.rule);
        let margin = routing::margin(&p, self.threshold, self.rule);
        Decision { candidate, success_prob: p, margin, token_ids }
    }

    /// One decision as the CLI's `route` writes it (one JSON line without the newline):
    /// {"candidate", "success_prob" (Python float reprs), "margin" (null when infinite),
    /// "token_ids"}.
    pub fn decision_json(&self, d: &Decision) -> String {
        let mut s = String::from("{\"candidate\":");
        write_str(&mut s, &self.candidates[d.candidate]);
        s.push_str(",\"success_prob\":[");
        for (i, p) in d.success_prob.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            s.push_str(&py_float_repr(*p));
        }
        s.push_str("],\"margin\":");
        s.push_str(&if d.margin.is_finite() { py_float_repr(d.margin) } else { "null".into() });
        s.push_str(",\"token_ids\":[");
        for (i, t) in d.token_ids.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            s.push_str(&t.to_string());
        }
        s.push_str("]}");
        s
    }

    /// The verified bytes of a file the router manifest lists (e.g. "golden.json").
    pub fn file(&self, name: &str) -> Result<Arc<Vec<u8>>, Error> {
        self.manifest.bytes(name)
    }
}

/// The static encoder of a verified encoder manifest (static_config.json, vocab, charmap,
/// embeddings).
fn static_encoder(em: &Verified) -> Result<StaticEncoder, Error> {
    let sc = parse_json(&em.bytes("static_config.json")?, "static_config.json", "encoder_config")?;
    let sc = StaticConfig::parse(&sc)?;
    let vocab_text = utf8(&em.bytes(&sc.vocab_file)?, &sc.vocab_file)?;
    let vocab = parse_vocab(&vocab_text);
    if vocab.len() != sc.vocab_size {
        return Err(Error::new("vocab", format!("vocab.txt has {} tokens, config says {}", vocab.len(), sc.vocab_size)));
    }
    let charmap = Charmap::parse(&utf8(&em.bytes(&sc.charmap_file)?, &sc.charmap_file)?)?;
    let tokenizer = Tokenizer::new(charmap, &vocab, &sc.unk_token, &sc.prefix, sc.max_word,
                                   sc.max_chars, sc.max_tokens, sc.drop_unk)?;
    let mut tensors = safetensors::read(&em.bytes(&sc.embeddings_file)?, &sc.embeddings_file)?;
    let table = tensors.remove(&sc.tensor).filter(|t| t.shape == [sc.vocab_size, sc.dimension])
        .ok_or_else(|| Error::new("dimension", format!("tensor {:?} is not F32 [{}, {}]", sc.tensor, sc.vocab_size, sc.dimension)))?;
    Ok(StaticEncoder { tokenizer, table: table.data, d: sc.dimension, normalize: sc.normalize })
}

struct StaticConfig {
    dimension: usize,
    vocab_size: usize,
    unk_token: String,
    prefix: String,
    max_word: usize,
    max_chars: usize,
    max_tokens: usize,
    drop_unk: bool,
    normalize: bool,
    embeddings_file: String,
    tensor: String,
    charmap_file: String,
    vocab_file: String,
}

impl StaticConfig {
    fn parse(raw: &Json) -> Result<StaticConfig, Error> {
        let bad = |m: String| Error::new("encoder_config", format!("static_config.json: {m}"));
        if raw.as_object().is_none() {
            return Err(bad("not a JSON object".into()));
        }
        let format = raw.get("format").and_then(Json::as_f64);
        let tier = raw.get("tier").and_then(Json::as_str);
        if format != Some(1.0) || tier != Some("static") {
            return Err(bad(format!("format {format:?} tier {tier:?}; this scorer reads format 1, tier \"static\"")));
        }
        let s = |k: &str| raw.get(k).and_then(Json::as_str).map(str::to_string)
            .ok_or_else(|| bad(format!("field {k:?} missing or not str")));
        let u = |k: &str| raw.get(k).and_then(Json::as_i64).and_then(|v| usize::try_from(v).ok())
            .ok_or_else(|| bad(format!("field {k:?} missing or not a non-negative int")));
        let b = |k: &str| raw.get(k).and_then(Json::as_bool).ok_or_else(|| bad(format!("field {k:?} missing or not bool")));
        for k in ["model_id", "encoder_id", "continuing_subword_prefix"] {
            s(k)?;
        }
        if s("pooling")? != "mean" {
            return Err(Error::new("unsupported_pooling", format!("pooling {:?}", s("pooling")?)));
        }
        Ok(StaticConfig {
            dimension: u("dimension")?, vocab_size: u("vocab_size")?, unk_token: s("unk_token")?,
            prefix: s("continuing_subword_prefix")?, max_word: u("max_input_chars_per_word")?,
            max_chars: u("max_chars")?, max_tokens: u("max_tokens")?, drop_unk: b("drop_unk")?,
            normalize: b("normalize")?, embeddings_file: s("embeddings_file")?, tensor: s("tensor")?,
            charmap_file: s("charmap_file")?, vocab_file: s("vocab_file")?,
        })
    }
}
