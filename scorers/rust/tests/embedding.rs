//! `cargo test --offline` of routing on the host's embedding (docs/specs/router-scorer.md,
//! "Routing on the host's embedding"): the MiniLM-tier fixture (tests/fixtures/router-minilm:
//! a tiny BERT of all-MiniLM-L6-v2's shape, scripts/make_rust_fixtures.py), loaded for
//! embedding-only routing, its golden (text, embedding, decision) triples, a host encoder
//! checked on them; and the folder REPLAYLAB_MINILM_ROUTER_ARTIFACT names when set (a
//! `python -m training pipeline=router` run's <run>/artifacts/router).

use replaylab_scorer::router::binder::{Binder, Config};
use replaylab_scorer::router::golden;
use replaylab_scorer::util::{json, timefmt};
use replaylab_scorer::router::Tier;
use replaylab_scorer::{Error, Router};

mod common;

fn minilm() -> Vec<std::path::PathBuf> {
    common::artifacts("REPLAYLAB_MINILM_ROUTER_ARTIFACT", "router-minilm", "embedding")
}

/// A seeded drift of `v` (splitmix64 noise of scale `eps` per value), L2-normalized again.
fn drifted(v: &[f32], eps: f64, seed: u64) -> Vec<f32> {
    let mut s = seed;
    let mut next = || {
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    };
    let w: Vec<f64> = v.iter().map(|&x| x as f64 + eps * next()).collect();
    let n = w.iter().map(|x| x * x).sum::<f64>().sqrt();
    w.iter().map(|x| (x / n) as f32).collect()
}

#[test]
fn the_minilm_tier_loads_for_embedding_only_routing() {
    for dir in minilm() {
        let router = Router::load(&dir, timefmt::now()).expect("the artifact loads");
        assert_eq!(router.tier, Tier::Minilm);
        assert!(router.encoder.is_none());
        // verified (hashed) at load, not kept: the ONNX graphs
        assert!(router.encoder_manifest.files.keys().all(|k| !k.ends_with(".onnx")));
        // its golden vectors: every case routed on its stored fp32 embedding
        let (ok, summary) = golden::check(&router).expect("golden.json is readable");
        let s = json::canonical(&summary).unwrap();
        eprintln!("{}: {s}", dir.display());
        let n = summary.get("n_cases").and_then(|x| x.as_i64()).unwrap();
        assert!(n > 0 && ok, "{s}");
        assert_eq!(summary.get("variant").and_then(|x| x.as_str()), Some("fp32"));
        assert_eq!(summary.get("decisions_equal").and_then(|x| x.as_i64()), Some(n), "{s}");
        // and each triple by hand: the stored decision, P(success) within fp32_prob_abs
        for t in golden::triples(&router).unwrap() {
            let q = &t.query;
            let d = router.route_embedding(&t.embedding, q.category.as_deref(), router.prompt_tokens(&q.text, q.prompt_tokens))
                .unwrap();
            assert_eq!(router.candidates[d.candidate], t.candidate, "{}", q.text);
            assert!(d.token_ids.is_empty());
            for (a, b) in d.success_prob.iter().zip(&t.success_prob) {
                assert!((a - b).abs() <= 1e-4, "{a} vs {b}");
            }
            let line = router.decision_json(&d);
            assert!(line.starts_with("{\"candidate\":") && line.ends_with(",\"token_ids\":[]}"), "{line}");
        }
    }
}

#[test]
fn routing_from_text_needs_the_static_tier() {
    let router = Router::load(&common::fixture("router-minilm"), timefmt::now()).unwrap();
    let err = router.route("What is 2 + 2?", None, None).expect_err("no text encoder");
    assert_eq!(err.reason, "embedding_only");
    assert!(err.message.contains("route_embedding") && err.message.contains("static tier"), "{err}");
    // a binder routes its openings from text
    let err = Binder::new(Some(router), Config::default()).err().expect("refused");
    assert_eq!(err.reason, "bad_config");
    assert!(err.message.contains("embedding_only") || err.message.contains("route_embedding"), "{err}");
}

#[test]
fn a_bad_embedding_is_refused_with_its_reason() {
    let router = Router::load(&common::fixture("router-minilm"), timefmt::now()).unwrap();
    let d = router.dimension;
    assert_eq!(router.route_embedding(&vec![0.1; d - 1], None, 10.0).err().unwrap().reason, "dimension");
    let mut e = vec![0.1f32; d];
    e[3] = f32::NAN;
    assert_eq!(router.route_embedding(&e, None, 10.0).err().unwrap().reason, "bad_input");
    e[3] = f32::INFINITY;
    assert_eq!(router.route_embedding(&e, None, 10.0).err().unwrap().reason, "bad_input");
    // unknown prompt tokens (NaN: the training mean) and an unknown category are answers
    let t = &golden::triples(&router).unwrap()[0];
    assert!(router.route_embedding(&t.embedding, Some("no such label"), f64::NAN).is_ok());
    assert!(router.route_embedding(&t.embedding, None, f64::INFINITY).is_err());
}

#[test]
fn a_host_encoder_is_checked_on_the_golden_triples() {
    let dir = common::fixture("router-minilm");
    let router = Router::load(&dir, timefmt::now()).unwrap();
    let triples = golden::triples(&router).unwrap();
    let stored: Vec<Vec<f32>> = triples.iter().map(|t| t.embedding.clone()).collect();
    // the artifact's own embeddings: every bound holds
    let (ok, s) = golden::verify_encoder(&router, &stored).unwrap();
    assert!(ok, "{}", json::canonical(&s).unwrap());
    assert!(s.get("min_cosine").and_then(|x| x.as_f64()).unwrap() > 0.999_999);
    // float rounding of another runtime (1e-6 per value): within the bounds
    let close: Vec<Vec<f32>> = stored.iter().enumerate().map(|(i, v)| drifted(v, 1e-6, i as u64)).collect();
    assert!(golden::verify_encoder(&router, &close).unwrap().0);
    // another encoder (0.05 per value on 16 dims: cosine ~0.99, int8's distance): refused
    let far: Vec<Vec<f32>> = stored.iter().enumerate().map(|(i, v)| drifted(v, 0.05, i as u64)).collect();
    let (ok, s) = golden::verify_encoder(&router, &far).unwrap();
    assert!(!ok, "{}", json::canonical(&s).unwrap());
    assert!(s.get("min_cosine").and_then(|x| x.as_f64()).unwrap() < 0.999);
    // one embedding per golden text, of the encoder's dimension
    assert_eq!(golden::verify_encoder(&router, &stored[1..]).err().unwrap().reason, "bad_input");
    let short: Vec<Vec<f32>> = stored.iter().map(|v| v[1..].to_vec()).collect();
    assert_eq!(golden::verify_encoder(&router, &short).err().unwrap().reason, "dimension");

    // at load: a host whose encoder reproduces the triples loads, one that drifts is told so
    let text_of = |t: &str| triples.iter().position(|x| x.query.text == t).expect("a golden text");
    let good = Router::load_with_encoder(&dir, timefmt::now(), |t| Ok(stored[text_of(t)].clone()));
    assert!(good.is_ok());
    let err = Router::load_with_encoder(&dir, timefmt::now(), |t| Ok(far[text_of(t)].clone())).err().unwrap();
    assert_eq!(err.reason, "encoder_drift");
    assert!(err.message.contains("min cosine") && err.message.contains("needs >= 0.999"), "{err}");
    // the host encoder's own error is the load's
    let err = Router::load_with_encoder(&dir, timefmt::now(), |_| Err(Error::new("host", "no model"))).err().unwrap();
    assert_eq!(err.reason, "host");
}

#[test]
fn the_static_tier_routes_its_own_embedding_as_its_text() {
    let router = Router::load(&common::fixture("router"), timefmt::now()).unwrap();
    assert_eq!(router.tier, Tier::Static);
    for q in golden::golden_queries(&router).unwrap() {
        let by_text = router.route(&q.text, q.category.as_deref(), q.prompt_tokens).unwrap();
        let (_, emb) = router.encoder.as_ref().unwrap().encode(&q.text);
        let by_emb = router.route_embedding(&emb, q.category.as_deref(), router.prompt_tokens(&q.text, q.prompt_tokens))
            .unwrap();
        assert_eq!(by_text.success_prob, by_emb.success_prob); // bit for bit
        assert_eq!(by_text.candidate, by_emb.candidate);
    }
    // a static router has no triples: verify-encoder says why
    assert_eq!(golden::triples(&router).err().unwrap().reason, "golden_invalid");
}

#[test]
fn a_tampered_minilm_artifact_is_refused() {
    let dir = common::fixture("router-minilm");
    // the encoder graph is not used here, but it is what the head was trained with: verified
    for (i, file) in ["encoder/encoder.onnx", "encoder/tokenizer.json", "head.safetensors", "golden.json"].iter().enumerate() {
        let bad = common::tampered(&dir, "replaylab-embedding", &format!("tamper{i}"), file);
        let err = Router::load(&bad, timefmt::now()).err().expect("a tampered file is refused");
        assert_eq!(err.reason, "hash_mismatch", "{file}: {err}");
        std::fs::remove_dir_all(&bad).unwrap();
    }
    assert_eq!(Router::load(&dir, common::past_validity(&dir)).err().unwrap().reason, "expired");
}
