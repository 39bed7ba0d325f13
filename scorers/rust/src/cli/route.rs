//! `route`, `golden`, `bench` (a static-tier router artifact), `route-embedding` and
//! `verify-encoder` (either tier, on the host's embeddings; docs/specs/router-scorer.md).

use std::io::{BufRead, Write};
use std::path::Path;
use std::time::Instant;

use replaylab_scorer::router::golden::{self, Query};
use replaylab_scorer::util::json::{self, py_float_repr, write_str, Json, Number};
use replaylab_scorer::util::timefmt;
use replaylab_scorer::{Error, Router};

use super::timing::{bench_counts, time_calls};
use super::{emit, opt, read_jsonl, usage};

pub fn load(args: &[String]) -> Result<Router, Error> {
    let dir = args.get(1).filter(|a| !a.starts_with("--")).ok_or_else(|| usage("no ARTIFACT_DIR"))?;
    Router::load(Path::new(dir), timefmt::now())
}

pub fn route(args: &[String]) -> Result<u8, Error> {
    let router = load(args)?;
    router.text_encoder()?; // a MiniLM-tier router: embedding_only, said before any input
    super::require_golden(args, || golden::check(&router))?;
    let stdin = std::io::stdin();
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut line_s = String::new();
    for (n, line) in stdin.lock().lines().enumerate() {
        let line = line.map_err(|e| Error::new("bad_input", format!("stdin line {}: {e}", n + 1)))?;
        if line.trim().is_empty() {
            continue;
        }
        let v = json::parse(&line).map_err(|e| Error::new("bad_input", format!("stdin line {}: not JSON: {e}", n + 1)))?;
        let q = golden::query(&v).map_err(|e| Error::new("bad_input", format!("stdin line {}: {}", n + 1, e.message)))?;
        let d = router.route(&q.text, q.category.as_deref(), q.prompt_tokens)?;
        line_s.clear();
        line_s.push_str(&router.decision_json(&d));
        line_s.push('\n');
        out.write_all(line_s.as_bytes()).and_then(|_| out.flush())
            .map_err(|e| Error::new("io", e.to_string()))?;
    }
    Ok(0)
}

/// The queries a latency bench times: `--inputs` (JSONL) or the artifact's golden queries.
pub fn bench_queries(args: &[String], router: &Router, n: usize) -> Result<Vec<Query>, Error> {
    let queries: Vec<Query> = match opt(args, "--inputs")? {
        None => golden::golden_queries(router)?,
        Some(f) => read_jsonl(&f)?.iter().map(golden::query).collect::<Result<_, _>>()?,
    };
    if queries.is_empty() || n == 0 {
        return Err(usage("no inputs to time (or --n 0)"));
    }
    Ok(queries)
}

pub fn bench(args: &[String]) -> Result<u8, Error> {
    let (n, warmup) = bench_counts(args)?;
    let t0 = Instant::now();
    let router = load(args)?;
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;
    router.text_encoder()?;
    let queries = bench_queries(args, &router, n)?;
    let (mut s, tokens) = time_calls(args, n, warmup, queries.len(), 1, load_ms, &router.version, |i| {
        let q = &queries[i % queries.len()];
        router.route(std::hint::black_box(&q.text), q.category.as_deref(), q.prompt_tokens)
            .expect("static tier: checked before timing")
    }, |d| d.token_ids.len());
    let mean_tokens = tokens as f64 / n as f64;
    s.insert("tokens_mean".to_string(), Json::Num(Number { value: (mean_tokens * 10.0).round() / 10.0, int: None }));
    emit(&json::canonical(&Json::Obj(s)).expect("finite"));
    Ok(0)
}

/// An embedding field: a JSON array of finite numbers, as float32.
fn embedding_field(v: &Json, what: &str) -> Result<Vec<f32>, Error> {
    v.get("embedding").and_then(Json::as_array)
        .and_then(|a| a.iter().map(|x| x.as_f64().map(|x| x as f32)).collect::<Option<Vec<f32>>>())
        .ok_or_else(|| Error::new("bad_input", format!("{what}: \"embedding\" must be an array of numbers")))
}

/// `verify-encoder ARTIFACT_DIR --texts`: the golden triples' inputs, one JSON line each
/// ({"text", "category", "prompt_tokens"}), for the host to embed.
/// `verify-encoder ARTIFACT_DIR [--embeddings FILE.jsonl]` (default stdin): the host's
/// embeddings, one line {"text", "embedding"} per golden text, checked against the stored
/// ones (`golden::verify_encoder`); the summary on stdout, exit 0 when they hold, else 1.
pub fn verify_encoder(args: &[String]) -> Result<u8, Error> {
    let router = load(args)?;
    let triples = golden::triples(&router)?;
    if args.iter().any(|a| a == "--texts") {
        for t in &triples {
            let mut s = String::from("{\"text\":");
            write_str(&mut s, &t.query.text);
            s.push_str(",\"category\":");
            match &t.query.category {
                Some(c) => write_str(&mut s, c),
                None => s.push_str("null"),
            }
            s.push_str(",\"prompt_tokens\":");
            s.push_str(&t.query.prompt_tokens.map_or("null".to_string(), py_float_repr));
            s.push('}');
            super::emit(&s);
        }
        return Ok(0);
    }
    let lines = match opt(args, "--embeddings")? {
        Some(f) => read_jsonl(&f)?,
        None => {
            let mut out = Vec::new();
            for (n, line) in std::io::stdin().lock().lines().enumerate() {
                let line = line.map_err(|e| Error::new("bad_input", format!("stdin line {}: {e}", n + 1)))?;
                if !line.trim().is_empty() {
                    out.push(json::parse(&line).map_err(|e| Error::new("bad_input", format!("stdin line {}: {e}", n + 1)))?);
                }
            }
            out
        }
    };
    let mut by_text = std::collections::HashMap::new();
    for (i, v) in lines.iter().enumerate() {
        let text = v.get("text").and_then(Json::as_str)
            .ok_or_else(|| Error::new("bad_input", format!("line {}: \"text\" must be a string", i + 1)))?;
        by_text.insert(text.to_string(), embedding_field(v, &format!("line {}", i + 1))?);
    }
    let host = triples.iter().map(|t| by_text.remove(&t.query.text).ok_or_else(|| {
        let head: String = t.query.text.chars().take(60).collect();
        Error::new("bad_input", format!("no host embedding of the golden text {head:?} (`--texts` lists them)"))
    })).collect::<Result<Vec<_>, _>>()?;
    Ok(super::emit_check(golden::verify_encoder(&router, &host)?, "the host encoder check"))
}

/// `route-embedding ARTIFACT_DIR [--no-golden]`: stdin lines {"embedding", "category",
/// "prompt_tokens"} (the host's embedding of the query; category and prompt_tokens may be
/// null or absent) -> stdout decisions, as `route` writes them (token_ids empty).
pub fn route_embedding(args: &[String]) -> Result<u8, Error> {
    let router = load(args)?;
    super::require_golden(args, || golden::check(&router))?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    for (n, line) in std::io::stdin().lock().lines().enumerate() {
        let line = line.map_err(|e| Error::new("bad_input", format!("stdin line {}: {e}", n + 1)))?;
        if line.trim().is_empty() {
            continue;
        }
        let what = format!("stdin line {}", n + 1);
        let v = json::parse(&line).map_err(|e| Error::new("bad_input", format!("{what}: not JSON: {e}")))?;
        let emb = embedding_field(&v, &what)?;
        let category = match v.get("category") {
            None | Some(Json::Null) => None,
            Some(Json::Str(s)) => Some(s.as_str()),
            Some(_) => return Err(Error::new("bad_input", format!("{what}: \"category\" must be a string or null"))),
        };
        let tokens = match v.get("prompt_tokens") {
            None | Some(Json::Null) => f64::NAN,
            Some(Json::Num(x)) => x.value,
            Some(_) => return Err(Error::new("bad_input", format!("{what}: \"prompt_tokens\" must be a number or null"))),
        };
        let d = router.route_embedding(&emb, category, tokens)
            .map_err(|e| Error::new(e.reason, format!("{what}: {}", e.message)))?;
        let mut s = router.decision_json(&d);
        s.push('\n');
        out.write_all(s.as_bytes()).and_then(|_| out.flush()).map_err(|e| Error::new("io", e.to_string()))?;
    }
    Ok(0)
}
