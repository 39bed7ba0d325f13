//! The exported functions of the C ABI (docs/specs/c-abi.md), by handle: `rl_demand`,
//! `rl_router`, `rl_binder`. Each body runs inside `guard` (no panic crosses).

use std::ffi::{c_char, c_int};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::{arg, code, guard, write_out, Fail, RL_ERR_NULL, RL_ERR_STATE, RL_ERR_UNSUPPORTED};
use crate::demand::golden as demand_golden;
use crate::router::binder::{Binder, Config, Event};
use crate::router::golden;
use crate::util::error::Error;
use crate::util::json::{self, Json};
use crate::util::timefmt;
use crate::{Demand, Router};

/// A loaded demand artifact (immutable: shared across threads as is).
pub struct RlDemand(Demand);

/// A loaded router artifact; binders hold their own reference (Arc), so freeing the router
/// handle leaves them working.
pub struct RlRouter(Arc<Router>);

/// A session binder: its state behind a lock, its clock started at creation.
pub struct RlBinder {
    binder: Mutex<Binder>,
    started: Instant,
}

// The handles cross threads by design; these fail to compile if a field stops being so.
const _: () = {
    const fn shared<T: Send + Sync>() {}
    shared::<RlDemand>();
    shared::<RlRouter>();
    shared::<RlBinder>();
};

/// `now_s` as given, or this machine's clock when it is 0, negative or NaN.
fn clock_s(now_s: f64) -> f64 {
    if now_s > 0.0 { now_s } else { timefmt::now() }
}

fn golden_failed(what: &str, summary: &Json) -> Fail {
    Fail(RL_ERR_STATE, format!("golden_mismatch: the {what} misses its golden vectors here: {}",
                               json::canonical(summary).unwrap_or_default()))
}

fn load_error(e: Error) -> Fail {
    Fail(RL_ERR_STATE, e.to_string())
}

fn parse(text: &str, what: &str) -> Result<Json, Fail> {
    json::parse(text).map_err(|e| Fail::input(format!("bad_input: {what} is not JSON: {e}")))
}

/// # Safety
/// `p` is NULL or a pointer this library returned and not yet freed.
unsafe fn handle<'a, T>(p: *const T, what: &str) -> Result<&'a T, Fail> {
    p.as_ref().ok_or_else(|| Fail(RL_ERR_NULL, format!("null_argument: {what} is NULL")))
}

// ------------------------------------------------------------------------ demand

/// Load and verify a demand artifact (manifest, hashes, validity at `now_s`, golden
/// vectors); NULL on error (`rl_last_error`).
///
/// # Safety
/// `dir` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn rl_demand_load(dir: *const c_char, now_s: f64) -> *mut RlDemand {
    guard(std::ptr::null_mut(), || {
        let d = Demand::load(Path::new(arg(dir, "dir")?), clock_s(now_s)).map_err(load_error)?;
        let (ok, summary) = demand_golden::check(&d).map_err(load_error)?;
        if !ok {
            return Err(golden_failed("demand artifact", &summary));
        }
        Ok(Box::into_raw(Box::new(RlDemand(d))))
    }).0
}

/// The hint of one request (the dict `DemandPredictor.predict` takes, as JSON) at this
/// machine's clock: the `demand` subcommand's line.
///
/// # Safety
/// `d` from `rl_demand_load`; `request_json` NUL-terminated; `out` NULL or `cap` bytes.
#[no_mangle]
pub unsafe extern "C" fn rl_demand_hint_json(d: *const RlDemand, request_json: *const c_char, out: *mut c_char,
                                             cap: usize) -> c_int {
    rl_demand_hint_json_at(d, request_json, (timefmt::now() * 1000.0) as i64, out, cap)
}

/// `rl_demand_hint_json` with the clock given (`now_ms`, ms since the Unix epoch: what a
/// request without `timestamp` is stamped with).
///
/// # Safety
/// As `rl_demand_hint_json`.
#[no_mangle]
pub unsafe extern "C" fn rl_demand_hint_json_at(d: *const RlDemand, request_json: *const c_char, now_ms: i64,
                                                out: *mut c_char, cap: usize) -> c_int {
    code(|| {
        let d = &handle(d, "demand handle")?.0;
        let request = parse(arg(request_json, "request_json")?, "request_json")?;
        write_out(&demand_golden::hint_line(&d.hint(&request, now_ms), None), out, cap)
    })
}

/// # Safety
/// `d` NULL or from `rl_demand_load`, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn rl_demand_free(d: *mut RlDemand) {
    if !d.is_null() {
        guard((), || {
            drop(Box::from_raw(d));
            Ok(())
        });
    }
}

// ------------------------------------------------------------------------ router

/// Load and verify a router artifact (both manifests, hashes, validity at `now_s`, golden
/// vectors); a MiniLM-tier artifact loads for `rl_router_route_embedding` only.
///
/// # Safety
/// `dir` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn rl_router_load(dir: *const c_char, now_s: f64) -> *mut RlRouter {
    guard(std::ptr::null_mut(), || {
        let r = Router::load(Path::new(arg(dir, "dir")?), clock_s(now_s)).map_err(load_error)?;
        let (ok, summary) = golden::check(&r).map_err(load_error)?;
        if !ok {
            return Err(golden_failed("router artifact", &summary));
        }
        Ok(Box::into_raw(Box::new(RlRouter(Arc::new(r)))))
    }).0
}

/// Route `{"text", "category", "prompt_tokens"}`: the `route` subcommand's line.
///
/// # Safety
/// `r` from `rl_router_load`; `request_json` NUL-terminated; `out` NULL or `cap` bytes.
#[no_mangle]
pub unsafe extern "C" fn rl_router_route_json(r: *const RlRouter, request_json: *const c_char, out: *mut c_char,
                                              cap: usize) -> c_int {
    code(|| {
        let r = &handle(r, "router handle")?.0;
        let q = golden::query(&parse(arg(request_json, "request_json")?, "request_json")?)?;
        let d = r.route(&q.text, q.category.as_deref(), q.prompt_tokens)
            .map_err(|e| Fail(RL_ERR_UNSUPPORTED, e.to_string()))?;
        write_out(&r.decision_json(&d), out, cap)
    })
}

/// Route on the host's own embedding (`dim` floats): the head and the decision rule, no
/// encoder (docs/specs/router-scorer.md "Routing on the host's embedding"). `category`
/// NULL: none; `prompt_tokens` NaN: unknown.
///
/// # Safety
/// `r` from `rl_router_load`; `emb` `dim` floats; `category` NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn rl_router_route_embedding(r: *const RlRouter, emb: *const f32, dim: usize,
                                                   category: *const c_char, prompt_tokens: f64,
                                                   out: *mut c_char, cap: usize) -> c_int {
    code(|| {
        let r = &handle(r, "router handle")?.0;
        if emb.is_null() {
            return Err(Fail(RL_ERR_NULL, "null_argument: emb is NULL".into()));
        }
        let emb = std::slice::from_raw_parts(emb, dim);
        let category = if category.is_null() { None } else { Some(arg(category, "category")?) };
        let d = r.route_embedding(emb, category, prompt_tokens).map_err(|e| match e.reason {
            "dimension" => Fail(RL_ERR_UNSUPPORTED, e.to_string()),
            _ => Fail::from(e),
        })?;
        write_out(&r.decision_json(&d), out, cap)
    })
}

/// The golden texts a host embeds to prove its encoder (a MiniLM-tier artifact's golden
/// triples, in order): a JSON array of `{"text", "category", "prompt_tokens"}`.
///
/// # Safety
/// `r` from `rl_router_load`; `out` NULL or `cap` bytes.
#[no_mangle]
pub unsafe extern "C" fn rl_router_golden_texts_json(r: *const RlRouter, out: *mut c_char, cap: usize) -> c_int {
    code(|| {
        let r = &handle(r, "router handle")?.0;
        let triples = golden::triples(r).map_err(|e| Fail(RL_ERR_UNSUPPORTED, e.to_string()))?;
        let opt_str = |x: &Option<String>| x.as_ref().map_or(Json::Null, |s| Json::Str(s.clone()));
        let opt_num = |x: Option<f64>| x.map_or(Json::Null, |v| Json::Num(json::Number { value: v, int: None }));
        let arr = triples.iter().map(|t| {
            let mut m = std::collections::BTreeMap::new();
            m.insert("text".to_string(), Json::Str(t.query.text.clone()));
            m.insert("category".to_string(), opt_str(&t.query.category));
            m.insert("prompt_tokens".to_string(), opt_num(t.query.prompt_tokens));
            Json::Obj(m)
        }).collect();
        write_out(&json::canonical(&Json::Arr(arr)).map_err(Fail::input)?, out, cap)
    })
}

/// Check the host's embeddings of the golden texts (`n` rows of `dim` floats, row i the
/// embedding of text i of `rl_router_golden_texts_json`) against the artifact's, with the
/// tolerances of its golden.json (docs/specs/router-scorer.md): 0 and the summary JSON
/// when the host's encoder reproduces them; RL_ERR_DRIFT when it does not (the summary
/// in `rl_last_error`): routing on that encoder would score another embedding space.
///
/// # Safety
/// `r` from `rl_router_load`; `embs` `n * dim` floats; `out` NULL or `cap` bytes.
#[no_mangle]
pub unsafe extern "C" fn rl_router_verify_encoder(r: *const RlRouter, embs: *const f32, n: usize, dim: usize,
                                                  out: *mut c_char, cap: usize) -> c_int {
    code(|| {
        let r = &handle(r, "router handle")?.0;
        if embs.is_null() {
            return Err(Fail(RL_ERR_NULL, "null_argument: embs is NULL".into()));
        }
        let flat = std::slice::from_raw_parts(embs, n * dim);
        let host: Vec<Vec<f32>> = flat.chunks(dim.max(1)).map(<[f32]>::to_vec).collect();
        let (ok, summary) = golden::verify_encoder(r, &host[..n.min(host.len())]).map_err(|e| match e.reason {
            "dimension" | "golden_invalid" | "golden_absent" => Fail(RL_ERR_UNSUPPORTED, e.to_string()),
            _ => Fail::from(e),
        })?;
        let text = json::canonical(&summary).map_err(Fail::input)?;
        if !ok {
            return Err(Fail(super::RL_ERR_DRIFT, format!("encoder_drift: {text}")));
        }
        write_out(&text, out, cap)
    })
}

/// # Safety
/// `r` NULL or from `rl_router_load`, not used afterwards (binders over it keep working).
#[no_mangle]
pub unsafe extern "C" fn rl_router_free(r: *mut RlRouter) {
    if !r.is_null() {
        guard((), || {
            drop(Box::from_raw(r));
            Ok(())
        });
    }
}

// ------------------------------------------------------------------------ binder

/// The binder's settings from `{"rate", "cap", "salt", "ladder", "ttl_s", "max_sessions",
/// "fallback_candidate"}` (SessionBinder's keyword arguments; absent or null: its default).
fn binder_config(v: &Json) -> Result<Config, Fail> {
    let bad = |k: &str, t: &str| Fail::input(format!("bad_config: config_json {k:?} must be {t}"));
    if v.as_object().is_none() {
        return Err(Fail::input("bad_config: config_json must be a JSON object"));
    }
    let field = |k: &str| v.get(k).filter(|x| !x.is_null());
    let num = |k: &str, d: f64| field(k).map_or(Ok(d), |x| x.as_f64().ok_or_else(|| bad(k, "a number")));
    let text = |k: &str| field(k).map(|x| x.as_str().map(str::to_string).ok_or_else(|| bad(k, "a string"))).transpose();
    let d = Config::default();
    let max_sessions = match field("max_sessions") {
        None => d.max_sessions,
        Some(x) => x.as_i64().and_then(|n| usize::try_from(n).ok()).ok_or_else(|| bad("max_sessions", "an integer >= 0"))?,
    };
    let ladder = match field("ladder") {
        None => None,
        Some(x) => Some(x.as_array().and_then(|a| a.iter().map(|c| c.as_str().map(str::to_string)).collect())
            .ok_or_else(|| bad("ladder", "a list of strings"))?),
    };
    Ok(Config { rate: num("rate", d.rate)?, cap: num("cap", d.cap)?, salt: text("salt")?.unwrap_or(d.salt),
                ladder, ttl_s: num("ttl_s", d.ttl_s)?, max_sessions, fallback_candidate: text("fallback_candidate")? })
}

/// A session binder over `r` (NULL: a router that did not load; then `config_json` must
/// name `fallback_candidate`). `config_json` NULL: the defaults. NULL on error.
///
/// # Safety
/// `r` NULL or from `rl_router_load`; `config_json` NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn rl_binder_new(r: *const RlRouter, config_json: *const c_char) -> *mut RlBinder {
    guard(std::ptr::null_mut(), || {
        let router = r.as_ref().map(|r| Arc::clone(&r.0));
        let cfg = if config_json.is_null() { Config::default() } else {
            binder_config(&parse(arg(config_json, "config_json")?, "config_json")?)?
        };
        let binder = Binder::shared(router, cfg).map_err(Fail::from)?;
        Ok(Box::into_raw(Box::new(RlBinder { binder: Mutex::new(binder), started: Instant::now() })))
    }).0
}

fn locked(b: &RlBinder) -> Result<std::sync::MutexGuard<'_, Binder>, Fail> {
    b.binder.lock().map_err(|_| Fail(RL_ERR_STATE, "poisoned: an earlier call panicked inside this binder".into()))
}

/// One turn `{"session_id", "text", "category", "prompt_tokens", "turn_index"}` (and
/// optionally `"now"`, seconds on the binder's clock; absent: seconds since `rl_binder_new`):
/// the receipt, the binder's canonical ledger-v1 record (as `replaylab-route bind`).
/// When `cap` is below an upper bound of the receipt's size (12 x the session id's bytes,
/// plus 12 x the longest candidate name's, plus 512) the turn is not applied and the bound
/// is returned: a retry with that buffer applies it once.
///
/// # Safety
/// `b` from `rl_binder_new`; `turn_json` NUL-terminated; `out` NULL or `cap` bytes.
#[no_mangle]
pub unsafe extern "C" fn rl_binder_bind_json(b: *mut RlBinder, turn_json: *const c_char, out: *mut c_char,
                                             cap: usize) -> c_int {
    code(|| {
        let h = handle(b.cast_const(), "binder handle")?;
        let mut v = parse(arg(turn_json, "turn_json")?, "turn_json")?;
        if let Json::Obj(m) = &mut v {
            m.insert("op".into(), Json::Str("bind".into())); // the replay format's bind event
        }
        let Event::Bind { session_id, text, category, prompt_tokens, turn_index, now } = Event::parse(&v)? else {
            unreachable!("op is bind");
        };
        let now = now.unwrap_or_else(|| h.started.elapsed().as_secs_f64());
        let line = {
            let mut binder = locked(h)?;
            // a turn changes the binder: it is applied only when the receipt will fit, so a
            // caller asks with an upper bound (every field escaped at most 6 bytes a byte)
            let longest = binder.ladder.iter().map(String::len).max().unwrap_or(0);
            let bound = 12 * session_id.len() + 12 * longest + 512;
            if out.is_null() || cap < bound {
                return c_int::try_from(bound).map_err(|_| Fail(super::RL_ERR_TOO_LARGE, "too_large: session_id".into()));
            }
            let r = binder.bind(&session_id, &text, category.as_deref(), prompt_tokens, turn_index, now);
            json::canonical(&binder.bind_record(&session_id, &r)).map_err(Fail::input)?
        };
        write_out(&line, out, cap)
    })
}

/// A turn of `session_id` failed: 1 when its next turn escalates, 0 when it cannot
/// (unknown session, or already on the strongest candidate), < 0 on error.
///
/// # Safety
/// `b` from `rl_binder_new`; `session_id` NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn rl_binder_report_failure(b: *mut RlBinder, session_id: *const c_char) -> c_int {
    code(|| {
        let h = handle(b.cast_const(), "binder handle")?;
        let sid = arg(session_id, "session_id")?;
        Ok(locked(h)?.report_failure(sid) as c_int)
    })
}

/// The binder's counts (the replay format's `stats` record, canonical JSON).
///
/// # Safety
/// `b` from `rl_binder_new`; `out` NULL or `cap` bytes.
#[no_mangle]
pub unsafe extern "C" fn rl_binder_stats_json(b: *mut RlBinder, out: *mut c_char, cap: usize) -> c_int {
    code(|| {
        let h = handle(b.cast_const(), "binder handle")?;
        let line = json::canonical(&locked(h)?.stats_record()).map_err(Fail::input)?;
        write_out(&line, out, cap)
    })
}

/// # Safety
/// `b` NULL or from `rl_binder_new`, not used afterwards (nor concurrently with this call).
#[no_mangle]
pub unsafe extern "C" fn rl_binder_free(b: *mut RlBinder) {
    if !b.is_null() {
        guard((), || {
            drop(Box::from_raw(b));
            Ok(())
        });
    }
}
