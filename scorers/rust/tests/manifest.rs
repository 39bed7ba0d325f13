//! `cargo test --offline` of manifest verification (src/artifact/manifest.rs) on the crate's
//! fixtures (tests/fixtures, scripts/make_rust_fixtures.py): each manifest (demand, router,
//! the router's encoder) verifies, lists every file of its folder with its size and sha256,
//! and its content hash is the one recomputed here; a wrong kind, a changed size, a flipped
//! bit, an edited body, a clock before creation or past validity are refused, each with its
//! reason code.

use std::collections::BTreeSet;
use std::path::Path;

use replaylab_scorer::artifact::manifest::{self, Store, Verified};
use replaylab_scorer::util::{sha256, timefmt};
use replaylab_scorer::Error;

#[allow(dead_code)] // the artifact-list helpers are the scorer tests'
mod common;

/// (fixture, folder inside it, kind)
const MANIFESTS: [(&str, &str, &str); 3] = [("demand", "", "demand"), ("router", "", "router"),
                                            ("router", "encoder", "encoder")];

fn verify(root: &Path, dir: &str, kind: &str, now: f64) -> Result<Verified, Error> {
    manifest::verify(&mut Store::new(root)?, dir, kind, now)
}

/// Every file under `dir` but its manifest.json, as paths relative to `dir`.
fn files_under(dir: &Path, prefix: &str, out: &mut BTreeSet<String>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let name = format!("{prefix}{}", e.file_name().to_str().unwrap());
        if e.file_type().unwrap().is_dir() {
            files_under(&e.path(), &format!("{name}/"), out);
        } else if name != "manifest.json" {
            out.insert(name);
        }
    }
}

#[test]
fn the_fixtures_verify_and_list_every_file() {
    for (name, dir, kind) in MANIFESTS {
        let root = common::fixture(name);
        let v = verify(&root, dir, kind, timefmt::now()).unwrap_or_else(|e| panic!("{name}/{dir}: {e}"));
        assert_eq!(v.json.get("kind").and_then(|k| k.as_str()), Some(kind));
        assert_eq!(manifest::content_hash(&v.json).unwrap(), v.content_hash());
        let folder = root.join(dir);
        let mut on_disk = BTreeSet::new();
        files_under(&folder, "", &mut on_disk);
        let listed: BTreeSet<String> = v.entries.iter().map(|e| e.path.clone()).collect();
        assert_eq!(listed, on_disk, "{name}/{dir}: the manifest lists exactly the folder's files");
        for e in &v.entries {
            let data = std::fs::read(folder.join(&e.path)).unwrap();
            assert_eq!(data.len() as u64, e.size, "{}", e.path);
            assert_eq!(&sha256::sha256_hex(&data), &e.sha256, "{}", e.path);
        }
    }
    // the router lists its encoder's manifest among its files: the encoder is pinned whole
    let v = verify(&common::fixture("router"), "", "router", timefmt::now()).unwrap();
    assert!(v.entries.iter().any(|e| e.path == "encoder/manifest.json"));
}

#[test]
fn the_checks_refuse_with_their_reason() {
    for (i, (name, dir, kind)) in MANIFESTS.iter().enumerate() {
        let root = common::fixture(name);
        let reason = |r: Result<Verified, Error>| r.err().map(|e| e.reason);
        assert_eq!(reason(verify(&root, dir, "not-the-kind", timefmt::now())), Some("kind"));
        let (created, until) = {
            let v = verify(&root, dir, kind, timefmt::now()).unwrap();
            let t = |k: &str| timefmt::parse_iso(v.json.get(k).unwrap().as_str().unwrap(), k).unwrap();
            (t("created_at"), t("valid_until"))
        };
        assert!(verify(&root, dir, kind, created).is_ok() && verify(&root, dir, kind, until).is_ok());
        assert_eq!(reason(verify(&root, dir, kind, until + 1.0)), Some("expired"));
        assert_eq!(reason(verify(&root, dir, kind, created - manifest::MAX_CLOCK_SKEW_S - 1.0)),
                   Some("future_created"));
        // a listed file one byte longer, then one bit flipped
        let v = verify(&root, dir, kind, timefmt::now()).unwrap();
        let first = &v.entries[0].path;
        let rel = if dir.is_empty() { first.clone() } else { format!("{dir}/{first}") };
        let bad = common::scratch("replaylab-manifest", &format!("{i}-size"));
        common::copy_dir(&root, &bad);
        let mut data = std::fs::read(bad.join(&rel)).unwrap();
        data.push(b'\n');
        std::fs::write(bad.join(&rel), &data).unwrap();
        assert_eq!(reason(verify(&bad, dir, kind, timefmt::now())), Some("size_mismatch"), "{rel}");
        std::fs::remove_dir_all(&bad).unwrap();
        let bad = common::tampered(&root, "replaylab-manifest", &format!("{i}-bit"), &rel);
        assert_eq!(reason(verify(&bad, dir, kind, timefmt::now())), Some("hash_mismatch"), "{rel}");
        // an edited body (the version), the hashes of the files untouched
        let m = if dir.is_empty() { "manifest.json".to_string() } else { format!("{dir}/manifest.json") };
        let text = std::fs::read_to_string(bad.join(&m)).unwrap();
        let edited = text.replacen("\"files\":[", "\"files\":[ ", 1).replacen("\"outputs\":{", "\"outputs\":{\"x\":1,", 1);
        std::fs::write(bad.join(&m), edited).unwrap();
        assert_eq!(reason(verify(&bad, dir, kind, timefmt::now())), Some("content_hash"), "{m}");
        std::fs::remove_dir_all(&bad).unwrap();
    }
}
