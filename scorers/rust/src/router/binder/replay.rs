//! The binder's replay format, as Python's `replaylab.runtime.binder.replay_events`: JSONL
//! events (`{"op": "bind" | "fail" | "stats", ...}`) in order, one canonical JSON record per
//! event (`replaylab-route bind`).

use std::collections::BTreeMap;

use super::Binder;
use crate::util::error::Error;
use crate::util::json::Json;

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
