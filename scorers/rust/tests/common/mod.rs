//! Helpers shared by the integration tests (tests/golden.rs, tests/demand.rs,
//! tests/binder.rs, tests/manifest.rs).
//!
//! Every artifact test runs on the crate's own fixture (tests/fixtures/<name>, a tiny real
//! artifact written by scripts/make_rust_fixtures.py) and, when the environment variable
//! names one, on that artifact too (e.g. the 34 MB MiniLM-distilled router a
//! `python -m training pipeline=router router.encoder.tier=static` run exports).

use std::path::{Path, PathBuf};

use replaylab_scorer::util::json;
use replaylab_scorer::util::timefmt;

/// The committed fixture artifact `name` (`demand`, `router`).
pub fn fixture(name: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("fixtures").join(name);
    assert!(p.join("manifest.json").is_file(),
            "{} has no manifest.json: regenerate the fixtures with scripts/make_rust_fixtures.py", p.display());
    p
}

/// The artifacts the `what` tests check: the fixture `name`, then the folder the
/// environment variable `var` names, when set (said on stderr either way).
pub fn artifacts(var: &str, name: &str, what: &str) -> Vec<PathBuf> {
    let mut out = vec![fixture(name)];
    match std::env::var_os(var) {
        Some(p) => out.push(PathBuf::from(p)),
        None => eprintln!("{var} not set: the {what} tests checked the fixture {name} alone"),
    }
    out
}

/// A second past the end of the validity period of the artifact in `dir`.
pub fn past_validity(dir: &Path) -> f64 {
    let m = json::parse(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap();
    let until = m.get("valid_until").and_then(|v| v.as_str()).expect("valid_until");
    timefmt::parse_iso(until, "valid_until").unwrap() + 1.0
}

/// A copy of `src` (recursively) in `dst`.
pub fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        let to = dst.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to);
        } else {
            std::fs::copy(e.path(), &to).unwrap();
        }
    }
}

/// An empty path in the temp folder, unique to this process, `prefix` and `name`.
pub fn scratch(prefix: &str, name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("{prefix}-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    p
}

/// A copy of `dir` in the temp folder with one bit of `file`'s second-to-last byte flipped.
pub fn tampered(dir: &Path, prefix: &str, name: &str, file: &str) -> PathBuf {
    let bad = scratch(prefix, name);
    copy_dir(dir, &bad);
    let p = bad.join(file);
    let mut data = std::fs::read(&p).unwrap();
    let last = data.len() - 2;
    data[last] ^= 1;
    std::fs::write(&p, data).unwrap();
    bad
}
