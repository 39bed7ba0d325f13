//! `demand`, `demand-golden`, `demand-bench`: a demand artifact (docs/specs/demand-scorer.md).

use std::io::{BufRead, Write};
use std::path::Path;
use std::time::Instant;

use replaylab_scorer::demand::golden as demand_golden;
use replaylab_scorer::util::json::{self, Json};
use replaylab_scorer::util::timefmt;
use replaylab_scorer::{Demand, Error};

use super::timing::{bench_counts, count, time_calls};
use super::{emit, opt, read_jsonl, usage};

pub fn load_demand(args: &[String]) -> Result<Demand, Error> {
    let dir = args.get(1).filter(|a| !a.starts_with("--")).ok_or_else(|| usage("no ARTIFACT_DIR"))?;
    Demand::load(Path::new(dir), timefmt::now())
}

pub fn demand(args: &[String]) -> Result<u8, Error> {
    let d = load_demand(args)?;
    super::require_golden(args, || demand_golden::check(&d))?;
    let explain = args.iter().any(|a| a == "--explain").then_some(&d.trees);
    let fixed: Option<i64> = opt(args, "--now-ms")?.map(|s| s.parse()).transpose()
        .map_err(|_| usage("--now-ms must be an integer"))?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    for (n, line) in std::io::stdin().lock().lines().enumerate() {
        let line = line.map_err(|e| Error::new("bad_input", format!("stdin line {}: {e}", n + 1)))?;
        if line.trim().is_empty() {
            continue;
        }
        let v = json::parse(&line).map_err(|e| Error::new("bad_input", format!("stdin line {}: not JSON: {e}", n + 1)))?;
        let now_ms = fixed.unwrap_or_else(|| (timefmt::now() * 1000.0) as i64);
        let mut s = demand_golden::hint_line(&d.hint(&v, now_ms), explain);
        s.push('\n');
        out.write_all(s.as_bytes()).and_then(|_| out.flush()).map_err(|e| Error::new("io", e.to_string()))?;
    }
    Ok(0)
}

pub fn demand_bench(args: &[String]) -> Result<u8, Error> {
    let (n, warmup) = bench_counts(args)?;
    let t0 = Instant::now();
    let d = load_demand(args)?;
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;
    let requests = match opt(args, "--inputs")? {
        None => demand_golden::golden_requests(&d)?,
        Some(f) => read_jsonl(&f)?,
    };
    if requests.is_empty() || n == 0 {
        return Err(usage("no inputs to time (or --n 0)"));
    }
    let now_ms = d.created_ms;
    let (mut s, fallbacks) = time_calls(args, n, warmup, requests.len(), 2, load_ms, &d.version, |i| {
        d.hint(std::hint::black_box(&requests[i % requests.len()]), now_ms)
    }, |h| h.fallback as usize);
    s.insert("fallbacks".to_string(), count(fallbacks));
    s.insert("trees".to_string(), count(d.trees.n_trees()));
    emit(&json::canonical(&Json::Obj(s)).expect("finite"));
    Ok(0)
}
