//! `cargo test --offline` of the binder over real router artifacts (as tests/golden.rs: the
//! fixture tests/fixtures/router, and REPLAYLAB_ROUTER_ARTIFACT when set): openings decided
//! by the router (its choice, or the other candidate with the exact propensity), sticky
//! afterwards.

use std::path::Path;

use replaylab_scorer::router::binder::{self, Binder, Config};
use replaylab_scorer::router::golden;
use replaylab_scorer::util::timefmt;
use replaylab_scorer::Router;

#[allow(dead_code)] // the tamper helpers are tests/golden.rs's
mod common;

#[test]
fn binder_openings_are_the_routers_choice_or_explored() {
    for dir in common::artifacts("REPLAYLAB_ROUTER_ARTIFACT", "router", "binder") {
        openings(&dir);
    }
}

fn openings(dir: &Path) {
    let router = Router::load(dir, timefmt::now()).expect("the artifact loads");
    let queries = golden::golden_queries(&router).expect("golden queries");
    let own: Vec<String> = queries.iter()
        .map(|q| router.candidates[router.route(&q.text, q.category.as_deref(), q.prompt_tokens).unwrap().candidate].clone())
        .collect();
    let k = router.candidates.len();
    let rate = 0.1;
    let mut b = Binder::new(Some(router), Config { rate, salt: "cargo".into(), ..Config::default() }).unwrap();
    assert!(b.exploring() && b.reason.is_none());
    let n = 2000;
    let mut explored = 0;
    for i in 0..n {
        let q = &queries[i % queries.len()];
        let sid = format!("c{i}");
        let r = b.bind(&sid, &q.text, q.category.as_deref(), q.prompt_tokens, None, i as f64);
        let picked = b.ladder[r.selected].clone();
        let u = binder::exploration_draw("cargo", &sid);
        if u < rate {
            explored += 1;
            assert_eq!(r.routing_source, binder::EXPLORATION);
            assert_ne!(picked, own[i % queries.len()]);
            assert_eq!(r.propensity, Some(rate / (k - 1) as f64));
        } else {
            assert_eq!((r.routing_source, picked.as_str()), (binder::CLASSIFIER, own[i % queries.len()].as_str()));
            assert_eq!(r.propensity, Some(1.0 - rate));
        }
        let again = b.bind(&sid, "", None, None, None, i as f64 + 0.5);
        assert_eq!((again.selected, again.routing_source, again.binding_id.as_str()), (r.selected, binder::STICKY, r.binding_id.as_str()));
    }
    assert_eq!(b.counts.explored, explored as u64);
    assert!((100..=300).contains(&explored), "{explored} of {n} explored at rate {rate}");
    assert_eq!((b.counts.openings, b.counts.sticky, b.held()), (n as u64, n as u64, n));
}
