//! `cargo test --offline` against a real demand artifact: set REPLAYLAB_DEMAND_ARTIFACT to
//! a folder `python -m training pipeline=demand` (then `python -m export`) wrote, e.g.
//! <run>/artifacts/demand (tests/test_rust_demand.py builds a tiny one and runs these).
//! Without it these tests print that they did not check anything and pass (the unit
//! tests still run).

use std::path::PathBuf;

use replaylab_scorer::json::{self, Json};
use replaylab_scorer::{demand_golden, timefmt, Demand};

mod common;

fn artifact() -> Option<PathBuf> {
    common::artifact("REPLAYLAB_DEMAND_ARTIFACT", "demand golden-vector")
}

fn scratch(name: &str) -> PathBuf {
    common::scratch("replaylab-demand", name)
}

#[test]
fn golden_hints_are_reproduced() {
    let Some(dir) = artifact() else { return };
    let d = Demand::load(&dir, timefmt::now()).expect("the artifact loads");
    let (ok, summary) = demand_golden::check(&d).expect("golden.json is readable");
    let s = json::canonical(&summary).unwrap();
    eprintln!("{s}");
    let n = summary.get("n_cases").and_then(Json::as_i64).unwrap();
    assert!(n > 0);
    // the feature rows value for value, the raw scores bit for bit, every exact field
    assert_eq!(summary.get("features_equal").and_then(Json::as_i64), Some(n), "{s}");
    assert_eq!(summary.get("raw_cases").and_then(Json::as_i64), Some(n), "{s}");
    assert_eq!(summary.get("raw_max_abs").and_then(Json::as_f64), Some(0.0), "{s}");
    assert_eq!(summary.get("exact_agreement").and_then(Json::as_f64), Some(1.0), "{s}");
    assert!(ok, "{s}");
}

#[test]
fn a_tampered_artifact_is_refused() {
    let Some(dir) = artifact() else { return };
    for (i, file) in ["trees.safetensors", "golden.json", "model.onnx"].iter().enumerate() {
        let bad = scratch(&format!("tamper{i}"));
        common::copy_dir(&dir, &bad);
        let p = bad.join(file);
        let mut data = std::fs::read(&p).unwrap();
        let last = data.len() - 2;
        data[last] ^= 1;
        std::fs::write(&p, data).unwrap();
        let err = Demand::load(&bad, timefmt::now()).err().expect("a tampered file is refused");
        assert_eq!(err.reason, "hash_mismatch", "{file}: {err}");
        std::fs::remove_dir_all(&bad).unwrap();
    }
    let bad = scratch("manifest");
    common::copy_dir(&dir, &bad);
    let p = bad.join("manifest.json");
    let text = std::fs::read_to_string(&p).unwrap().replacen("\"scale\":\"log1p\"", "\"scale\":\"linear\"", 1);
    std::fs::write(&p, text).unwrap();
    assert_eq!(Demand::load(&bad, timefmt::now()).err().unwrap().reason, "content_hash");
    std::fs::copy(dir.join("manifest.json"), bad.join("manifest.json")).unwrap();
    std::fs::remove_file(bad.join("trees.safetensors")).unwrap();
    assert_eq!(Demand::load(&bad, timefmt::now()).err().unwrap().reason, "missing_file");
    std::fs::remove_dir_all(&bad).unwrap();
    assert_eq!(Demand::load(&dir, timefmt::now() + 400.0 * 86400.0).err().unwrap().reason, "expired");
}

#[test]
fn malformed_requests_fall_back() {
    let Some(dir) = artifact() else { return };
    let d = Demand::load(&dir, timefmt::now()).unwrap();
    let h = |t: &str| d.hint(&json::parse(t).unwrap(), d.created_ms);
    let r = h(r#"{"prompt_tokens": "many", "max_tokens": 100}"#);
    assert!(r.fallback && r.reason == Some("bad_request"));
    assert_eq!((r.lo, r.hi), (0.0, 100.0)); // the prompt is unreadable: 0, the cap alone
    let r = h(r#"{"max_tokens": 64}"#);
    assert_eq!(r.reason, Some("missing_prompt_tokens"));
    assert_eq!((r.lo, r.p50, r.hi), (0.0, 64.0, 64.0));
    let r = h(r#"{"prompt_tokens": 10, "timestamp": "not a time"}"#);
    assert_eq!(r.reason, Some("bad_request"));
    assert_eq!(r.hi, 10.0 + d.default_max_tokens);
    assert_eq!(h("[1, 2]").reason, Some("bad_request"));
    let r = h(r#"{"prompt_tokens": 10}"#);
    assert!(!r.fallback && r.lo >= 10.0 && r.p50 <= r.p90 && r.raw.len() == d.quantiles.len());
}
