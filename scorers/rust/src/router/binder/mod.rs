//! Session binder (docs/specs/binder.md): sticky, session-scoped bindings over a loaded
//! [`Router`], the same as `replaylab.runtime.binder.SessionBinder` (Python), receipt for
//! receipt.
//!
//! The opening turn of a session is decided once (the router's choice, or with
//! exploration another candidate drawn from SHA-256(salt || 0x1f || session id), draw.rs); later
//! turns reuse the binding; a reported failure moves the session one step up the ladder
//! on its next turn. A router that did not load, a bad or capped rate, or a ladder naming
//! an unknown candidate put every opening on the artifact's rules (reason codes). At most
//! `max_sessions` sessions are held (least recently used evicted first), and a session
//! idle longer than `ttl_s` is dropped. The clock is passed in (`now`, seconds).
//!
//! [`replay()`] (replay.rs) runs the JSONL event format (`{"op": "bind" | "fail" | "stats", ...}`) the
//! Python `replay_events` runs too, one canonical JSON record per event.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::util::error::Error;
use crate::util::json::{Json, Number};
use crate::router::{Decision, Router};

pub mod draw;
pub mod replay;
pub mod rules;

pub use draw::{exploration_draw, explored_index, SEPARATOR};
pub use replay::{replay, Event};
pub use rules::Rules;

pub const SPEC_VERSION: &str = "1";

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
    /// None: the artifact did not load (every opening: the fallback candidate); shared
    /// (Arc): binders of the C ABI share one loaded router handle
    pub router: Option<Arc<Router>>,
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
    pub fn new(router: Option<Router>, cfg: Config) -> Result<Binder, Error> {
        Binder::shared(router.map(Arc::new), cfg)
    }

    /// `new` over a router shared with other holders (the C ABI's `rl_binder_new`).
    #[allow(clippy::neg_cmp_op_on_partial_ord)] // a NaN ttl_s is refused
    pub fn shared(router: Option<Arc<Router>>, cfg: Config) -> Result<Binder, Error> {
        if let Some(r) = router.as_ref() {
            r.text_encoder().map_err(|e| Error::new("bad_config", format!("binder: openings are routed from \
                                                                          their text; {}", e.message)))?;
        }
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
                       |router| router.route(text, category, prompt_tokens)
                           .expect("the binder's router routes text: Binder::shared refuses the MiniLM tier"))
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

#[cfg(test)]
mod tests {
    use super::*;

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
