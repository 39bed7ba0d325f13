//! Session binder (docs/specs/binder.md): sticky, session-scoped bindings over a loaded
//! [`Router`], the same as `replaylab.runtime.binder.SessionBinder` (Python), receipt for
//! receipt.
//!
//! The opening turn of a session is decided once (the router's choice, or with
//! exploration another candidate drawn from SHA-256(salt || 0x1f || session id)); later
//! turns reuse the binding; a reported failure moves the session one step up the ladder
//! on its next turn. A router that did not load, a bad or capped rate, or a ladder naming
//! an unknown candidate put every opening on the artifact's rules (reason codes). At most
//! `max_sessions` sessions are held (least recently used evicted first), and a session
//! idle longer than `ttl_s` is dropped. The clock is passed in (`now`, seconds).
//!
//! [`replay`] runs the JSONL event format (`{"op": "bind" | "fail" | "stats", ...}`) the
//! Python `replay_events` runs too, one canonical JSON record per event.

use std::collections::{BTreeMap, HashMap};

use crate::error::Error;
use crate::json::{self, Json, Number};
use crate::router::{Decision, Router};
use crate::sha256::Sha256;

pub const SPEC_VERSION: &str = "1";
pub const SEPARATOR: u8 = 0x1f;

// routing_source / rebind_reason values of ledger-v1
pub const STICKY: &str = "sticky_binding";
pub const CLASSIFIER: &str = "classifier";
pub const HEURISTIC: &str = "heuristic";
pub const FIXED: &str = "fixed";
pub const EXPLORATION: &str = "exploration";
pub const ESCALATION: &str = "escalation";

// reason codes of a rules-fallback binding
pub const NOT_LOADED: &str = "router_not_loaded";
pub const RATE_ABOVE_CAP: &str = "rate_above_cap";
pub const BAD_RATE: &str = "bad_rate";
pub const UNKNOWN_CANDIDATE: &str = "unknown_candidate";

const TWO_POW_MINUS_53: f64 = 1.0 / 9_007_199_254_740_992.0;

/// u(s) in [0, 1) on a 2^-53 grid: SHA-256 of salt, 0x1f, session id (UTF-8); the first
/// 8 bytes big-endian, top 53 bits, times 2^-53 (exact).
pub fn exploration_draw(salt: &str, session_id: &str) -> f64 {
    let mut h = Sha256::new();
    h.update(salt.as_bytes());
    h.update(&[SEPARATOR]);
    h.update(session_id.as_bytes());
    let d = h.finish();
    let x = u64::from_be_bytes(d[..8].try_into().expect("8 bytes")) >> 11;
    x as f64 * TWO_POW_MINUS_53
}

/// Index among the K - 1 other candidates of an explored session: min(floor(u / rate *
/// (K - 1)), K - 2); None when not explored (u >= rate, rate <= 0 or NaN, or K < 2).
#[allow(clippy::neg_cmp_op_on_partial_ord)] // NaN rate: not explored, as in Python
pub fn explored_index(u: f64, rate: f64, k: usize) -> Option<usize> {
    if k < 2 || !(rate > 0.0) || !(u < rate) {
        return None;
    }
    let j = (u / rate * (k - 1) as f64).floor();
    Some((j as usize).min(k - 2))
}

/// The binder's settings (the Python keyword arguments, the same defaults).
#[derive(Clone, Debug)]
pub struct Config {
    pub rate: f64,
    pub cap: f64,
    pub salt: String,
    /// cheapest first; None: the router's candidates
    pub ladder: Option<Vec<String>>,
    pub ttl_s: f64,
    pub max_sessions: usize,
    /// what the rules fall back to; None: the router's fallback candidate
    pub fallback_candidate: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config { rate: 0.05, cap: 0.10, salt: String::new(), ladder: None, ttl_s: 3600.0,
                 max_sessions: 100_000, fallback_candidate: None }
    }
}

/// The artifact's scenario rules (`router.json` `rules`), as `Router.route_by_rules`.
#[derive(Clone, Debug, Default)]
pub struct Rules {
    pub long_prompt_tokens: Option<f64>,
    pub long_prompt_candidate: Option<String>,
    pub task_candidate: HashMap<String, String>,
    pub default_candidate: Option<String>,
}

impl Rules {
    /// From the verified `router.json` of a loaded router (missing parts: None / empty).
    pub fn of(router: &Router) -> Result<Rules, Error> {
        let cfg = json::parse_bytes(&router.file("router.json")?)
            .map_err(|e| Error::new("bad_config", format!("router.json: {e}")))?;
        let r = cfg.get("rules");
        let s = |k: &str| r.and_then(|r| r.get(k)).and_then(Json::as_str).map(str::to_string);
        let task_candidate = r.and_then(|r| r.get("task_candidate")).and_then(Json::as_object)
            .map(|m| m.iter().filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string()))).collect())
            .unwrap_or_default();
        Ok(Rules {
            long_prompt_tokens: r.and_then(|r| r.get("long_prompt_tokens")).and_then(Json::as_f64),
            long_prompt_candidate: s("long_prompt_candidate"),
            task_candidate,
            default_candidate: s("default_candidate"),
        })
    }

    /// The rules' candidate (None: the rule names no candidate).
    pub fn choose(&self, length: f64, category: Option<&str>) -> Option<&str> {
        if let Some(lim) = self.long_prompt_tokens {
            if length > lim {
                return self.long_prompt_candidate.as_deref();
            }
        }
        if let Some(c) = category.and_then(|c| self.task_candidate.get(c)) {
            return Some(c);
        }
        self.default_candidate.as_deref()
    }
}

/// One turn's receipt: the ledger-v1 routing fields and what serving logs beside them.
#[derive(Clone, Debug)]
pub struct Receipt {
    /// position of `selected_model` on the binder's ladder
    pub selected: usize,
    pub binding_id: String,
    pub routing_source: &'static str,
    /// set on the first turn of a binding only
    pub propensity: Option<f64>,
    pub rebind_reason: Option<&'static str>,
    /// the fallback reason code of a rules-decided opening
    pub reason: Option<&'static str>,
    /// the router's answer on a decided opening
    pub decision: Option<Decision>,
    pub new_binding: bool,
    pub turn_index: i64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub openings: u64,
    pub explored: u64,
    pub sticky: u64,
    pub escalations: u64,
    pub fallback: u64,
    pub evicted_ttl: u64,
    pub evicted_lru: u64,
    pub reopened: u64,
    pub failures_unknown_session: u64,
}

#[derive(Clone, Debug)]
struct Session {
    rung: usize,    // ladder position of the current binding's candidate
    own: usize,     // ladder position of the router's (or rules') opening choice
    binding: u64,   // number of the current binding (0 = opening)
    prefix: String, // "<sid>/" or "<sid>/t<turn>/" when re-opened
    turns: i64,     // turns served
    last: f64,      // clock of the last turn
    pending: usize, // escalation steps reported since the last turn
    tick: u64,      // position in the LRU order
}

pub struct Binder {
    /// None: the artifact did not load (every opening: the fallback candidate)
    pub router: Option<Router>,
    rules: Option<Rules>,
    pub rate: f64,
    pub cap: f64,
    pub salt: String,
    pub ttl_s: f64,
    pub max_sessions: usize,
    pub fallback_candidate: String,
    pub ladder: Vec<String>,
    /// why every opening takes the rules, if it does
    pub reason: Option<&'static str>,
    rung: HashMap<String, usize>,
    /// router candidate column -> ladder position (None: off the ladder)
    column_rung: Vec<Option<usize>>,
    explore: bool,
    sessions: HashMap<String, Session>,
    order: BTreeMap<u64, String>, // LRU order: least recently used first
    tick: u64,
    pub counts: Counts,
    pub fallback_reasons: BTreeMap<&'static str, u64>,
}

impl Binder {
    /// A binder over `router` (None: it did not load; then `fallback_candidate` is needed).
    #[allow(clippy::neg_cmp_op_on_partial_ord)] // a NaN ttl_s is refused
    pub fn new(router: Option<Router>, cfg: Config) -> Result<Binder, Error> {
        if cfg.max_sessions < 1 || !(cfg.ttl_s > 0.0) {
            return Err(Error::new("bad_config", format!("binder: max_sessions={} must be >= 1 and ttl_s={} > 0",
                                                        cfg.max_sessions, cfg.ttl_s)));
        }
        let known: Vec<String> = router.as_ref().map(|r| r.candidates.clone()).unwrap_or_default();
        let fallback = cfg.fallback_candidate.clone()
            .or_else(|| router.as_ref().map(|r| r.candidates[r.fallback].clone()));
        let mut ladder = cfg.ladder.clone().unwrap_or_else(|| known.clone());
        let (rate, cap) = (cfg.rate, cfg.cap);
        let reason = if router.is_none() {
            if ladder.is_empty() {
                if let Some(f) = &fallback {
                    ladder = vec![f.clone()];
                }
            }
            Some(NOT_LOADED)
        } else if !(0.0..1.0).contains(&rate) || !(0.0..1.0).contains(&cap) {
            Some(BAD_RATE)
        } else if rate > cap {
            Some(RATE_ABOVE_CAP)
        } else {
            let mut seen = std::collections::HashSet::new();
            let dup = !ladder.iter().all(|c| seen.insert(c.as_str()));
            if ladder.is_empty() || dup || ladder.iter().any(|c| !known.contains(c)) {
                ladder = known.clone();
                Some(UNKNOWN_CANDIDATE)
            } else {
                None
            }
        };
        let Some(fallback_candidate) = fallback else {
            return Err(Error::new("bad_config", "binder: the router did not load and no fallback candidate was given \
                                                 (name the strongest model)"));
        };
        let mut rung = HashMap::new();
        for (j, c) in ladder.iter().enumerate() {
            rung.insert(c.clone(), j); // a name listed twice: its last position (Python's dict)
        }
        let column_rung = known.iter().map(|c| rung.get(c).copied()).collect();
        let rules = match &router {
            Some(r) => Some(Rules::of(r)?),
            None => None,
        };
        let explore = reason.is_none() && ladder.len() >= 2 && rate > 0.0;
        Ok(Binder { router, rules, rate, cap, salt: cfg.salt, ttl_s: cfg.ttl_s, max_sessions: cfg.max_sessions,
                    fallback_candidate, ladder, reason, rung, column_rung, explore,
                    sessions: HashMap::new(), order: BTreeMap::new(), tick: 0, counts: Counts::default(),
                    fallback_reasons: BTreeMap::new() })
    }

    /// Whether openings may be explored (no fallback reason, K >= 2, rate > 0).
    pub fn exploring(&self) -> bool {
        self.explore
    }

    /// Sessions held now.
    pub fn held(&self) -> usize {
        self.sessions.len()
    }

    /// The receipt of this turn of `session_id` at clock `now` (seconds): the opening
    /// decision on a session's first turn, the sticky binding after it, a new binding
    /// after an escalation. `text`, `category`, `prompt_tokens` are read on an opening only.
    pub fn bind(&mut self, session_id: &str, text: &str, category: Option<&str>, prompt_tokens: Option<f64>,
                turn_index: Option<i64>, now: f64) -> Receipt {
        self.bind_with(session_id, text, category, prompt_tokens, turn_index, now,
                       |router| router.route(text, category, prompt_tokens))
    }

    /// `bind` with the router's answer on an opening given by `route` (called at most
    /// once, only when the router decides): e.g. a decision already computed (benchmarks).
    #[allow(clippy::too_many_arguments)]
    pub fn bind_with(&mut self, session_id: &str, text: &str, category: Option<&str>, prompt_tokens: Option<f64>,
                     turn_index: Option<i64>, now: f64, route: impl FnOnce(&Router) -> Decision) -> Receipt {
        let turn_index = turn_index.filter(|t| *t >= 0); // a negative turn: as if not given
        let expired = match self.sessions.get(session_id) {
            None => return self.open(session_id, text, category, prompt_tokens, turn_index, now, route),
            Some(st) => now - st.last > self.ttl_s,
        };
        if expired {
            let st = self.sessions.remove(session_id).expect("held");
            self.order.remove(&st.tick);
            self.counts.evicted_ttl += 1;
            return self.open(session_id, text, category, prompt_tokens, turn_index, now, route);
        }
        self.tick += 1;
        let tick = self.tick;
        let top = self.ladder.len() - 1;
        let st = self.sessions.get_mut(session_id).expect("held");
        let key = self.order.remove(&st.tick).expect("ordered");
        self.order.insert(tick, key);
        st.tick = tick;
        st.last = now;
        let turn = st.turns;
        st.turns += 1;
        if st.pending > 0 {
            st.rung = (st.rung + st.pending).min(top);
            st.pending = 0;
            st.binding += 1;
            self.counts.escalations += 1;
            return Receipt { selected: st.rung, binding_id: format!("{}b{}", st.prefix, st.binding),
                             routing_source: HEURISTIC, propensity: Some(1.0), rebind_reason: Some(ESCALATION),
                             reason: None, decision: None, new_binding: true, turn_index: turn };
        }
        self.counts.sticky += 1;
        Receipt { selected: st.rung, binding_id: format!("{}b{}", st.prefix, st.binding), routing_source: STICKY,
                  propensity: None, rebind_reason: None, reason: None, decision: None, new_binding: false,
                  turn_index: turn }
    }

    /// A turn of `session_id` failed: its next turn escalates one step up the ladder.
    /// False when the session is unknown (never bound, or dropped) or already on the
    /// strongest candidate (counting the steps already reported).
    pub fn report_failure(&mut self, session_id: &str) -> bool {
        let top = self.ladder.len() - 1;
        match self.sessions.get_mut(session_id) {
            None => {
                self.counts.failures_unknown_session += 1;
                false
            }
            Some(st) if st.rung + st.pending >= top => false,
            Some(st) => {
                st.pending += 1;
                true
            }
        }
    }

    /// The router's (or the rules') own opening choice of a held session.
    pub fn router_choice(&self, session_id: &str) -> Option<&str> {
        self.sessions.get(session_id).map(|st| self.ladder[st.own].as_str())
    }

    /// pi_0(a | s) of an opening whose router choice is ladder position `own`.
    pub fn propensities(&self, own: usize) -> Vec<f64> {
        let k = self.ladder.len();
        (0..k).map(|c| match (self.explore, c == own) {
            (false, same) => same as u8 as f64,
            (true, true) => 1.0 - self.rate,
            (true, false) => self.rate / (k - 1) as f64,
        }).collect()
    }

    #[allow(clippy::too_many_arguments)]
    fn open(&mut self, sid: &str, text: &str, category: Option<&str>, tokens: Option<f64>,
            turn_index: Option<i64>, now: f64, route: impl FnOnce(&Router) -> Decision) -> Receipt {
        let reopened = matches!(turn_index, Some(t) if t > 0);
        let prefix = match turn_index {
            Some(t) if reopened => format!("{sid}/t{t}/"),
            _ => format!("{sid}/"),
        };
        let mut decision = None;
        let mut reason = self.reason;
        let own = match (reason, &self.router) {
            (None, Some(router)) => {
                let d = route(router);
                let col = self.column_rung[d.candidate];
                decision = Some(d);
                match col {
                    Some(r) => r,
                    None => {
                        reason = Some(UNKNOWN_CANDIDATE);
                        self.rules(text, category, tokens)
                    }
                }
            }
            _ => self.rules(text, category, tokens),
        };
        let (mut source, mut propensity, mut chosen) = (CLASSIFIER, 1.0, own);
        if let Some(r) = reason {
            source = if self.router.is_some() { HEURISTIC } else { FIXED };
            self.counts.fallback += 1;
            *self.fallback_reasons.entry(r).or_insert(0) += 1;
        } else if self.explore {
            let k = self.ladder.len();
            match explored_index(exploration_draw(&self.salt, sid), self.rate, k) {
                None => propensity = 1.0 - self.rate,
                Some(j) => {
                    // others = the ladder without own: position j, skipping own
                    chosen = if j < own { j } else { j + 1 };
                    source = EXPLORATION;
                    propensity = self.rate / (k - 1) as f64;
                    self.counts.explored += 1;
                }
            }
        }
        self.counts.openings += 1;
        if reopened {
            self.counts.reopened += 1;
        }
        // the least recently used first: drop the idle ones at the front
        while let Some((&t, key)) = self.order.first_key_value() {
            let last = self.sessions[key].last;
            if now - last <= self.ttl_s {
                break;
            }
            let key = self.order.remove(&t).expect("first");
            self.sessions.remove(&key);
            self.counts.evicted_ttl += 1;
        }
        self.tick += 1;
        let binding_id = format!("{prefix}b0");
        self.sessions.insert(sid.to_string(), Session {
            rung: chosen, own, binding: 0, prefix, turns: turn_index.map_or(1, |t| t + 1), last: now, pending: 0,
            tick: self.tick,
        });
        self.order.insert(self.tick, sid.to_string());
        while self.sessions.len() > self.max_sessions {
            let (_, key) = self.order.pop_first().expect("held");
            self.sessions.remove(&key);
            self.counts.evicted_lru += 1;
        }
        Receipt { selected: chosen, binding_id, routing_source: source, propensity: Some(propensity),
                  rebind_reason: None, reason, decision, new_binding: true, turn_index: turn_index.unwrap_or(0) }
    }

    /// The rules' choice kept on the ladder: the artifact's rules when it loaded, else (or
    /// when they name a candidate off the ladder) the fallback candidate, else the strongest.
    fn rules(&self, text: &str, category: Option<&str>, tokens: Option<f64>) -> usize {
        if let (Some(router), Some(rules)) = (&self.router, &self.rules) {
            let length = router.prompt_tokens(text, tokens);
            if let Some(&r) = rules.choose(length, category).and_then(|c| self.rung.get(c)) {
                return r;
            }
        }
        self.rung.get(&self.fallback_candidate).copied().unwrap_or(self.ladder.len() - 1)
    }

    /// The record of one bind (canonical JSON object; docs/specs/binder.md, event format).
    pub fn bind_record(&self, session_id: &str, r: &Receipt) -> Json {
        let mut m = BTreeMap::new();
        let s = |x: &str| Json::Str(x.to_string());
        let opt = |x: Option<&str>| x.map_or(Json::Null, |x| Json::Str(x.to_string()));
        m.insert("op".into(), s("bind"));
        m.insert("session_id".into(), s(session_id));
        m.insert("selected_model".into(), s(&self.ladder[r.selected]));
        m.insert("binding_id".into(), s(&r.binding_id));
        m.insert("routing_source".into(), s(r.routing_source));
        m.insert("propensity".into(), r.propensity.map_or(Json::Null, |p| Json::Num(Number { value: p, int: None })));
        m.insert("rebind_reason".into(), opt(r.rebind_reason));
        m.insert("reason".into(), opt(r.reason));
        let cand = match (&r.decision, &self.router) {
            (Some(d), Some(router)) => Some(router.candidates[d.candidate].as_str()),
            _ => None,
        };
        m.insert("candidate".into(), opt(cand));
        m.insert("new_binding".into(), Json::Bool(r.new_binding));
        m.insert("turn_index".into(), int(r.turn_index));
        Json::Obj(m)
    }

    /// Counts, sessions held and the configuration's outcome (the `stats` event's record).
    pub fn stats_record(&self) -> Json {
        let c = &self.counts;
        let mut m = BTreeMap::new();
        for (k, v) in [("openings", c.openings), ("explored", c.explored), ("sticky", c.sticky),
                       ("escalations", c.escalations), ("fallback", c.fallback), ("evicted_ttl", c.evicted_ttl),
                       ("evicted_lru", c.evicted_lru), ("reopened", c.reopened),
                       ("failures_unknown_session", c.failures_unknown_session), ("held", self.held() as u64)] {
            m.insert(k.to_string(), int(v as i64));
        }
        m.insert("op".into(), Json::Str("stats".into()));
        m.insert("reason".into(), self.reason.map_or(Json::Null, |r| Json::Str(r.into())));
        m.insert("exploring".into(), Json::Bool(self.explore));
        m.insert("ladder".into(), Json::Arr(self.ladder.iter().map(|c| Json::Str(c.clone())).collect()));
        m.insert("fallback_reasons".into(), Json::Obj(self.fallback_reasons.iter()
            .map(|(k, v)| (k.to_string(), int(*v as i64))).collect()));
        Json::Obj(m)
    }
}

fn int(x: i64) -> Json {
    Json::Num(Number { value: x as f64, int: Some(x.to_string()) })
}

/// One event of the replay format.
pub enum Event {
    Bind { session_id: String, text: String, category: Option<String>, prompt_tokens: Option<f64>,
           turn_index: Option<i64>, now: Option<f64> },
    Fail { session_id: String, now: Option<f64> },
    Stats { now: Option<f64> },
}

impl Event {
    pub fn parse(v: &Json) -> Result<Event, Error> {
        let bad = |m: String| Error::new("bad_input", m);
        if v.as_object().is_none() {
            return Err(bad("an event must be a JSON object".into()));
        }
        let op = v.get("op").and_then(Json::as_str).ok_or_else(|| bad("\"op\" must be a string".into()))?;
        let now = match v.get("now") {
            None | Some(Json::Null) => None,
            Some(Json::Num(n)) => Some(n.value),
            Some(_) => return Err(bad("\"now\" must be a number or null".into())),
        };
        let sid = || v.get("session_id").and_then(Json::as_str).map(str::to_string)
            .ok_or_else(|| bad("\"session_id\" must be a string".into()));
        match op {
            "bind" => {
                let text = match v.get("text") {
                    None => String::new(),
                    Some(Json::Str(s)) => s.clone(),
                    Some(_) => return Err(bad("\"text\" must be a string".into())),
                };
                let category = match v.get("category") {
                    None | Some(Json::Null) => None,
                    Some(Json::Str(s)) => Some(s.clone()),
                    Some(_) => return Err(bad("\"category\" must be a string or null".into())),
                };
                let prompt_tokens = match v.get("prompt_tokens") {
                    None | Some(Json::Null) => None,
                    Some(Json::Num(n)) => Some(n.value),
                    Some(_) => return Err(bad("\"prompt_tokens\" must be a number or null".into())),
                };
                let turn_index = match v.get("turn_index") {
                    None | Some(Json::Null) => None,
                    Some(x) => Some(x.as_i64().ok_or_else(|| bad("\"turn_index\" must be an integer or null".into()))?),
                };
                Ok(Event::Bind { session_id: sid()?, text, category, prompt_tokens, turn_index, now })
            }
            "fail" => Ok(Event::Fail { session_id: sid()?, now }),
            "stats" => Ok(Event::Stats { now }),
            other => Err(bad(format!("unknown op {other:?} (bind | fail | stats)"))),
        }
    }
}

/// Run the events in order (the clock: each event's `now`, else the last one, from 0.0);
/// one record per event: a bind's receipt, a fail's `escalated`, the stats.
pub fn replay(binder: &mut Binder, events: &[Event], mut emit: impl FnMut(Json)) {
    let mut clock = 0.0;
    for e in events {
        match e {
            Event::Bind { session_id, text, category, prompt_tokens, turn_index, now } => {
                clock = now.unwrap_or(clock);
                let r = binder.bind(session_id, text, category.as_deref(), *prompt_tokens, *turn_index, clock);
                emit(binder.bind_record(session_id, &r));
            }
            Event::Fail { session_id, now } => {
                clock = now.unwrap_or(clock);
                let ok = binder.report_failure(session_id);
                let mut m = BTreeMap::new();
                m.insert("op".into(), Json::Str("fail".into()));
                m.insert("session_id".into(), Json::Str(session_id.clone()));
                m.insert("escalated".into(), Json::Bool(ok));
                emit(Json::Obj(m));
            }
            Event::Stats { now } => {
                clock = now.unwrap_or(clock);
                emit(binder.stats_record());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_draw_is_sha256_top_53_bits() {
        // hashlib.sha256(b"\x1f").digest()[:8] (empty salt, empty id)
        let d = crate::sha256::sha256(&[0x1f]);
        let want = (u64::from_be_bytes(d[..8].try_into().unwrap()) >> 11) as f64 / 9_007_199_254_740_992.0;
        assert_eq!(exploration_draw("", "").to_bits(), want.to_bits());
        assert!((0.0..1.0).contains(&exploration_draw("salt", "s1")));
        assert_ne!(exploration_draw("a", "b"), exploration_draw("ab", ""));
    }

    #[test]
    fn explored_index_splits_the_rate_evenly() {
        assert_eq!(explored_index(0.5, 0.1, 2), None);
        assert_eq!(explored_index(0.0, 0.0, 2), None);
        assert_eq!(explored_index(0.01, 0.1, 1), None);
        assert_eq!(explored_index(0.09999, 0.1, 2), Some(0));
        assert_eq!(explored_index(0.049, 0.1, 3), Some(0));
        assert_eq!(explored_index(0.051, 0.1, 3), Some(1));
        assert_eq!(explored_index(0.1 - 1e-17, 0.1, 3), Some(1));
        assert_eq!(explored_index(0.0, f64::NAN, 3), None);
    }

    fn unloaded(ladder: &[&str], max_sessions: usize, ttl_s: f64) -> Binder {
        Binder::new(None, Config { ladder: Some(ladder.iter().map(|s| s.to_string()).collect()),
                                   fallback_candidate: Some("big".into()), max_sessions, ttl_s,
                                   ..Config::default() }).unwrap()
    }

    #[test]
    fn no_router_binds_the_fallback_sticky_and_escalates_to_the_top() {
        let mut b = unloaded(&["small", "mid", "big"], 10, 100.0);
        assert_eq!(b.reason, Some(NOT_LOADED));
        let r = b.bind("s", "hi", None, None, None, 0.0);
        assert_eq!((b.ladder[r.selected].as_str(), r.routing_source, r.propensity, r.reason),
                   ("big", FIXED, Some(1.0), Some(NOT_LOADED)));
        assert_eq!(r.binding_id, "s/b0");
        assert!(!b.report_failure("s")); // already the strongest
        assert!(!b.report_failure("nope"));
        assert_eq!(b.counts.failures_unknown_session, 1);
        let r = b.bind("s", "", None, None, None, 1.0);
        assert_eq!((r.routing_source, r.propensity, r.turn_index), (STICKY, None, 1));
        assert!(Binder::new(None, Config::default()).is_err()); // no fallback named
    }

    #[test]
    fn escalation_steps_up_once_per_failure_and_stops_at_the_strongest() {
        let mut b = Binder::new(None, Config { ladder: Some(vec!["a".into(), "b".into(), "c".into()]),
                                               fallback_candidate: Some("a".into()), ..Config::default() }).unwrap();
        let r = b.bind("s", "", None, None, None, 0.0);
        assert_eq!(b.ladder[r.selected], "a");
        assert!(b.report_failure("s"));
        let r = b.bind("s", "", None, None, None, 1.0);
        assert_eq!((b.ladder[r.selected].as_str(), r.routing_source, r.rebind_reason, r.binding_id.as_str()),
                   ("b", HEURISTIC, Some(ESCALATION), "s/b1"));
        assert!(b.report_failure("s"));
        assert!(!b.report_failure("s")); // the pending step already reaches the top
        let r = b.bind("s", "", None, None, None, 2.0);
        assert_eq!((b.ladder[r.selected].as_str(), r.binding_id.as_str()), ("c", "s/b2"));
        assert_eq!(b.router_choice("s"), Some("a"));
    }

    #[test]
    fn memory_is_bounded_by_lru_and_ttl() {
        let mut b = unloaded(&["big"], 3, 10.0);
        for (i, s) in ["a", "b", "c"].iter().enumerate() {
            b.bind(s, "", None, None, None, i as f64);
        }
        b.bind("a", "", None, None, None, 3.0); // a is now the most recent: b goes first
        b.bind("d", "", None, None, None, 4.0);
        assert_eq!((b.held(), b.counts.evicted_lru), (3, 1));
        assert!(b.router_choice("b").is_none() && b.router_choice("a").is_some());
        // 20 s later all three are idle past the TTL: swept at the next opening
        let r = b.bind("a", "", None, None, Some(5), 24.0);
        assert_eq!((r.binding_id.as_str(), r.turn_index, r.new_binding), ("a/t5/b0", 5, true));
        assert_eq!((b.held(), b.counts.evicted_ttl, b.counts.reopened), (1, 3, 1));
        assert_eq!(b.bind("a", "", None, None, None, 25.0).turn_index, 6);
    }
}
