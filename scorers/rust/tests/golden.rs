//! `cargo test --offline` of the router scorer on real static-tier artifacts: the crate's
//! fixture (tests/fixtures/router: a tiny encoder, scripts/make_rust_fixtures.py) always,
//! and the folder REPLAYLAB_ROUTER_ARTIFACT names when set (`python -m training
//! pipeline=router router.encoder.tier=static` writes one to <run>/artifacts/router).

use std::path::PathBuf;

use replaylab_scorer::router::golden;
use replaylab_scorer::util::{json, timefmt};
use replaylab_scorer::Router;

mod common;

fn artifacts() -> Vec<PathBuf> {
    common::artifacts("REPLAYLAB_ROUTER_ARTIFACT", "router", "golden-vector")
}

fn scratch(name: &str) -> PathBuf {
    common::scratch("replaylab-scorer", name)
}

#[test]
fn golden_vectors_route_identically() {
    for dir in artifacts() {
        let router = Router::load(&dir, timefmt::now()).expect("the artifact loads");
        let (ok, summary) = golden::check(&router).expect("golden.json is readable");
        let s = json::canonical(&summary).unwrap();
        eprintln!("{}: {s}", dir.display());
        let n = summary.get("n_cases").and_then(|x| x.as_i64()).unwrap();
        assert!(n > 0);
        // token ids bit for bit, every decision equal (not only the stable ones), probabilities
        // within the artifact's static_prob_abs
        assert_eq!(summary.get("token_ids_equal").and_then(|x| x.as_i64()), Some(n), "{s}");
        assert_eq!(summary.get("decisions_equal").and_then(|x| x.as_i64()), Some(n), "{s}");
        let enc = summary.get("encoder").unwrap();
        assert_eq!(enc.get("token_ids_equal").and_then(|x| x.as_i64()), enc.get("n_cases").and_then(|x| x.as_i64()), "{s}");
        assert!(ok, "{s}");
    }
}

#[test]
fn a_tampered_artifact_is_refused() {
    for (k, dir) in artifacts().iter().enumerate() {
        let files = ["encoder/embeddings.safetensors", "encoder/charmap.tsv", "encoder/vocab.txt",
                     "head.safetensors", "router.json", "golden.json"];
        for (i, file) in files.iter().enumerate() {
            let bad = common::tampered(dir, "replaylab-scorer", &format!("{k}-tamper{i}"), file);
            let err = Router::load(&bad, timefmt::now()).err().expect("a tampered file is refused");
            assert_eq!(err.reason, "hash_mismatch", "{file}: {err}");
            std::fs::remove_dir_all(&bad).unwrap();
        }
        // an edited manifest body: the router's is content_hash; the encoder's is a file the
        // router's manifest pins, hash_mismatch
        for (i, (m, reason)) in [("manifest.json", "content_hash"), ("encoder/manifest.json", "hash_mismatch")].iter().enumerate() {
            let bad = scratch(&format!("{k}-manifest{i}"));
            common::copy_dir(dir, &bad);
            let p = bad.join(m);
            let text = std::fs::read_to_string(&p).unwrap();
            let edited = if i == 0 {
                text.replacen("\"kind\":\"embedding\"", "\"kind\":\"embeddinG\"", 1)
            } else {
                text.replacen("\"pooling\":\"mean\"", "\"pooling\":\"meaN\"", 1)
            };
            assert_ne!(edited, text, "{m}: nothing edited");
            std::fs::write(&p, edited).unwrap();
            assert_eq!(Router::load(&bad, timefmt::now()).err().unwrap().reason, *reason, "{m}");
            std::fs::remove_dir_all(&bad).unwrap();
        }
        // a missing file
        let bad = scratch(&format!("{k}-missing"));
        common::copy_dir(dir, &bad);
        std::fs::remove_file(bad.join("encoder/vocab.txt")).unwrap();
        assert_eq!(Router::load(&bad, timefmt::now()).err().unwrap().reason, "missing_file");
        std::fs::remove_dir_all(&bad).unwrap();
        // expired: a clock past valid_until
        assert_eq!(Router::load(dir, common::past_validity(dir)).err().unwrap().reason, "expired");
    }
}
