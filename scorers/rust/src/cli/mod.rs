//! The subcommands of `replaylab-route` (src/main.rs has the usage), by role:
//! `route` (route, golden, bench), `demand` (demand, demand-golden, demand-bench), `bind`
//! (bind, bind-bench, draw), `tools` (canon, sha256, safetensors: check aids), `timing`
//! (what the bench subcommands share); here, what they all use: output, options, errors.

pub mod bind;
pub mod demand;
pub mod route;
pub mod timing;
pub mod tools;

use std::io::{BufRead, Write};

use replaylab_scorer::util::json::{self, Json};
use replaylab_scorer::Error;

pub const USAGE: &str = "usage: replaylab-route route|golden|bench|route-embedding|verify-encoder|demand|demand-golden|demand-bench ARTIFACT_DIR [options] | bind|bind-bench --artifact DIR [options] (see docs/specs/router-scorer.md, docs/specs/demand-scorer.md, docs/specs/binder.md)";

/// Unless `--no-golden` is among `args`, run `check` (an artifact's golden vectors here)
/// and refuse the artifact (`golden_mismatch`, with the summary) when it misses them.
pub fn require_golden(args: &[String], check: impl FnOnce() -> Result<(bool, Json), Error>)
                      -> Result<(), Error> {
    if args.iter().any(|a| a == "--no-golden") {
        return Ok(());
    }
    let (ok, summary) = check()?;
    if ok {
        return Ok(());
    }
    Err(Error::new("golden_mismatch", format!("the artifact misses its golden vectors here: {}",
                                              json::canonical(&summary).expect("finite"))))
}

/// A golden check's summary on stdout; exit status 0 when it held, else 1 (said on stderr).
pub fn emit_check((ok, summary): (bool, Json), what: &str) -> u8 {
    emit(&json::canonical(&summary).expect("finite"));
    if !ok {
        eprintln!("{what} missed: see the summary");
    }
    if ok { 0 } else { 1 }
}

/// One line on stdout; a closed pipe (`| head`) is not an error worth a panic.
pub fn emit(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(line.as_bytes()).and_then(|_| out.write_all(b"\n")).and_then(|_| out.flush());
}

pub fn usage(m: &str) -> Error {
    Error::new("usage", format!("{m}; {USAGE}"))
}

pub fn opt(args: &[String], name: &str) -> Result<Option<String>, Error> {
    match args.iter().position(|a| a == name) {
        None => Ok(None),
        Some(i) => args.get(i + 1).cloned().map(Some).ok_or_else(|| usage(&format!("{name} needs a value"))),
    }
}

pub fn parsed<T: std::str::FromStr>(args: &[String], name: &str) -> Result<Option<T>, Error> {
    opt(args, name)?.map(|s| s.parse::<T>().map_err(|_| usage(&format!("{name} {s:?} is not a valid value"))))
        .transpose()
}

pub fn read_jsonl(f: &str) -> Result<Vec<Json>, Error> {
    let file = std::fs::File::open(f).map_err(|e| Error::new("missing_file", format!("{f}: {e}")))?;
    let mut out = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| Error::new("bad_input", format!("{f} line {}: {e}", i + 1)))?;
        if !line.trim().is_empty() {
            out.push(json::parse(&line).map_err(|e| Error::new("bad_input", format!("{f} line {}: {e}", i + 1)))?);
        }
    }
    Ok(out)
}
