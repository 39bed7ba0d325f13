//! Helpers shared by the integration tests (tests/golden.rs, tests/demand.rs).

use std::path::{Path, PathBuf};

/// The artifact folder named by the environment variable `var`; without it, say on stderr
/// that the `what` tests checked nothing (they pass; the unit tests still run).
pub fn artifact(var: &str, what: &str) -> Option<PathBuf> {
    match std::env::var_os(var) {
        Some(p) => Some(PathBuf::from(p)),
        None => {
            eprintln!("{var} not set: the {what} tests checked nothing");
            None
        }
    }
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
