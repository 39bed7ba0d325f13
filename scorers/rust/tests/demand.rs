//! `cargo test --offline` of the demand scorer on real demand artifacts: the crate's fixture
//! (tests/fixtures/demand, scripts/make_rust_fixtures.py) always, and the folder
//! REPLAYLAB_DEMAND_ARTIFACT names when set (`python -m training pipeline=demand` then
//! `python -m export` write one to <run>/artifacts/demand; tests/scorers/test_rust_demand.py builds a
//! tiny one and runs these against it).

use std::path::PathBuf;

use replaylab_scorer::demand::golden as demand_golden;
use replaylab_scorer::util::json::{self, Json};
use replaylab_scorer::util::timefmt;
use replaylab_scorer::Demand;

mod common;

fn artifacts() -> Vec<PathBuf> {
    common::artifacts("REPLAYLAB_DEMAND_ARTIFACT", "demand", "demand golden-vector")
}

fn scratch(name: &str) -> PathBuf {
    common::scratch("replaylab-demand", name)
}

#[test]
fn golden_hints_are_reproduced() {
    for dir in artifacts() {
        let d = Demand::load(&dir, timefmt::now()).expect("the artifact loads");
        let (ok, summary) = demand_golden::check(&d).expect("golden.json is readable");
        let s = json::canonical(&summary).unwrap();
        eprintln!("{}: {s}", dir.display());
        let n = summary.get("n_cases").and_then(Json::as_i64).unwrap();
        assert!(n > 0);
        // the feature rows value for value, the raw scores bit for bit, every exact field
        assert_eq!(summary.get("features_equal").and_then(Json::as_i64), Some(n), "{s}");
        assert_eq!(summary.get("raw_cases").and_then(Json::as_i64), Some(n), "{s}");
        assert_eq!(summary.get("raw_max_abs").and_then(Json::as_f64), Some(0.0), "{s}");
        assert_eq!(summary.get("exact_agreement").and_then(Json::as_f64), Some(1.0), "{s}");
        assert!(ok, "{s}");
    }
}

#[test]
fn a_tampered_artifact_is_refused() {
    for (k, dir) in artifacts().iter().enumerate() {
        for (i, file) in ["trees.safetensors", "golden.json", "model.onnx"].iter().enumerate() {
            let bad = common::tampered(dir, "replaylab-demand", &format!("{k}-tamper{i}"), file);
            let err = Demand::load(&bad, timefmt::now()).err().expect("a tampered file is refused");
            assert_eq!(err.reason, "hash_mismatch", "{file}: {err}");
            std::fs::remove_dir_all(&bad).unwrap();
        }
        let bad = scratch(&format!("{k}-manifest"));
        common::copy_dir(dir, &bad);
        let p = bad.join("manifest.json");
        let text = std::fs::read_to_string(&p).unwrap();
        let edited = text.replacen("\"scale\":\"log1p\"", "\"scale\":\"linear\"", 1);
        assert_ne!(edited, text, "nothing edited");
        std::fs::write(&p, edited).unwrap();
        assert_eq!(Demand::load(&bad, timefmt::now()).err().unwrap().reason, "content_hash");
        std::fs::copy(dir.join("manifest.json"), bad.join("manifest.json")).unwrap();
        std::fs::remove_file(bad.join("trees.safetensors")).unwrap();
        assert_eq!(Demand::load(&bad, timefmt::now()).err().unwrap().reason, "missing_file");
        std::fs::remove_dir_all(&bad).unwrap();
        assert_eq!(Demand::load(dir, common::past_validity(dir)).err().unwrap().reason, "expired");
    }
}

#[test]
fn malformed_requests_fall_back() {
    for dir in artifacts() {
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
}
