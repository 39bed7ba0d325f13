//! `bind`, `bind-bench`, `draw`: the session binder over a router artifact
//! (docs/specs/binder.md).

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::Path;
use std::time::Instant;

use replaylab_scorer::router::binder::{self, Binder, Config, Event};
use replaylab_scorer::router::golden;
use replaylab_scorer::util::json::{self, py_float_repr, Json, Number};
use replaylab_scorer::util::timefmt;
use replaylab_scorer::{Decision, Error, Router};

use super::route::bench_queries;
use super::timing::{bench_counts, count, summary_us};
use super::{emit, opt, parsed, read_jsonl, usage};

/// The binder options of `bind` and `bind-bench` (the Python keyword arguments' defaults).
pub fn binder_config(args: &[String]) -> Result<Config, Error> {
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
pub fn load_artifact(args: &[String], golden_check: bool) -> Result<Router, Error> {
    let dir = opt(args, "--artifact")?.ok_or_else(|| usage("no --artifact DIR"))?;
    let router = Router::load(Path::new(&dir), timefmt::now())?;
    if golden_check {
        super::require_golden(args, || golden::check(&router))?;
    }
    Ok(router)
}

pub fn bind(args: &[String]) -> Result<u8, Error> {
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

pub fn bind_bench(args: &[String]) -> Result<u8, Error> {
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
            let d = b.router.as_ref().expect("loaded").route(std::hint::black_box(&q.text), q.category.as_deref(), q.prompt_tokens)
                .expect("static tier: Binder::shared checked");
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
        .map(|q| router.route(&q.text, q.category.as_deref(), q.prompt_tokens).map(|d| d.candidate))
        .collect::<Result<_, _>>()?;
    let mut only = Binder::shared(Some(router), binder_config(args)?)?;
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

pub fn draw(args: &[String]) -> Result<u8, Error> {
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
