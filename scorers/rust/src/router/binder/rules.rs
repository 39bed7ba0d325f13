//! The artifact's scenario rules (`router.json` `rules`): where the binder opens a session
//! when the router cannot decide it (not loaded, a bad rate, an unknown candidate).

use std::collections::HashMap;

use crate::router::Router;
use crate::util::error::Error;
use crate::util::json::{self, Json};

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
