//! Load a demand artifact (verified) and answer pre-dispatch hints, as
//! `replaylab.runtime.DemandPredictor` does with the exported (frozen) corrections
//! (docs/specs/demand-scorer.md is the specification).
//!
//! Load: manifest (kind `demand`, every file's size and sha256, content hash, validity)
//! -> the feature schema, outputs, calibration and fallback sections -> `trees.safetensors`.
//! A hint: request JSON object -> feature row (section 4 of the spec; the fields read by
//! `demand::request`) -> tree walk (`demand::trees`) -> sort, inverse scale, + prompt, cap
//! clip; base band; conformal band of the request's cell (section 6). Online
//! recalibration is not implemented.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use crate::demand::trees::Trees;
use crate::util::error::Error;
use crate::demand::request::{epoch_ms, lenient, number, py_str, request_id, BadRequest};
use crate::util::json::Json;
use crate::artifact::manifest::{self, Store, Verified};
use crate::util::timefmt;

pub const KIND: &str = "demand";
pub const TREES_FILE: &str = "trees.safetensors";
pub const HISTORY_COUNTS: [&str; 3] = ["hist_turns_dispatched", "hist_turns_ended", "hist_turns_with_usage"];
pub const HISTORY: [&str; 8] = ["hist_turns_dispatched", "hist_turns_ended", "hist_turns_with_usage",
                                "hist_turns_censored", "hist_completion_mean", "hist_completion_ewma",
                                "hist_last_completion", "hist_ms_since_last_end"];
const NONE_CELL: &str = "<none>";
/// the online-correction key of a request served the global correction (runtime.online)
const GLOBAL_CELL: &str = "<global>";
/// the cell key when the artifact has no group columns (runtime.demand `_cell`)
const NO_GROUPS_CELL: &str = "*";
const MS_PER_HOUR: i128 = 3_600_000;
const MS_PER_DAY: i128 = 86_400_000;

#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    Numeric,
    Category(HashMap<String, usize>),
    /// `hist_*`: (value of a first turn, is one of the three counts, is `hist_turns_censored`)
    History(f64, bool, bool),
    Hour,
    DayOfWeek,
}

#[derive(Clone, Debug)]
pub struct Feature {
    pub name: String,
    pub op: Op,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scale {
    Log1p,
    Linear,
}

impl Scale {
    #[inline]
    fn forward(self, out: f64) -> f64 {
        let out = out.max(0.0);
        match self {
            Scale::Log1p => out.ln_1p(),
            Scale::Linear => out,
        }
    }
    #[inline]
    fn inverse(self, v: f64) -> f64 {
        match self {
            Scale::Log1p => v.exp_m1().max(0.0),
            Scale::Linear => v.max(0.0),
        }
    }
}

/// One hint (the golden and CLI fields of `DemandHint`).
#[derive(Clone, Debug, PartialEq)]
pub struct Hint {
    pub p50: f64,
    pub p90: f64,
    pub lo: f64,
    pub hi: f64,
    /// the coverage level of [lo, hi] (None for a fallback: no coverage claimed)
    pub interval: Option<f64>,
    pub fallback: bool,
    pub reason: Option<&'static str>,
    pub model_version: String,
    pub request_id: Option<String>,
    /// the request's conformal cell key (`a|b|c`, missing -> `<none>`) and the correction
    /// it gets (None: unbounded); the served correction's key is `cell` or `<global>`
    pub cell: Option<String>,
    pub correction: Option<f64>,
    pub correction_cell: Option<String>,
    /// the feature row and the raw scores (empty when the request could not be encoded)
    pub features: Vec<f64>,
    pub raw: Vec<f64>,
}

pub struct Demand {
    pub features: Vec<Feature>,
    pub quantiles: Vec<f64>,
    pub i50: usize,
    pub i90: usize,
    pub scale: Scale,
    pub clip_to_cap: bool,
    pub level: f64,
    pub group_columns: Vec<String>,
    pub corrections: BTreeMap<String, Option<f64>>,
    pub global_correction: Option<f64>,
    pub clipped_band: bool,
    pub default_max_tokens: f64,
    pub fallback_name: String,
    /// `<version>+<first 12 hex of content_hash>`, as the Python runtime reports it
    pub version: String,
    pub created_ms: i64,
    pub trees: Trees,
    pub manifest: Verified,
}

fn schema(m: String) -> Error {
    Error::new("feature_schema", m)
}

fn outputs(m: String) -> Error {
    Error::new("outputs", m)
}

impl Demand {
    /// Verify and load `dir`; `now` in seconds since the Unix epoch (validity period).
    pub fn load(dir: &Path, now: f64) -> Result<Demand, Error> {
        let mut store = Store::new(dir)?;
        let m = manifest::verify(&mut store, "", KIND, now)?;
        let j = &m.json;
        let mut features = Vec::new();
        for f in j.get("features").and_then(Json::as_array).expect("verified") {
            let name = f.get("name").and_then(Json::as_str).ok_or_else(|| schema("a feature without a name".into()))?;
            let kind = f.get("kind").and_then(Json::as_str).unwrap_or("");
            let source = f.get("source").and_then(Json::as_str).unwrap_or("");
            let op = match (source, kind) {
                ("calendar", _) if name == "hour_utc" => Op::Hour,
                ("calendar", _) if name == "day_of_week" => Op::DayOfWeek,
                ("history", "numeric" | "bool") if HISTORY.contains(&name) => {
                    let first = match f.get("first_turn") {
                        None | Some(Json::Null) => f64::NAN,
                        Some(x) => x.as_f64().ok_or_else(|| schema(format!("{name}: first_turn")))?,
                    };
                    Op::History(first, HISTORY_COUNTS.contains(&name), name == "hist_turns_censored")
                }
                ("request", "numeric" | "bool") => Op::Numeric,
                ("request", "category") => {
                    let vocab = f.get("vocabulary").and_then(Json::as_array)
                        .ok_or_else(|| schema(format!("{name}: no vocabulary")))?;
                    let mut index = HashMap::new();
                    for (i, v) in vocab.iter().enumerate() {
                        let v = v.as_str().ok_or_else(|| schema(format!("{name}: a vocabulary entry is not a string")))?;
                        if index.insert(v.to_string(), i).is_some() {
                            return Err(schema(format!("{name}: duplicate vocabulary entry {v:?}")));
                        }
                    }
                    Op::Category(index)
                }
                _ => return Err(schema(format!("{name}: kind {kind:?} / source {source:?} not supported"))),
            };
            if features.iter().any(|x: &Feature| x.name == name) {
                return Err(schema(format!("duplicate feature {name:?}")));
            }
            features.push(Feature { name: name.to_string(), op });
        }
        if features.is_empty() {
            return Err(schema("no features".into()));
        }
        let out = j.get("outputs").expect("verified");
        let cal = j.get("calibration").expect("verified");
        let quantiles: Vec<f64> = out.get("quantiles").and_then(Json::as_array)
            .and_then(|a| a.iter().map(Json::as_f64).collect()).ok_or_else(|| outputs("outputs.quantiles".into()))?;
        if quantiles.windows(2).any(|w| w[0] >= w[1]) {
            return Err(outputs(format!("quantiles {quantiles:?} not ascending")));
        }
        let pos = |q: f64| quantiles.iter().position(|&x| x == q).ok_or_else(|| outputs(format!("no {q} quantile")));
        let (i50, i90) = (pos(0.5)?, pos(0.9)?);
        let scale = match out.get("scale").and_then(Json::as_str) {
            Some("log1p") => Scale::Log1p,
            Some("linear") => Scale::Linear,
            s => return Err(outputs(format!("scale {s:?}"))),
        };
        let clip_to_cap = out.get("clip_to_cap").and_then(Json::as_bool).unwrap_or(true);
        let level = cal.get("level").and_then(Json::as_f64).filter(|l| *l > 0.0 && *l < 1.0)
            .ok_or_else(|| outputs("calibration.level".into()))?;
        let group_columns = cal.get("group_columns").and_then(Json::as_array)
            .and_then(|a| a.iter().map(|x| x.as_str().map(str::to_string)).collect::<Option<Vec<_>>>())
            .ok_or_else(|| outputs("calibration.group_columns".into()))?;
        let opt_f = |x: &Json| -> Result<Option<f64>, Error> {
            if x.is_null() { Ok(None) } else { x.as_f64().map(Some).ok_or_else(|| outputs("a correction is not a number".into())) }
        };
        let mut corrections = BTreeMap::new();
        for (k, v) in cal.get("corrections").and_then(Json::as_object).ok_or_else(|| outputs("calibration.corrections".into()))? {
            corrections.insert(k.clone(), opt_f(v)?);
        }
        let global_correction = opt_f(cal.get("global_correction").ok_or_else(|| outputs("calibration.global_correction".into()))?)?;
        let clipped_band = match cal.get("base_band").and_then(Json::as_str).unwrap_or("clipped") {
            "clipped" => true,
            "unclipped" => false,
            b => return Err(outputs(format!("calibration.base_band {b:?}"))),
        };
        let fb = j.get("fallback").expect("verified");
        let default_max_tokens = fb.get("default_max_tokens").and_then(Json::as_i64).filter(|x| *x >= 1)
            .ok_or_else(|| outputs("fallback.default_max_tokens".into()))? as f64;
        let fallback_name = fb.get("name").and_then(Json::as_str).unwrap_or("max_tokens_cap").to_string();
        let created = timefmt::parse_iso(j.get("created_at").and_then(Json::as_str).expect("verified"), "created_at")?;
        let version = format!("{}+{}", j.get("version").and_then(Json::as_str).expect("verified"),
                              &m.content_hash().trim_start_matches("sha256:")[..12]);
        let bytes = m.bytes(TREES_FILE).map_err(|_| Error::new("trees_absent",
            format!("{TREES_FILE} is not listed in the manifest (an artifact exported before the flat trees: re-export it)")))?;
        let trees = Trees::parse(&bytes, features.len(), &quantiles)?;
        Ok(Demand { features, quantiles, i50, i90, scale, clip_to_cap, level, group_columns, corrections,
                    global_correction, clipped_band, default_max_tokens, fallback_name, version,
                    created_ms: (created * 1000.0) as i64, trees, manifest: m })
    }

    /// The verified bytes of a listed file.
    pub fn file(&self, name: &str) -> Result<std::sync::Arc<Vec<u8>>, Error> {
        self.manifest.bytes(name)
    }

    /// `_assemble`: the feature row of a request (the projection's encoding).
    fn assemble(&self, r: &BTreeMap<String, Json>, now_ms: i64, row: &mut Vec<f64>) -> Result<(), BadRequest> {
        row.clear();
        let has_history = HISTORY.iter().any(|h| r.contains_key(*h));
        let mut max_count = 0.0f64;
        if has_history {
            let mut first = true;
            for h in HISTORY_COUNTS {
                let v = number(r.get(h), 0.0)?;
                // Python's max(): the first of equal values, a NaN never replaces
                if first || v > max_count {
                    max_count = v;
                }
                first = false;
            }
        }
        let mut ts: Option<i128> = None;
        for f in &self.features {
            let v = match &f.op {
                Op::Numeric => number(r.get(&f.name), f64::NAN)?,
                Op::Category(index) => match r.get(&f.name) {
                    None | Some(Json::Null) => f64::NAN,
                    Some(Json::Str(s)) => index.get(s.as_str()).map_or(f64::NAN, |&c| c as f64), // no copy
                    Some(v) => py_str(v)?.and_then(|s| index.get(&s).map(|&c| c as f64)).unwrap_or(f64::NAN),
                },
                Op::History(first, is_count, is_censored) => match r.get(&f.name) {
                    Some(v) => number(Some(v), f64::NAN)?,
                    None if !has_history => *first,
                    None if *is_count => max_count,
                    None => if *is_censored { 0.0 } else { f64::NAN },
                },
                Op::Hour | Op::DayOfWeek => {
                    let t = match ts {
                        Some(t) => t,
                        None => *ts.insert(epoch_ms(r.get("timestamp"), now_ms)?),
                    };
                    if f.op == Op::Hour {
                        t.div_euclid(MS_PER_HOUR).rem_euclid(24) as f64
                    } else {
                        (t.div_euclid(MS_PER_DAY) + 3).rem_euclid(7) as f64 // 1970-01-01 was a Thursday
                    }
                }
            };
            row.push(v);
        }
        Ok(())
    }

    /// `_cell`: the conformal cell key ('a|b|c', missing -> '<none>'; no columns: '*').
    fn cell(&self, r: &BTreeMap<String, Json>) -> Result<String, BadRequest> {
        if self.group_columns.is_empty() {
            return Ok(NO_GROUPS_CELL.to_string());
        }
        let mut key = String::with_capacity(64);
        for (i, c) in self.group_columns.iter().enumerate() {
            if i > 0 {
                key.push('|');
            }
            match r.get(c) {
                None | Some(Json::Null) => key.push_str(NONE_CELL),
                Some(Json::Str(s)) => key.push_str(s),
                Some(v) => key.push_str(py_str(v)?.as_deref().unwrap_or(NONE_CELL)),
            }
        }
        Ok(key)
    }

    /// The documented conservative baseline (`FallbackBaseline.hint`).
    pub fn fallback(&self, r: Option<&BTreeMap<String, Json>>, reason: &'static str) -> Hint {
        let get = |k: &str| r.and_then(|r| r.get(k));
        let mut prompt = lenient(get("prompt_tokens"));
        let mut cap = lenient(get("max_tokens"));
        if !prompt.is_finite() || prompt < 0.0 {
            prompt = 0.0;
        }
        if !cap.is_finite() || cap < 0.0 {
            cap = self.default_max_tokens;
        }
        let top = prompt + cap;
        Hint { p50: top, p90: top, lo: prompt, hi: top, interval: None, fallback: true, reason: Some(reason),
               model_version: format!("baseline:{}", self.fallback_name), request_id: request_id(r),
               cell: None, correction: None, correction_cell: None, features: Vec::new(), raw: Vec::new() }
    }

    /// One request's hint. `now_ms`: the clock for a request without `timestamp`.
    /// (The artifact's validity was checked at load; a long-lived caller reloads.)
    /// `cell` / `correction` are set whenever the cell key is readable, fallback or not
    /// (what golden.json records); `features` / `raw` whenever the row could be encoded.
    pub fn hint(&self, request: &Json, now_ms: i64) -> Hint {
        let Some(r) = request.as_object() else {
            return self.fallback(None, "bad_request");
        };
        let cell = self.cell(r).ok();
        let correction = cell.as_ref().and_then(|c| match self.corrections.get(c) {
            Some(q) => *q,
            None => self.global_correction,
        });
        let mut h = self.model_hint(r, now_ms, cell.as_deref());
        (h.cell, h.correction) = (cell, correction);
        h
    }

    fn model_hint(&self, r: &BTreeMap<String, Json>, now_ms: i64, cell: Option<&str>) -> Hint {
        let mut row = Vec::with_capacity(self.features.len());
        if self.assemble(r, now_ms, &mut row).is_err() {
            return self.fallback(Some(r), "bad_request");
        }
        let raw = self.trees.predict(&row);
        let encoded = |mut h: Hint, row: Vec<f64>, raw: Vec<f64>| {
            (h.features, h.raw) = (row, raw);
            h
        };
        let p = match number(r.get("prompt_tokens"), f64::NAN) {
            Err(BadRequest) => return self.fallback(Some(r), "bad_request"),
            Ok(p) if !p.is_finite() || p < 0.0 => {
                return encoded(self.fallback(Some(r), "missing_prompt_tokens"), row, raw);
            }
            Ok(p) => p,
        };
        let mut cap = f64::NAN;
        if self.clip_to_cap {
            match number(r.get("max_tokens"), f64::NAN) {
                Err(BadRequest) => return self.fallback(Some(r), "bad_request"),
                Ok(c) => cap = if c >= 0.0 { c } else { f64::NAN },
            }
        }
        let Some(cell) = cell else {
            return self.fallback(Some(r), "bad_request"); // a group column holding an array or object
        };
        let (q, key) = match self.corrections.get(cell) {
            Some(q) => (*q, cell),
            None => (self.global_correction, GLOBAL_CELL),
        };
        let Some(q) = q.filter(|q| *q != f64::INFINITY) else {
            return encoded(self.fallback(Some(r), "uncertain"), row, raw); // too few calibration rows
        };
        let (total, blo, bhi) = total_and_band(&raw, p, cap, self.scale, self.clipped_band);
        let (lo, hi) = conformal_band(blo, bhi, p, q, cap, self.scale);
        Hint { p50: total[self.i50], p90: total[self.i90], lo, hi, interval: Some(self.level), fallback: false,
               reason: None, model_version: self.version.clone(), request_id: request_id(Some(r)),
               cell: None, correction: Some(q), correction_cell: Some(key.to_string()), features: row, raw }
    }
}

#[inline]
fn clip(x: f64, prompt: f64, cap: f64) -> f64 {
    let hi = if cap.is_nan() { f64::INFINITY } else { prompt + cap }; // cap NaN = no upper bound
    x.max(prompt).min(hi)
}

/// `demand_math.total_and_band_row`: (clipped quantiles, base band lo, hi).
pub fn total_and_band(raw: &[f64], prompt: f64, cap: f64, scale: Scale, clipped_band: bool) -> (Vec<f64>, f64, f64) {
    let mut sorted = raw.to_vec();
    sorted.sort_by(f64::total_cmp); // raw scores are never NaN
    let unclipped: Vec<f64> = sorted.iter().map(|&v| prompt + scale.inverse(v)).collect();
    let total: Vec<f64> = unclipped.iter().map(|&x| clip(x, prompt, cap)).collect();
    let band = if clipped_band { &total } else { &unclipped };
    let (lo, hi) = (band[0], band[band.len() - 1]);
    (total, lo, hi)
}

/// `demand_math.conformal_band_row`: the calibrated (lo, hi) from the base band and correction q.
pub fn conformal_band(lo: f64, hi: f64, prompt: f64, q: f64, cap: f64, scale: Scale) -> (f64, f64) {
    let mut glo = scale.forward(lo - prompt) - q;
    let mut ghi = scale.forward(hi - prompt) + q;
    if glo > ghi {
        let mid = (glo + ghi) / 2.0; // an inside-out interval collapses to its midpoint
        glo = mid;
        ghi = mid;
    }
    (clip(prompt + scale.inverse(glo), prompt, cap), clip(prompt + scale.inverse(ghi), prompt, cap))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn band_arithmetic() {
        // linear scale: raw sorted, + prompt, clipped to [prompt, prompt + cap]
        let (t, lo, hi) = total_and_band(&[30.0, -5.0, 10.0], 100.0, 20.0, Scale::Linear, false);
        assert_eq!(t, vec![100.0, 110.0, 120.0]);
        assert_eq!((lo, hi), (100.0, 130.0)); // unclipped band
        let (t, _, hi) = total_and_band(&[30.0, -5.0, 10.0], 100.0, f64::NAN, Scale::Linear, true);
        assert_eq!((t[2], hi), (130.0, 130.0));
        // an inside-out band (negative correction) collapses to its midpoint
        assert_eq!(conformal_band(110.0, 114.0, 100.0, -3.0, f64::NAN, Scale::Linear), (112.0, 112.0));
        assert_eq!(conformal_band(110.0, 114.0, 100.0, 1.0, 12.0, Scale::Linear), (109.0, 112.0));
    }
}
