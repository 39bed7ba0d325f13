//! What the bench subcommands share: the timing loop, numpy's percentile, the summary.

use std::collections::BTreeMap;
use std::time::Instant;

use replaylab_scorer::util::json::{Json, Number};
use replaylab_scorer::Error;

use super::{opt, usage};

/// numpy's default percentile (linear interpolation between order statistics).
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let pos = q / 100.0 * (sorted.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

/// `--n` timed calls (default 1000) after `--warmup` untimed ones (default 20).
pub fn bench_counts(args: &[String]) -> Result<(usize, usize), Error> {
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
pub fn time_calls<T>(args: &[String], n: usize, warmup: usize, inputs: usize, decimals: i32, load_ms: f64,
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

pub fn count(x: usize) -> Json {
    Json::Num(Number { value: x as f64, int: Some(x.to_string()) })
}

pub fn summary_us(us: &[f64], decimals: i32) -> Json {
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
