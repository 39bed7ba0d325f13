//! `route`, `golden`, `bench`: a static-tier router artifact (docs/specs/router-scorer.md).

use std::io::{BufRead, Write};
use std::path::Path;
use std::time::Instant;

use replaylab_scorer::router::golden::{self, Query};
use replaylab_scorer::util::json::{self, Json, Number};
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
    if !args.iter().any(|a| a == "--no-golden") {
        let (ok, summary) = golden::check(&router)?;
        if !ok {
            return Err(Error::new("golden_mismatch", format!("the artifact misses its golden vectors here: {}",
                                                             json::canonical(&summary).expect("finite"))));
        }
    }
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
