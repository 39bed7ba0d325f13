//! `cargo test --offline` against a real artifact: set REPLAYLAB_ROUTER_ARTIFACT to a
//! static-tier router folder (`python -m training pipeline=router
//! router.encoder.tier=static` writes one to <run>/artifacts/router). Without it these
//! tests print that they did not check anything and pass (the unit tests still run).

use std::path::PathBuf;

use replaylab_scorer::{golden, timefmt, Router};

mod common;

fn artifact() -> Option<PathBuf> {
    common::artifact("REPLAYLAB_ROUTER_ARTIFACT", "golden-vector")
}

fn scratch(name: &str) -> PathBuf {
    common::scratch("replaylab-scorer", name)
}

#[test]
fn golden_vectors_route_identically() {
    let Some(dir) = artifact() else { return };
    let router = Router::load(&dir, timefmt::now()).expect("the artifact loads");
    let (ok, summary) = golden::check(&router).expect("golden.json is readable");
    let s = replaylab_scorer::json::canonical(&summary).unwrap();
    eprintln!("{s}");
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

#[test]
fn a_tampered_artifact_is_refused() {
    let Some(dir) = artifact() else { return };
    let cases: [(&str, &str); 3] = [("encoder/embeddings.safetensors", "hash_mismatch"),
                                    ("head.safetensors", "hash_mismatch"),
                                    ("router.json", "hash_mismatch")];
    for (i, (file, reason)) in cases.iter().enumerate() {
        let bad = scratch(&format!("tamper{i}"));
        common::copy_dir(&dir, &bad);
        let p = bad.join(file);
        let mut data = std::fs::read(&p).unwrap();
        let last = data.len() - 2;
        data[last] ^= 1;
        std::fs::write(&p, data).unwrap();
        let err = Router::load(&bad, timefmt::now()).err().expect("a tampered file is refused");
        assert_eq!(err.reason, *reason, "{file}: {err}");
        std::fs::remove_dir_all(&bad).unwrap();
    }
    // an edited manifest body: content_hash
    let bad = scratch("manifest");
    common::copy_dir(&dir, &bad);
    let p = bad.join("manifest.json");
    let text = std::fs::read_to_string(&p).unwrap().replacen("\"kind\":\"embedding\"", "\"kind\":\"embeddinG\"", 1);
    std::fs::write(&p, text).unwrap();
    assert_eq!(Router::load(&bad, timefmt::now()).err().unwrap().reason, "content_hash");
    // a missing file
    std::fs::remove_file(bad.join("encoder/vocab.txt")).unwrap();
    std::fs::copy(dir.join("manifest.json"), bad.join("manifest.json")).unwrap();
    assert_eq!(Router::load(&bad, timefmt::now()).err().unwrap().reason, "missing_file");
    std::fs::remove_dir_all(&bad).unwrap();
    // expired: a clock past valid_until
    assert_eq!(Router::load(&dir, timefmt::now() + 400.0 * 86400.0).err().unwrap().reason, "expired");
}
