//! The demand artifact's golden vectors, checked here (docs/specs/demand-scorer.md section 7),
//! and a hint as one JSON line.
//!
//! Per case of `golden.json` (kind "demand"), the hint is recomputed with the clock at
//! the manifest's `created_at` (as the export computed it) and compared:
//! - `features`: the feature row, equal value for value (null = NaN);
//! - `raw`: the per-quantile raw scores, |got - expected| <= `raw_abs` (0: bit for bit);
//! - `hint_p50`, `hint_p90`, `hint_lo`, `hint_hi`: within `hint_abs` tokens and `hint_rel`
//!   relative to max(|expected|, 1) (the Python runtime's bounds);
//! - `hint_fallback`, `fallback_reason`, `cell`, `correction`: equal.

use std::collections::BTreeMap;

use crate::demand::{Demand, Hint};
use crate::demand::trees::Trees;
use crate::util::error::Error;
use crate::util::json::{self, py_float_repr, write_str, Json, Number};

fn num(x: f64) -> Json {
    if x.is_finite() { Json::Num(Number { value: x, int: None }) } else { Json::Null }
}

fn int(x: usize) -> Json {
    Json::Num(Number { value: x as f64, int: Some(x.to_string()) })
}

fn push_f(s: &mut String, x: f64) {
    s.push_str(&if x.is_finite() { py_float_repr(x) } else { "null".into() });
}

fn push_opt_str(s: &mut String, x: Option<&str>) {
    match x {
        Some(v) => write_str(s, v),
        None => s.push_str("null"),
    }
}

/// One hint as a JSON object on one line (Python float reprs; NaN / None -> null).
/// explain: also the feature row, the raw scores and each tree's leaf (its index within
/// the tree, as LightGBM's `pred_leaf`; empty when the row could not be encoded).
pub fn hint_line(h: &Hint, explain: Option<&Trees>) -> String {
    let mut s = String::with_capacity(320);
    s.push_str("{\"request_id\":");
    push_opt_str(&mut s, h.request_id.as_deref());
    for (k, v) in [("hint_p50", h.p50), ("hint_p90", h.p90), ("hint_lo", h.lo), ("hint_hi", h.hi)] {
        s.push_str(",\"");
        s.push_str(k);
        s.push_str("\":");
        push_f(&mut s, v);
    }
    s.push_str(",\"hint_interval\":");
    push_f(&mut s, h.interval.unwrap_or(f64::NAN));
    s.push_str(",\"hint_fallback\":");
    s.push_str(if h.fallback { "true" } else { "false" });
    s.push_str(",\"fallback_reason\":");
    push_opt_str(&mut s, h.reason);
    s.push_str(",\"hint_model_version\":");
    write_str(&mut s, &h.model_version);
    s.push_str(",\"cell\":");
    push_opt_str(&mut s, h.cell.as_deref());
    s.push_str(",\"correction_cell\":");
    push_opt_str(&mut s, h.correction_cell.as_deref());
    s.push_str(",\"correction\":");
    push_f(&mut s, h.correction.unwrap_or(f64::NAN));
    if let Some(trees) = explain {
        s.push_str(",\"leaves\":[");
        if !h.features.is_empty() {
            for t in 0..trees.n_trees() {
                if t > 0 {
                    s.push(',');
                }
                s.push_str(&trees.leaf_index[trees.leaf(t, &h.features)].to_string());
            }
        }
        s.push(']');
        for (k, v) in [("features", &h.features), ("raw", &h.raw)] {
            s.push_str(",\"");
            s.push_str(k);
            s.push_str("\":[");
            for (i, x) in v.iter().enumerate() {
                if i > 0 {
                    s.push(',');
                }
                push_f(&mut s, *x);
            }
            s.push(']');
        }
    }
    s.push('}');
    s
}

/// The golden document of the artifact (format 1, kind "demand").
pub fn golden_doc(d: &Demand) -> Result<Json, Error> {
    let bytes = d.file("golden.json").map_err(|_| Error::new("golden_absent", "golden.json is not listed in the manifest"))?;
    let g = json::parse_bytes(&bytes).map_err(|e| Error::new("golden_invalid", format!("golden.json is not JSON: {e}")))?;
    if g.get("format").and_then(Json::as_f64) != Some(1.0) || g.get("kind").and_then(Json::as_str) != Some("demand") {
        return Err(Error::new("golden_invalid", "golden.json: format must be 1 and kind \"demand\""));
    }
    if g.get("cases").and_then(Json::as_array).is_none() || g.get("tolerances").and_then(Json::as_object).is_none() {
        return Err(Error::new("golden_invalid", "golden.json: no cases or tolerances"));
    }
    Ok(g)
}

/// The requests of the golden cases (for `demand-bench` when no inputs are given).
pub fn golden_requests(d: &Demand) -> Result<Vec<Json>, Error> {
    let g = golden_doc(d)?;
    Ok(g.get("cases").and_then(Json::as_array).expect("checked").iter()
        .map(|c| c.get("input").cloned().unwrap_or(Json::Null)).collect())
}

fn same_opt_f(e: Option<&Json>, g: Option<f64>) -> bool {
    match (e, g) {
        (None | Some(Json::Null), None) => true,
        (Some(Json::Num(n)), Some(x)) => n.value == x,
        _ => false,
    }
}

fn same_opt_s(e: Option<&Json>, g: Option<&str>) -> bool {
    match (e, g) {
        (None | Some(Json::Null), None) => true,
        (Some(Json::Str(s)), Some(x)) => s == x,
        _ => false,
    }
}

/// Check the golden vectors; (ok, summary JSON object).
pub fn check(d: &Demand) -> Result<(bool, Json), Error> {
    let g = golden_doc(d)?;
    let tol = g.get("tolerances").expect("checked");
    let t = |k: &str| tol.get(k).and_then(Json::as_f64);
    let (Some(hint_abs), Some(hint_rel)) = (t("hint_abs"), t("hint_rel")) else {
        return Err(Error::new("golden_invalid", "golden.json: tolerances hint_abs and hint_rel are required"));
    };
    let raw_abs = t("raw_abs").unwrap_or(0.0);
    let cases = g.get("cases").and_then(Json::as_array).expect("checked");
    let (mut max_abs, mut max_rel, mut raw_max) = (0.0f64, 0.0f64, 0.0f64);
    let (mut exact, mut feat_cases, mut feat_equal, mut raw_cases) = (0usize, 0usize, 0usize, 0usize);
    let mut mismatches = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let bad = |f: &str| Error::new("golden_invalid", format!("case {i}: {f}"));
        let input = c.get("input").filter(|x| x.as_object().is_some()).ok_or_else(|| bad("input"))?;
        let e = c.get("expected").filter(|x| x.as_object().is_some()).ok_or_else(|| bad("expected"))?;
        let h = d.hint(input, d.created_ms);
        let mut off = Vec::new();
        for (k, v) in [("hint_p50", h.p50), ("hint_p90", h.p90), ("hint_lo", h.lo), ("hint_hi", h.hi)] {
            let want = e.get(k).and_then(Json::as_f64).ok_or_else(|| bad(k))?;
            let s = want.abs().max(1.0);
            let (a, r) = ((want - v).abs(), (want / s - v / s).abs());
            let (a, r) = if a.is_nan() { (f64::INFINITY, f64::INFINITY) } else { (a, r) };
            max_abs = max_abs.max(a);
            max_rel = max_rel.max(r);
            if a > hint_abs || r > hint_rel {
                off.push(k);
            }
        }
        let same = e.get("hint_fallback").and_then(Json::as_bool) == Some(h.fallback)
            && same_opt_s(e.get("fallback_reason"), h.reason)
            && same_opt_s(e.get("cell"), h.cell.as_deref())
            && same_opt_f(e.get("correction"), h.correction);
        exact += same as usize;
        if !same {
            off.push("exact");
        }
        if let Some(want) = e.get("features").and_then(Json::as_array) {
            feat_cases += 1;
            let ok = want.len() == h.features.len() && want.iter().zip(&h.features).all(|(w, &x)| match w {
                Json::Null => x.is_nan(),
                Json::Num(n) => n.value == x,
                _ => false,
            });
            feat_equal += ok as usize;
            if !ok {
                off.push("features");
            }
        }
        if let Some(want) = e.get("raw").and_then(Json::as_array) {
            raw_cases += 1;
            if want.len() != h.raw.len() {
                raw_max = f64::INFINITY;
                off.push("raw");
            } else {
                let mut worst = 0.0f64;
                for (w, &x) in want.iter().zip(&h.raw) {
                    let diff = (w.as_f64().unwrap_or(f64::NAN) - x).abs();
                    worst = worst.max(if diff.is_nan() { f64::INFINITY } else { diff });
                }
                raw_max = raw_max.max(worst);
                if worst > raw_abs {
                    off.push("raw");
                }
            }
        }
        if !off.is_empty() {
            let mut m = BTreeMap::new();
            m.insert("case".to_string(), int(i));
            m.insert("fields".to_string(), Json::Arr(off.iter().map(|f| Json::Str(f.to_string())).collect()));
            mismatches.push(Json::Obj(m));
        }
    }
    let n = cases.len();
    let ok = n > 0 && max_abs <= hint_abs && max_rel <= hint_rel && exact == n && feat_equal == feat_cases
        && raw_max <= raw_abs;
    let mut s = BTreeMap::new();
    s.insert("ok".to_string(), Json::Bool(ok));
    s.insert("n_cases".to_string(), int(n));
    s.insert("hint_max_abs".to_string(), num(max_abs));
    s.insert("hint_max_rel".to_string(), num(max_rel));
    s.insert("exact_agreement".to_string(), num(if n == 0 { 0.0 } else { exact as f64 / n as f64 }));
    s.insert("features_cases".to_string(), int(feat_cases));
    s.insert("features_equal".to_string(), int(feat_equal));
    s.insert("raw_cases".to_string(), int(raw_cases));
    s.insert("raw_max_abs".to_string(), num(raw_max));
    let mut tl = BTreeMap::new();
    tl.insert("hint_abs".to_string(), num(hint_abs));
    tl.insert("hint_rel".to_string(), num(hint_rel));
    tl.insert("raw_abs".to_string(), num(raw_abs));
    s.insert("tolerances".to_string(), Json::Obj(tl));
    s.insert("mismatches".to_string(), Json::Arr(mismatches));
    s.insert("n_trees".to_string(), int(d.trees.n_trees()));
    s.insert("version".to_string(), Json::Str(d.version.clone()));
    Ok((ok, Json::Obj(s)))
}
