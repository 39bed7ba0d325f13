//! replaylab-route: route queries with a static-tier router artifact (docs/scorer-spec.md).
//!
//!   replaylab-route route ARTIFACT_DIR [--no-golden]
//!       JSON lines on stdin {"text", "category"?, "prompt_tokens"?} -> JSON lines on
//!       stdout {"candidate", "success_prob", "margin", "token_ids"}. The golden vectors
//!       are checked at load first (as the Python Router does) unless --no-golden.
//!   replaylab-route golden ARTIFACT_DIR
//!       check the golden vectors; prints a JSON summary; exit 0 when they hold, else 1.
//!   replaylab-route bench ARTIFACT_DIR [--n N] [--warmup W] [--inputs FILE.jsonl] [--samples]
//!       load once, time N routes (inputs cycled; default: the golden queries) inside
//!       the process (wall clock, one thread, each call: tokenize, embed, head, decide);
//!       prints one JSON object with p50/p90/p99 in microseconds (--samples: every call's).
//!   replaylab-route demand ARTIFACT_DIR [--no-golden] [--explain] [--now-ms MS]
//!       a demand artifact (docs/demand-scorer-spec.md): JSON lines on stdin (request
//!       objects, the Python runtime's fields) -> JSON lines on stdout (the hint; with
//!       --explain also the feature row and raw scores). --now-ms: the clock for requests
//!       without `timestamp` (default: now). Golden vectors checked first unless --no-golden.
//!   replaylab-route demand-golden ARTIFACT_DIR
//!       check the demand golden vectors; prints a JSON summary; exit 0 when they hold, else 1.
//!   replaylab-route demand-bench ARTIFACT_DIR [--n N] [--warmup W] [--inputs FILE.jsonl] [--samples]
//!       load once, time N hints (inputs cycled; default: the golden requests), as `bench`:
//!       each call is one `Demand::hint` on a parsed request (no JSON I/O timed).
//!   replaylab-route canon            (a check aid) canonical JSON of the JSON on stdin
//!   replaylab-route sha256 FILE...   (a check aid) hex sha256 of each file
//!   replaylab-route safetensors FILE (a check aid) its F32 tensors as JSON {name: {shape, data}}
//!
//! Errors (missing file, hash mismatch, bad JSON, bad usage): one `error: ...` line on
//! stderr and exit code 2.

use std::collections::BTreeMap;
use std::io::{BufRead, Read, Write};
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use replaylab_scorer::golden::{self, Query};
use replaylab_scorer::json::{self, py_float_repr, write_str, Json, Number};
use replaylab_scorer::{demand_golden, sha256, timefmt, Demand, Error, Router};

const USAGE: &str = "usage: replaylab-route route|golden|bench|demand|demand-golden|demand-bench ARTIFACT_DIR [options] (see docs/scorer-spec.md, docs/demand-scorer-spec.md)";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// One line on stdout; a closed pipe (`| head`) is not an error worth a panic.
/// A golden check's summary on stdout; exit status 0 when it held, else 1 (said on stderr).
fn emit_check((ok, summary): (bool, Json), what: &str) -> u8 {
    emit(&json::canonical(&summary).expect("finite"));
    if !ok {
        eprintln!("{what} missed: see the summary");
    }
    if ok { 0 } else { 1 }
}

fn emit(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(line.as_bytes()).and_then(|_| out.write_all(b"\n")).and_then(|_| out.flush());
}

fn usage(m: &str) -> Error {
    Error::new("usage", format!("{m}; {USAGE}"))
}

fn load(args: &[String]) -> Result<Router, Error> {
    let dir = args.get(1).filter(|a| !a.starts_with("--")).ok_or_else(|| usage("no ARTIFACT_DIR"))?;
    Router::load(Path::new(dir), timefmt::now())
}

fn opt(args: &[String], name: &str) -> Result<Option<String>, Error> {
    match args.iter().position(|a| a == name) {
        None => Ok(None),
        Some(i) => args.get(i + 1).cloned().map(Some).ok_or_else(|| usage(&format!("{name} needs a value"))),
    }
}

fn run(args: &[String]) -> Result<u8, Error> {
    match args.first().map(String::as_str) {
        Some("route") => route(args),
        Some("golden") => Ok(emit_check(golden::check(&load(args)?)?, "golden vectors")),
        Some("bench") => bench(args),
        Some("demand") => demand(args),
        Some("demand-golden") => {
            Ok(emit_check(demand_golden::check(&load_demand(args)?)?, "demand golden vectors"))
        }
        Some("demand-bench") => demand_bench(args),
        Some("canon") => {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s).map_err(|e| Error::new("io", e.to_string()))?;
            let v = json::parse(&s).map_err(|e| Error::new("invalid_json", e.to_string()))?;
            emit(&json::canonical(&v).map_err(|e| Error::new("invalid_json", e))?);
            Ok(0)
        }
        Some("sha256") => {
            for f in &args[1..] {
                let data = std::fs::read(f).map_err(|e| Error::new("missing_file", format!("{f}: {e}")))?;
                emit(&format!("{}  {f}", sha256::sha256_hex(&data)));
            }
            Ok(0)
        }
        Some("safetensors") => {
            let f = args.get(1).ok_or_else(|| usage("safetensors FILE"))?;
            let data = std::fs::read(f).map_err(|e| Error::new("missing_file", format!("{f}: {e}")))?;
            let mut m = BTreeMap::new();
            for (name, t) in replaylab_scorer::safetensors::read(&data, f)? {
                let mut e = BTreeMap::new();
                let int = |x: usize| Json::Num(Number { value: x as f64, int: Some(x.to_string()) });
                e.insert("shape".to_string(), Json::Arr(t.shape.iter().map(|&x| int(x)).collect()));
                e.insert("data".to_string(), Json::Arr(t.data.iter()
                    .map(|&x| Json::Num(Number { value: x as f64, int: None })).collect()));
                m.insert(name, Json::Obj(e));
            }
            emit(&json::canonical(&Json::Obj(m)).map_err(|e| Error::new("safetensors", e))?);
            Ok(0)
        }
        Some("-h" | "--help") => {
            emit(USAGE);
            Ok(0)
        }
        _ => Err(usage("unknown or missing subcommand")),
    }
}

fn route(args: &[String]) -> Result<u8, Error> {
    let router = load(args)?;
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
        let d = router.route(&q.text, q.category.as_deref(), q.prompt_tokens);
        line_s.clear();
        line_s.push_str("{\"candidate\":");
        write_str(&mut line_s, &router.candidates[d.candidate]);
        line_s.push_str(",\"success_prob\":[");
        for (i, p) in d.success_prob.iter().enumerate() {
            if i > 0 {
                line_s.push(',');
            }
            line_s.push_str(&py_float_repr(*p));
        }
        line_s.push_str("],\"margin\":");
        line_s.push_str(&if d.margin.is_finite() { py_float_repr(d.margin) } else { "null".into() });
        line_s.push_str(",\"token_ids\":[");
        for (i, t) in d.token_ids.iter().enumerate() {
            if i > 0 {
                line_s.push(',');
            }
            line_s.push_str(&t.to_string());
        }
        line_s.push_str("]}\n");
        out.write_all(line_s.as_bytes()).and_then(|_| out.flush())
            .map_err(|e| Error::new("io", e.to_string()))?;
    }
    Ok(0)
}

/// numpy's default percentile (linear interpolation between order statistics).
fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let pos = q / 100.0 * (sorted.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

/// `--n` timed calls (default 1000) after `--warmup` untimed ones (default 20).
fn bench_counts(args: &[String]) -> Result<(usize, usize), Error> {
    let n: usize = opt(args, "--n")?.map_or(Ok(1000), |s| s.parse()).map_err(|_| usage("--n must be an integer"))?;
    let warmup: usize = opt(args, "--warmup")?.map_or(Ok(20), |s| s.parse()).map_err(|_| usage("--warmup must be an integer"))?;
    Ok((n, warmup))
}

/// Times `call(i)` for i in 0..n (after `warmup` untimed calls) in microseconds. Returns
/// the summary both bench subcommands print (calls, inputs, p50/p90/p99/mean/max rounded
/// to `decimals`, load_ms, threads, version, and with `--samples` every call's time in
/// call order, for pooling across runs) and the sum of `tally` over the timed calls' results
/// (read and dropped after the clock stops).
#[allow(clippy::too_many_arguments)]
fn time_calls<T>(args: &[String], n: usize, warmup: usize, inputs: usize, decimals: i32, load_ms: f64,
                 version: &str, call: impl Fn(usize) -> T, tally: impl Fn(T) -> usize)
                 -> (BTreeMap<String, Json>, usize) {
    for i in 0..warmup {
        std::hint::black_box(call(i));
    }
    let mut us = Vec::with_capacity(n);
    let mut total = 0usize;
    for i in 0..n {
        let t = Instant::now();
        let r = call(i);
        us.push(t.elapsed().as_secs_f64() * 1e6);
        total += tally(std::hint::black_box(r));
    }
    let mean = us.iter().sum::<f64>() / n as f64;
    let raw = us.clone();
    us.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
    let scale = 10f64.powi(decimals);
    let f = |x: f64| Json::Num(Number { value: (x * scale).round() / scale, int: None });
    let mut s = BTreeMap::new();
    s.insert("calls".to_string(), count(n));
    s.insert("inputs".to_string(), count(inputs));
    s.insert("p50_us".to_string(), f(percentile(&us, 50.0)));
    s.insert("p90_us".to_string(), f(percentile(&us, 90.0)));
    s.insert("p99_us".to_string(), f(percentile(&us, 99.0)));
    s.insert("mean_us".to_string(), f(mean));
    s.insert("max_us".to_string(), f(*us.last().expect("n > 0")));
    s.insert("load_ms".to_string(), f(load_ms));
    s.insert("threads".to_string(), count(1));
    s.insert("version".to_string(), Json::Str(version.to_string()));
    if args.iter().any(|a| a == "--samples") {
        s.insert("samples_us".to_string(), Json::Arr(raw.iter().map(|&x| f(x)).collect()));
    }
    (s, total)
}

fn count(x: usize) -> Json {
    Json::Num(Number { value: x as f64, int: Some(x.to_string()) })
}

fn bench(args: &[String]) -> Result<u8, Error> {
    let (n, warmup) = bench_counts(args)?;
    let t0 = Instant::now();
    let router = load(args)?;
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;
    let queries: Vec<Query> = match opt(args, "--inputs")? {
        None => golden::golden_queries(&router)?,
        Some(f) => read_jsonl(&f)?.iter().map(golden::query).collect::<Result<_, _>>()?,
    };
    if queries.is_empty() || n == 0 {
        return Err(usage("no inputs to time (or --n 0)"));
    }
    let (mut s, tokens) = time_calls(args, n, warmup, queries.len(), 1, load_ms, &router.version, |i| {
        let q = &queries[i % queries.len()];
        router.route(std::hint::black_box(&q.text), q.category.as_deref(), q.prompt_tokens)
    }, |d| d.token_ids.len());
    let mean_tokens = tokens as f64 / n as f64;
    s.insert("tokens_mean".to_string(), Json::Num(Number { value: (mean_tokens * 10.0).round() / 10.0, int: None }));
    emit(&json::canonical(&Json::Obj(s)).expect("finite"));
    Ok(0)
}

fn load_demand(args: &[String]) -> Result<Demand, Error> {
    let dir = args.get(1).filter(|a| !a.starts_with("--")).ok_or_else(|| usage("no ARTIFACT_DIR"))?;
    Demand::load(Path::new(dir), timefmt::now())
}

fn read_jsonl(f: &str) -> Result<Vec<Json>, Error> {
    let file = std::fs::File::open(f).map_err(|e| Error::new("missing_file", format!("{f}: {e}")))?;
    let mut out = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| Error::new("bad_input", format!("{f} line {}: {e}", i + 1)))?;
        if !line.trim().is_empty() {
            out.push(json::parse(&line).map_err(|e| Error::new("bad_input", format!("{f} line {}: {e}", i + 1)))?);
        }
    }
    Ok(out)
}

fn demand(args: &[String]) -> Result<u8, Error> {
    let d = load_demand(args)?;
    if !args.iter().any(|a| a == "--no-golden") {
        let (ok, summary) = demand_golden::check(&d)?;
        if !ok {
            return Err(Error::new("golden_mismatch", format!("the artifact misses its golden vectors here: {}",
                                                             json::canonical(&summary).expect("finite"))));
        }
    }
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

fn demand_bench(args: &[String]) -> Result<u8, Error> {
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
