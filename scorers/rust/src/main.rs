//! replaylab-route: route queries with a static-tier router artifact (docs/specs/router-scorer.md).
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
//!       a demand artifact (docs/specs/demand-scorer.md): JSON lines on stdin (request
//!       objects, the Python runtime's fields) -> JSON lines on stdout (the hint; with
//!       --explain also the feature row and raw scores). --now-ms: the clock for requests
//!       without `timestamp` (default: now). Golden vectors checked first unless --no-golden.
//!   replaylab-route demand-golden ARTIFACT_DIR
//!       check the demand golden vectors; prints a JSON summary; exit 0 when they hold, else 1.
//!   replaylab-route demand-bench ARTIFACT_DIR [--n N] [--warmup W] [--inputs FILE.jsonl] [--samples]
//!       load once, time N hints (inputs cycled; default: the golden requests), as `bench`:
//!       each call is one `Demand::hint` on a parsed request (no JSON I/O timed).
//!   replaylab-route bind --artifact DIR --events FILE.jsonl [--rate R] [--cap C] [--salt S]
//!                        [--ladder a,b,c] [--max-sessions N] [--ttl-s T] [--fallback M] [--no-golden]
//!       the session binder (docs/specs/binder.md) over the artifact: JSONL events in order
//!       ({"op": "bind", "session_id", "text", "category", "prompt_tokens", "turn_index",
//!       "now"}, {"op": "fail", "session_id"}, {"op": "stats"}) -> one canonical JSON record
//!       per event on stdout (a bind's receipt, a fail's `escalated`, the counts). An
//!       artifact that does not load (or misses its golden vectors) leaves the binder on
//!       --fallback (reason router_not_loaded); without --fallback that is an error.
//!   replaylab-route bind-bench --artifact DIR [--n N] [--warmup W] [--inputs FILE.jsonl] [--samples]
//!                              [binder options as bind]
//!       time, on the same inputs, `route` alone and an opening `bind` (route + binder) of a
//!       fresh session, interleaved, then a sticky turn of each session; p50/p99 of each and
//!       the opening overhead (bind p50/p99 minus route p50/p99); `binder_only`: the same
//!       openings with the router's choice given (`Binder::bind_with`), the binder's own work.
//!   replaylab-route draw --salt S --rate R --k K   (a check aid) session ids on stdin, one
//!       per line -> {"u": exploration draw, "j": explored index or null} per line
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
use replaylab_scorer::binder::{self, Binder, Config, Event};
use replaylab_scorer::{demand_golden, sha256, timefmt, Decision, Demand, Error, Router};

const USAGE: &str = "usage: replaylab-route route|golden|bench|demand|demand-golden|demand-bench ARTIFACT_DIR [options] | bind|bind-bench --artifact DIR [options] (see docs/specs/router-scorer.md, docs/specs/demand-scorer.md, docs/specs/binder.md)";

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
        Some("bind") => bind(args),
        Some("bind-bench") => bind_bench(args),
        Some("draw") => draw(args),
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

/// The queries a latency bench times: `--inputs` (JSONL) or the artifact's golden queries.
fn bench_queries(args: &[String], router: &Router, n: usize) -> Result<Vec<Query>, Error> {
    let queries: Vec<Query> = match opt(args, "--inputs")? {
        None => golden::golden_queries(router)?,
        Some(f) => read_jsonl(&f)?.iter().map(golden::query).collect::<Result<_, _>>()?,
    };
    if queries.is_empty() || n == 0 {
        return Err(usage("no inputs to time (or --n 0)"));
    }
    Ok(queries)
}

fn bench(args: &[String]) -> Result<u8, Error> {
    let (n, warmup) = bench_counts(args)?;
    let t0 = Instant::now();
    let router = load(args)?;
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;
    let queries = bench_queries(args, &router, n)?;
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

fn parsed<T: std::str::FromStr>(args: &[String], name: &str) -> Result<Option<T>, Error> {
    opt(args, name)?.map(|s| s.parse::<T>().map_err(|_| usage(&format!("{name} {s:?} is not a valid value"))))
        .transpose()
}

/// The binder options of `bind` and `bind-bench` (the Python keyword arguments' defaults).
fn binder_config(args: &[String]) -> Result<Config, Error> {
    let d = Config::default();
    Ok(Config {
        rate: parsed(args, "--rate")?.unwrap_or(d.rate),
        cap: parsed(args, "--cap")?.unwrap_or(d.cap),
        salt: opt(args, "--salt")?.unwrap_or(d.salt),
        ladder: opt(args, "--ladder")?.map(|l| l.split(',').map(str::to_string).collect()),
        ttl_s: parsed(args, "--ttl-s")?.unwrap_or(d.ttl_s),
        max_sessions: parsed(args, "--max-sessions")?.unwrap_or(d.max_sessions),
        fallback_candidate: opt(args, "--fallback")?,
    })
}

/// The router of `--artifact DIR`, golden vectors checked unless --no-golden (as the
/// Python `Router.load`): Err(the reason) when it does not load.
fn load_artifact(args: &[String], golden_check: bool) -> Result<Router, Error> {
    let dir = opt(args, "--artifact")?.ok_or_else(|| usage("no --artifact DIR"))?;
    let router = Router::load(Path::new(&dir), timefmt::now())?;
    if golden_check && !args.iter().any(|a| a == "--no-golden") {
        let (ok, summary) = golden::check(&router)?;
        if !ok {
            return Err(Error::new("golden_mismatch", format!("the artifact misses its golden vectors here: {}",
                                                             json::canonical(&summary).expect("finite"))));
        }
    }
    Ok(router)
}

fn bind(args: &[String]) -> Result<u8, Error> {
    let cfg = binder_config(args)?;
    let events_file = opt(args, "--events")?.ok_or_else(|| usage("no --events FILE.jsonl"))?;
    let events: Vec<Event> = read_jsonl(&events_file)?.iter().enumerate()
        .map(|(i, v)| Event::parse(v).map_err(|e| Error::new("bad_input", format!("{events_file} event {}: {}", i + 1, e.message))))
        .collect::<Result<_, _>>()?;
    let router = match load_artifact(args, true) {
        Ok(r) => Some(r),
        Err(e) if cfg.fallback_candidate.is_some() => {
            eprintln!("note: the router did not load ({e}): every opening takes --fallback (router_not_loaded)");
            None
        }
        Err(e) => return Err(Error::new(e.reason, format!("{}; name --fallback MODEL to bind without it", e.message))),
    };
    let mut b = Binder::new(router, cfg)?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut failed = None;
    binder::replay(&mut b, &events, |rec| {
        if failed.is_none() {
            let line = json::canonical(&rec).expect("finite");
            if let Err(e) = out.write_all(line.as_bytes()).and_then(|_| out.write_all(b"\n")) {
                failed = Some(e);
            }
        }
    });
    if let Some(e) = failed {
        return Err(Error::new("io", e.to_string()));
    }
    out.flush().map_err(|e| Error::new("io", e.to_string()))?;
    Ok(0)
}

fn summary_us(us: &[f64], decimals: i32) -> Json {
    let mut sorted = us.to_vec();
    sorted.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
    let scale = 10f64.powi(decimals);
    let f = |x: f64| Json::Num(Number { value: (x * scale).round() / scale, int: None });
    let mut s = BTreeMap::new();
    s.insert("calls".to_string(), count(us.len()));
    for q in [50.0, 90.0, 99.0] {
        s.insert(format!("p{q}_us"), f(percentile(&sorted, q)));
    }
    s.insert("mean_us".to_string(), f(us.iter().sum::<f64>() / us.len() as f64));
    s.insert("max_us".to_string(), f(*sorted.last().expect("n > 0")));
    Json::Obj(s)
}

fn bind_bench(args: &[String]) -> Result<u8, Error> {
    let (n, warmup) = bench_counts(args)?;
    let cfg = binder_config(args)?;
    let t0 = Instant::now();
    let router = load_artifact(args, false)?;
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;
    let queries = bench_queries(args, &router, n)?;
    let version = router.version.clone();
    let mut b = Binder::new(Some(router), cfg)?;
    if b.reason.is_some() || b.max_sessions < n + warmup {
        return Err(usage(&format!("the binder must decide by the router (reason {:?}) and hold --n + --warmup \
                                   sessions (--max-sessions {})", b.reason, b.max_sessions)));
    }
    let sids: Vec<String> = (0..n + warmup).map(|i| format!("bench-{i:08}")).collect();
    let clock = Instant::now();
    let (mut route_us, mut open_us, mut sticky_us) = (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
    let mut explored = 0usize;
    for (i, sid) in sids.iter().enumerate() {
        let q = &queries[i % queries.len()];
        let time_route = |b: &Binder| {
            let t = Instant::now();
            let d = b.router.as_ref().expect("loaded").route(std::hint::black_box(&q.text), q.category.as_deref(), q.prompt_tokens);
            let us = t.elapsed().as_secs_f64() * 1e6;
            std::hint::black_box(d);
            us
        };
        let time_open = |b: &mut Binder| {
            let t = Instant::now();
            let r = b.bind(std::hint::black_box(sid), &q.text, q.category.as_deref(), q.prompt_tokens, None,
                           clock.elapsed().as_secs_f64());
            let us = t.elapsed().as_secs_f64() * 1e6;
            (us, std::hint::black_box(r).routing_source == binder::EXPLORATION)
        };
        // alternate which path goes first, so that neither always runs on a warmer cache
        let (r_us, (o_us, ex)) = if i % 2 == 0 {
            let r = time_route(&b);
            (r, time_open(&mut b))
        } else {
            let o = time_open(&mut b);
            (time_route(&b), o)
        };
        if i >= warmup {
            route_us.push(r_us);
            open_us.push(o_us);
            explored += ex as usize;
        }
    }
    // the binder alone: the same openings on a second binder over the same router, its
    // choice given (a decision without probabilities or token ids: no allocation)
    let router = b.router.take().expect("loaded");
    let decided: Vec<usize> = queries.iter()
        .map(|q| router.route(&q.text, q.category.as_deref(), q.prompt_tokens).candidate).collect();
    let mut only = Binder::new(Some(router), binder_config(args)?)?;
    let mut only_us = Vec::with_capacity(n);
    for (i, sid) in sids.iter().enumerate() {
        let q = &queries[i % queries.len()];
        let c = decided[i % queries.len()];
        let t = Instant::now();
        let r = only.bind_with(std::hint::black_box(sid), &q.text, q.category.as_deref(), q.prompt_tokens, None,
                               clock.elapsed().as_secs_f64(),
                               |_| Decision { candidate: c, success_prob: Vec::new(), margin: 0.0, token_ids: Vec::new() });
        let us = t.elapsed().as_secs_f64() * 1e6;
        std::hint::black_box(r);
        if i >= warmup {
            only_us.push(us);
        }
    }
    b.router = only.router.take();
    for (i, sid) in sids.iter().enumerate() {
        let t = Instant::now();
        let r = b.bind(std::hint::black_box(sid), "", None, None, None, clock.elapsed().as_secs_f64());
        let us = t.elapsed().as_secs_f64() * 1e6;
        assert_eq!(std::hint::black_box(r).routing_source, binder::STICKY, "a sticky turn");
        if i >= warmup {
            sticky_us.push(us);
        }
    }
    let get = |s: &Json, k: &str| s.get(k).and_then(Json::as_f64).expect("summary");
    let (route, open, sticky) = (summary_us(&route_us, 3), summary_us(&open_us, 3), summary_us(&sticky_us, 3));
    let f = |x: f64| Json::Num(Number { value: (x * 1000.0).round() / 1000.0, int: None });
    let mut s = BTreeMap::new();
    s.insert("calls".to_string(), count(n));
    s.insert("inputs".to_string(), count(queries.len()));
    s.insert("explored".to_string(), count(explored));
    s.insert("rate".to_string(), Json::Num(Number { value: b.rate, int: None }));
    s.insert("open_overhead_p50_us".to_string(), f(get(&open, "p50_us") - get(&route, "p50_us")));
    s.insert("open_overhead_p99_us".to_string(), f(get(&open, "p99_us") - get(&route, "p99_us")));
    s.insert("sticky_p50_us".to_string(), f(get(&sticky, "p50_us")));
    s.insert("sticky_p99_us".to_string(), f(get(&sticky, "p99_us")));
    s.insert("route".to_string(), route);
    s.insert("open".to_string(), open);
    s.insert("sticky".to_string(), sticky);
    s.insert("binder_only".to_string(), summary_us(&only_us, 3));
    s.insert("load_ms".to_string(), f(load_ms));
    s.insert("threads".to_string(), count(1));
    s.insert("version".to_string(), Json::Str(version));
    if args.iter().any(|a| a == "--samples") {
        for (k, v) in [("route_samples_us", &route_us), ("open_samples_us", &open_us), ("sticky_samples_us", &sticky_us),
                       ("binder_only_samples_us", &only_us)] {
            s.insert(k.to_string(), Json::Arr(v.iter().map(|&x| f(x)).collect()));
        }
    }
    emit(&json::canonical(&Json::Obj(s)).expect("finite"));
    Ok(0)
}

fn draw(args: &[String]) -> Result<u8, Error> {
    let salt = opt(args, "--salt")?.unwrap_or_default();
    let rate: f64 = parsed(args, "--rate")?.ok_or_else(|| usage("draw needs --rate"))?;
    let k: usize = parsed(args, "--k")?.ok_or_else(|| usage("draw needs --k"))?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    for line in std::io::stdin().lock().lines() {
        let sid = line.map_err(|e| Error::new("bad_input", e.to_string()))?;
        let u = binder::exploration_draw(&salt, &sid);
        let j = binder::explored_index(u, rate, k).map_or("null".to_string(), |j| j.to_string());
        writeln!(out, "{{\"j\":{j},\"u\":{}}}", py_float_repr(u)).map_err(|e| Error::new("io", e.to_string()))?;
    }
    out.flush().map_err(|e| Error::new("io", e.to_string()))?;
    Ok(0)
}
