//! The artifact's golden vectors, checked here (as `Router.check_golden_vectors` and
//! `check_static_golden` do in Python):
//!
//! router `golden.json` (kind "router"), per case, the tier's variant ("static", or
//! "fp32" for the MiniLM tier): token ids equal bit for bit (static); max |P(success) -
//! expected| <= `<variant>_prob_abs`; every decision whose expected margin exceeds what
//! that tolerance can move (2x it under the margin rule, 1x under absolute) equal. The
//! MiniLM tier is routed on each case's stored fp32 embedding (`expected.fp32.embedding`:
//! the golden (text, embedding, decision) triples). Encoder `golden.json` (kind
//! "encoder", static tier): token ids equal, and each vector's cosine to the expected one
//! >= `static_min_cosine`.
//!
//! `verify_encoder`: a host's own embeddings of the triples' texts against the stored ones
//! (docs/specs/router-scorer.md, "Routing on the host's embedding"): every cosine >=
//! `host_min_cosine`, every |difference| <= `host_max_abs`, and routed on them, every
//! decision whose margin exceeds what `host_prob_abs` can move equal.

use std::collections::BTreeMap;

use crate::util::error::Error;
use crate::util::json::{self, Json, Number};
use crate::router::scorer::Tier;
use crate::router::Router;
use crate::router::routing::Rule;

/// The static tier's golden variant.
pub const VARIANT: &str = "static";
/// The MiniLM tier's golden variant: its triples hold the fp32 encoder's embeddings.
pub const EMBEDDING_VARIANT: &str = "fp32";

/// The golden variant `check` compares a router with.
pub fn variant(router: &Router) -> &'static str {
    match router.tier {
        Tier::Static => VARIANT,
        Tier::Minilm => EMBEDDING_VARIANT,
    }
}

fn num(x: f64) -> Json {
    Json::Num(Number { value: x, int: None })
}

fn int(x: usize) -> Json {
    Json::Num(Number { value: x as f64, int: Some(x.to_string()) })
}

fn golden_doc(bytes: &[u8], kind: &str, name: &str) -> Result<Json, Error> {
    let g = json::parse_bytes(bytes).map_err(|e| Error::new("golden_invalid", format!("{name} is not JSON: {e}")))?;
    if g.get("format").and_then(Json::as_f64) != Some(1.0) || g.get("kind").and_then(Json::as_str) != Some(kind) {
        return Err(Error::new("golden_invalid", format!("{name}: format must be 1 and kind {kind:?}")));
    }
    if g.get("cases").and_then(Json::as_array).is_none() || g.get("tolerances").and_then(Json::as_object).is_none() {
        return Err(Error::new("golden_invalid", format!("{name}: no cases or tolerances")));
    }
    Ok(g)
}

/// One query of a golden case's input.
pub struct Query {
    pub text: String,
    pub category: Option<String>,
    pub prompt_tokens: Option<f64>,
}

/// Read {"text", "category" (str|null), "prompt_tokens" (number|null)}.
pub fn query(input: &Json) -> Result<Query, Error> {
    let bad = |m: &str| Error::new("bad_input", m.to_string());
    if input.as_object().is_none() {
        return Err(bad("a query must be a JSON object"));
    }
    let text = input.get("text").and_then(Json::as_str).ok_or_else(|| bad("\"text\" must be a string"))?;
    let category = match input.get("category") {
        None | Some(Json::Null) => None,
        Some(Json::Str(s)) => Some(s.clone()),
        Some(_) => return Err(bad("\"category\" must be a string or null")),
    };
    let prompt_tokens = match input.get("prompt_tokens") {
        None | Some(Json::Null) => None,
        Some(Json::Num(n)) => Some(n.value),
        Some(_) => return Err(bad("\"prompt_tokens\" must be a number or null")),
    };
    Ok(Query { text: text.to_string(), category, prompt_tokens })
}

/// The queries of the router's golden cases (for `bench` when no inputs are given).
pub fn golden_queries(router: &Router) -> Result<Vec<Query>, Error> {
    let g = golden_doc(&router.file("golden.json")?, "router", "golden.json")?;
    g.get("cases").and_then(Json::as_array).expect("checked").iter()
        .map(|c| query(c.get("input").unwrap_or(&Json::Null))).collect()
}

/// Check both golden files; (ok, summary JSON object).
pub fn check(router: &Router) -> Result<(bool, Json), Error> {
    let bytes = router.file("golden.json").map_err(|_| Error::new("golden_absent", "golden.json is not listed in the router manifest"))?;
    let g = golden_doc(&bytes, "router", "golden.json")?;
    let v = variant(router);
    let tol = g.get("tolerances").and_then(|t| t.get(&format!("{v}_prob_abs"))).and_then(Json::as_f64).unwrap_or(0.0);
    let need = g.get("tolerances").and_then(|t| t.get("stable_decision_agreement")).and_then(Json::as_f64).unwrap_or(1.0);
    let moved = tol * if router.rule == Rule::Margin { 2.0 } else { 1.0 };
    let cases = g.get("cases").and_then(Json::as_array).expect("checked");
    let (mut ids_equal, mut decisions_equal, mut n_stable, mut stable_equal) = (0usize, 0usize, 0usize, 0usize);
    let mut max_diff = 0.0f64;
    let mut mismatches = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let q = query(c.get("input").unwrap_or(&Json::Null))?;
        let e = c.get("expected").and_then(|e| e.get(v))
            .ok_or_else(|| Error::new("golden_invalid", format!("case {i}: no expected.{v}")))?;
        let bad = |f: &str| Error::new("golden_invalid", format!("case {i}: expected.{v}.{f}"));
        let want_p: Vec<f64> = e.get("success_prob").and_then(Json::as_array)
            .and_then(|a| a.iter().map(Json::as_f64).collect()).ok_or_else(|| bad("success_prob"))?;
        let want_c = e.get("candidate").and_then(Json::as_str).ok_or_else(|| bad("candidate"))?;
        let want_m = e.get("margin").and_then(Json::as_f64).ok_or_else(|| bad("margin"))?;
        let d = match router.tier {
            Tier::Static => router.route(&q.text, q.category.as_deref(), q.prompt_tokens)?,
            Tier::Minilm => {
                let emb = embedding(e).ok_or_else(|| Error::new("golden_invalid", format!(
                    "case {i}: no expected.{v}.embedding (a MiniLM-tier artifact exported before \
                     embedding-only routing: export it again)")))?;
                router.route_embedding(&emb, q.category.as_deref(), router.prompt_tokens(&q.text, q.prompt_tokens))?
            }
        };
        let got_ids: Vec<i64> = d.token_ids.iter().map(|&x| x as i64).collect();
        // the static tier stores token ids; the MiniLM tier none (and routes on no tokens)
        let same_ids = match e.get("token_ids") {
            None if router.tier == Tier::Minilm => got_ids.is_empty(),
            w => w.and_then(Json::as_array).and_then(|a| a.iter().map(Json::as_i64).collect::<Option<Vec<i64>>>())
                .ok_or_else(|| bad("token_ids"))? == got_ids,
        };
        ids_equal += same_ids as usize;
        if want_p.len() != d.success_prob.len() {
            max_diff = f64::INFINITY;
        } else {
            for (a, b) in want_p.iter().zip(&d.success_prob) {
                let x = (a - b).abs();
                max_diff = if x.is_nan() { f64::INFINITY } else { max_diff.max(x) };
            }
        }
        let same_c = router.candidates[d.candidate] == want_c;
        decisions_equal += same_c as usize;
        if want_m.abs() > moved {
            n_stable += 1;
            stable_equal += same_c as usize;
        }
        if !same_ids || !same_c {
            let mut m = BTreeMap::new();
            m.insert("case".to_string(), int(i));
            m.insert("token_ids_equal".to_string(), Json::Bool(same_ids));
            m.insert("decision_equal".to_string(), Json::Bool(same_c));
            m.insert("expected_margin".to_string(), num(want_m));
            mismatches.push(Json::Obj(m));
        }
    }
    let n = cases.len();
    let stable_share = if n_stable == 0 { 1.0 } else { stable_equal as f64 / n_stable as f64 };
    let (enc_ok, enc) = check_encoder(router)?;
    let ok = ids_equal == n && max_diff <= tol && stable_share >= need && enc_ok;
    let mut s = BTreeMap::new();
    s.insert("ok".to_string(), Json::Bool(ok));
    s.insert("n_cases".to_string(), int(n));
    s.insert("variant".to_string(), Json::Str(v.into()));
    s.insert("tier".to_string(), Json::Str(router.tier.name().into()));
    s.insert("token_ids_equal".to_string(), int(ids_equal));
    s.insert("decisions_equal".to_string(), int(decisions_equal));
    s.insert("n_stable".to_string(), int(n_stable));
    s.insert("stable_decision_agreement".to_string(), num(stable_share));
    s.insert(format!("{v}_prob_max_abs"), if max_diff.is_finite() { num(max_diff) } else { Json::Null });
    s.insert(format!("{v}_prob_abs"), num(tol));
    s.insert("mismatches".to_string(), Json::Arr(mismatches));
    s.insert("encoder".to_string(), enc);
    s.insert("version".to_string(), Json::Str(router.version.clone()));
    Ok((ok, Json::Obj(s)))
}

/// The encoder's golden.json: token ids equal and min cosine >= static_min_cosine.
pub fn check_encoder(router: &Router) -> Result<(bool, Json), Error> {
    let Some(encoder) = router.encoder.as_ref() else {
        // the MiniLM tier: the encoder is the host's, checked by `verify_encoder`
        let mut s = BTreeMap::new();
        s.insert("status".to_string(), Json::Str("host".into()));
        return Ok((true, Json::Obj(s)));
    };
    let Ok(bytes) = router.encoder_manifest.bytes("golden.json") else {
        let mut s = BTreeMap::new();
        s.insert("status".to_string(), Json::Str("absent".into()));
        return Ok((true, Json::Obj(s)));
    };
    let g = golden_doc(&bytes, "encoder", "encoder golden.json")?;
    let need = g.get("tolerances").and_then(|t| t.get("static_min_cosine")).and_then(Json::as_f64).unwrap_or(1.0);
    let cases = g.get("cases").and_then(Json::as_array).expect("checked");
    let (mut ids_equal, mut min_cos) = (0usize, f64::INFINITY);
    for (i, c) in cases.iter().enumerate() {
        let bad = |f: &str| Error::new("golden_invalid", format!("encoder case {i}: {f}"));
        let text = c.get("input").and_then(|x| x.get("text")).and_then(Json::as_str).ok_or_else(|| bad("input.text"))?;
        let e = c.get("expected").ok_or_else(|| bad("expected"))?;
        let want_ids: Option<Vec<i64>> = e.get("token_ids").and_then(Json::as_array).and_then(|a| a.iter().map(Json::as_i64).collect());
        let (ids, v) = encoder.encode(text);
        if want_ids == Some(ids.iter().map(|&x| x as i64).collect()) {
            ids_equal += 1;
        }
        if let Some(want) = e.get(VARIANT).and_then(Json::as_array) {
            let want: Vec<f64> = want.iter().map(|x| x.as_f64().unwrap_or(f64::NAN)).collect();
            if want.len() != v.len() {
                min_cos = f64::NEG_INFINITY;
                continue;
            }
            let (mut dot, mut na, mut nb) = (0.0, 0.0, 0.0);
            for (a, &b) in want.iter().zip(&v) {
                let b = b as f64;
                dot += a * b;
                na += a * a;
                nb += b * b;
            }
            // two zero vectors (an empty text) agree
            let cos = if na == 0.0 && nb == 0.0 { 1.0 } else { dot / (na.sqrt() * nb.sqrt()).max(1e-300) };
            min_cos = min_cos.min(if cos.is_nan() { f64::NEG_INFINITY } else { cos });
        }
    }
    let ok = ids_equal == cases.len() && (min_cos >= need);
    let mut s = BTreeMap::new();
    s.insert("ok".to_string(), Json::Bool(ok));
    s.insert("n_cases".to_string(), int(cases.len()));
    s.insert("token_ids_equal".to_string(), int(ids_equal));
    s.insert("static_min_cosine".to_string(), if min_cos.is_finite() { num(min_cos) } else { Json::Null });
    s.insert("bound_static_min_cosine".to_string(), num(need));
    Ok((ok, Json::Obj(s)))
}

/// A float array as float32 (the stored embeddings are float32 values written exactly).
fn embedding(e: &Json) -> Option<Vec<f32>> {
    e.get("embedding").and_then(Json::as_array)
        .and_then(|a| a.iter().map(|x| x.as_f64().map(|x| x as f32)).collect())
}

/// One golden (text, embedding, decision) triple of a MiniLM-tier router.
pub struct Triple {
    pub query: Query,
    /// the exporting machine's fp32 encoder output for `query.text`
    pub embedding: Vec<f32>,
    pub candidate: String,
    pub success_prob: Vec<f64>,
    pub margin: f64,
}

/// The router's golden triples (`expected.fp32` with its embedding), in golden.json order:
/// the texts a host embeds to prove its encoder (`verify_encoder`).
pub fn triples(router: &Router) -> Result<Vec<Triple>, Error> {
    let bytes = router.file("golden.json").map_err(|_| Error::new("golden_absent", "golden.json is not listed in the router manifest"))?;
    let g = golden_doc(&bytes, "router", "golden.json")?;
    let v = EMBEDDING_VARIANT;
    g.get("cases").and_then(Json::as_array).expect("checked").iter().enumerate().map(|(i, c)| {
        let bad = |f: &str| Error::new("golden_invalid", format!("case {i}: expected.{v}.{f} (golden triples are \
                                                                  written for MiniLM-tier routers only)"));
        let e = c.get("expected").and_then(|e| e.get(v)).ok_or_else(|| bad("*"))?;
        Ok(Triple {
            query: query(c.get("input").unwrap_or(&Json::Null))?,
            embedding: embedding(e).ok_or_else(|| bad("embedding"))?,
            candidate: e.get("candidate").and_then(Json::as_str).ok_or_else(|| bad("candidate"))?.to_string(),
            success_prob: e.get("success_prob").and_then(Json::as_array)
                .and_then(|a| a.iter().map(Json::as_f64).collect()).ok_or_else(|| bad("success_prob"))?,
            margin: e.get("margin").and_then(Json::as_f64).ok_or_else(|| bad("margin"))?,
        })
    }).collect()
}

/// Check a host's embeddings of the golden triples' texts (`host[i]` embeds
/// `triples(router)[i].query.text`) against the stored ones; (ok, summary JSON object).
///
/// ok: every cosine >= `host_min_cosine`, every |difference| <= `host_max_abs` (golden.json
/// `tolerances`), and routed on the host's embeddings, every decision whose stored margin
/// exceeds what `host_prob_abs` can move (2x under the margin rule) equal to the stored
/// one. Errors: `bad_input` (not one embedding per triple), `dimension`, `golden_invalid`.
pub fn verify_encoder(router: &Router, host: &[Vec<f32>]) -> Result<(bool, Json), Error> {
    let bytes = router.file("golden.json").map_err(|_| Error::new("golden_absent", "golden.json is not listed in the router manifest"))?;
    let g = golden_doc(&bytes, "router", "golden.json")?;
    let t = |k: &str| g.get("tolerances").and_then(|t| t.get(k)).and_then(Json::as_f64)
        .ok_or_else(|| Error::new("golden_invalid", format!("golden.json tolerances.{k} missing (not a MiniLM-tier router \
                                                             with golden triples)")));
    let (min_cos_bound, max_abs_bound, prob_tol) = (t("host_min_cosine")?, t("host_max_abs")?, t("host_prob_abs")?);
    let cases = triples(router)?;
    if host.len() != cases.len() {
        return Err(Error::new("bad_input", format!("{} host embeddings for {} golden texts", host.len(), cases.len())));
    }
    let moved = prob_tol * if router.rule == Rule::Margin { 2.0 } else { 1.0 };
    let (mut min_cos, mut max_abs, mut prob_max) = (f64::INFINITY, 0.0f64, 0.0f64);
    let (mut worst, mut decisions_equal, mut n_stable, mut stable_equal) = (0usize, 0usize, 0usize, 0usize);
    for (i, (c, h)) in cases.iter().zip(host).enumerate() {
        if h.len() != c.embedding.len() {
            return Err(Error::new("dimension", format!("host embedding {i} has {} values, the artifact's encoder gives {}",
                                                       h.len(), c.embedding.len())));
        }
        let (mut dot, mut na, mut nb) = (0.0f64, 0.0f64, 0.0f64);
        for (&a, &b) in c.embedding.iter().zip(h) {
            let (a, b) = (a as f64, b as f64);
            dot += a * b;
            na += a * a;
            nb += b * b;
            let x = (a - b).abs();
            max_abs = if x.is_nan() { f64::INFINITY } else { max_abs.max(x) };
        }
        // two zero vectors (an empty text) agree
        let cos = if na == 0.0 && nb == 0.0 { 1.0 } else { dot / (na.sqrt() * nb.sqrt()).max(1e-300) };
        let cos = if cos.is_nan() { f64::NEG_INFINITY } else { cos };
        if cos < min_cos {
            min_cos = cos;
            worst = i;
        }
        let q = &c.query;
        let d = match router.route_embedding(h, q.category.as_deref(), router.prompt_tokens(&q.text, q.prompt_tokens)) {
            Ok(d) => d,
            Err(_) => { // a NaN or infinite value: the embedding fails every bound
                min_cos = f64::NEG_INFINITY;
                max_abs = f64::INFINITY;
                worst = i;
                continue;
            }
        };
        for (a, b) in c.success_prob.iter().zip(&d.success_prob) {
            prob_max = prob_max.max((a - b).abs());
        }
        let same = router.candidates[d.candidate] == c.candidate;
        decisions_equal += same as usize;
        if c.margin.abs() > moved {
            n_stable += 1;
            stable_equal += same as usize;
        }
    }
    let n = cases.len();
    let ok = n > 0 && min_cos >= min_cos_bound && max_abs <= max_abs_bound && stable_equal == n_stable;
    let fin = |x: f64| if x.is_finite() { num(x) } else { Json::Null };
    let mut s = BTreeMap::new();
    s.insert("ok".to_string(), Json::Bool(ok));
    s.insert("n_cases".to_string(), int(n));
    s.insert("encoder_model_id".to_string(), Json::Str(router.encoder_model_id.clone()));
    s.insert("min_cosine".to_string(), fin(min_cos));
    s.insert("host_min_cosine".to_string(), num(min_cos_bound));
    s.insert("max_abs_diff".to_string(), fin(max_abs));
    s.insert("host_max_abs".to_string(), num(max_abs_bound));
    s.insert("worst_case".to_string(), int(worst));
    s.insert("prob_max_abs".to_string(), fin(prob_max));
    s.insert("host_prob_abs".to_string(), num(prob_tol));
    s.insert("decisions_equal".to_string(), int(decisions_equal));
    s.insert("n_stable".to_string(), int(n_stable));
    s.insert("stable_decisions_equal".to_string(), int(stable_equal));
    s.insert("version".to_string(), Json::Str(router.version.clone()));
    Ok((ok, Json::Obj(s)))
}

/// `verify_encoder` with the host's encoder called on each golden text.
pub fn verify_encoder_with(router: &Router, mut embed: impl FnMut(&str) -> Result<Vec<f32>, Error>)
                           -> Result<(bool, Json), Error> {
    let host = triples(router)?.iter().map(|c| embed(&c.query.text)).collect::<Result<Vec<_>, _>>()?;
    verify_encoder(router, &host)
}
