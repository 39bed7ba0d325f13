//! replaylab-route: route queries with a router artifact (docs/specs/router-scorer.md).
//!
//!   replaylab-route route ARTIFACT_DIR [--no-golden]
//!       JSON lines on stdin {"text", "category"?, "prompt_tokens"?} -> JSON lines on
//!       stdout {"candidate", "success_prob", "margin", "token_ids"}. The golden vectors
//!       are checked at load first (as the Python Router does) unless --no-golden.
//!   replaylab-route route-embedding ARTIFACT_DIR [--no-golden]
//!       stdin JSON lines {"embedding", "category", "prompt_tokens"} (the host's own
//!       embedding of each query; either tier, the MiniLM tier only this way) -> stdout
//!       decisions as `route` writes them (token_ids []). Golden vectors checked first.
//!   replaylab-route verify-encoder ARTIFACT_DIR --texts | [--embeddings FILE.jsonl]
//!       a MiniLM-tier artifact's golden triples: `--texts` prints their inputs (JSON
//!       lines {"text", "category", "prompt_tokens"}) for the host to embed; else the
//!       host's embeddings ({"text", "embedding"} lines, stdin by default) are checked
//!       against the stored ones (docs/specs/router-scorer.md, "Routing on the host's
//!       embedding"): a JSON summary; exit 0 when they hold, else 1.
//!   replaylab-route golden ARTIFACT_DIR
//!       check the golden vectors; prints a JSON summary; exit 0 when they hold, else 1.
//!   replaylab-route bench ARTIFACT_DIR [--n N] [--warmup W] [--inputs FILE.jsonl] [--samples]
//!       load once, time N routes (inputs cycled; default: the golden queries) inside
//!       the process (wall clock, one thread, each call: tokenize, embed, head, decide);
//!       prints one JSON object with p50/p90/p99 in microseconds (--samples: every call's).
//!   replaylab-route demand ARTIFACT_DIR [--no-golden] [--explain] [--now-ms MS]
//!       a demand artifact (docs/specs/demand-scorer.md): JSON lines on stdin (request
//!       objects, the Python runtime's fields) -> JSON lines on stdout (the hint; with
//!       --explain also the feature row and raw scores). --now-ms: the clock for requests
//!       without `timestamp` (default: now). Golden vectors checked first unless --no-golden.
//!   replaylab-route demand-golden ARTIFACT_DIR
//!       check the demand golden vectors; prints a JSON summary; exit 0 when they hold, else 1.
//!   replaylab-route demand-bench ARTIFACT_DIR [--n N] [--warmup W] [--inputs FILE.jsonl] [--samples]
//!       load once, time N hints (inputs cycled; default: the golden requests), as `bench`:
//!       each call is one `Demand::hint` on a parsed request (no JSON I/O timed).
//!   replaylab-route bind --artifact DIR --events FILE.jsonl [--rate R] [--cap C] [--salt S]
//!                        [--ladder a,b,c] [--max-sessions N] [--ttl-s T] [--fallback M] [--no-golden]
//!       the session binder (docs/specs/binder.md) over the artifact: JSONL events in order
//!       ({"op": "bind", "session_id", "text", "category", "prompt_tokens", "turn_index",
//!       "now"}, {"op": "fail", "session_id"}, {"op": "stats"}) -> one canonical JSON record
//!       per event on stdout (a bind's receipt, a fail's `escalated`, the counts). An
//!       artifact that does not load (or misses its golden vectors) leaves the binder on
//!       --fallback (reason router_not_loaded); without --fallback that is an error.
//!   replaylab-route bind-bench --artifact DIR [--n N] [--warmup W] [--inputs FILE.jsonl] [--samples]
//!                              [binder options as bind]
//!       time, on the same inputs, `route` alone and an opening `bind` (route + binder) of a
//!       fresh session, interleaved, then a sticky turn of each session; p50/p99 of each and
//!       the opening overhead (bind p50/p99 minus route p50/p99); `binder_only`: the same
//!       openings with the router's choice given (`Binder::bind_with`), the binder's own work.
//!   replaylab-route draw --salt S --rate R --k K   (a check aid) session ids on stdin, one
//!       per line -> {"u": exploration draw, "j": explored index or null} per line
//!   replaylab-route canon            (a check aid) canonical JSON of the JSON on stdin
//!   replaylab-route sha256 FILE...   (a check aid) hex sha256 of each file
//!   replaylab-route safetensors FILE (a check aid) its F32 tensors as JSON {name: {shape, data}}
//!
//! Errors (missing file, hash mismatch, bad JSON, bad usage): one `error: ...` line on
//! stderr and exit code 2.
//!
//! The subcommands live in src/cli/ by role (route, demand, bind, tools).

use std::process::ExitCode;

use replaylab_scorer::demand::golden as demand_golden;
use replaylab_scorer::router::golden;
use replaylab_scorer::Error;

mod cli;

use cli::{bind, demand, emit, emit_check, route, tools, usage, USAGE};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(args: &[String]) -> Result<u8, Error> {
    match args.first().map(String::as_str) {
        Some("route") => route::route(args),
        Some("golden") => Ok(emit_check(golden::check(&route::load(args)?)?, "golden vectors")),
        Some("bench") => route::bench(args),
        Some("route-embedding") => route::route_embedding(args),
        Some("verify-encoder") => route::verify_encoder(args),
        Some("demand") => demand::demand(args),
        Some("demand-golden") => {
            Ok(emit_check(demand_golden::check(&demand::load_demand(args)?)?, "demand golden vectors"))
        }
        Some("demand-bench") => demand::demand_bench(args),
        Some("bind") => bind::bind(args),
        Some("bind-bench") => bind::bind_bench(args),
        Some("draw") => bind::draw(args),
        Some("canon") => tools::canon(),
        Some("sha256") => tools::sha256(args),
        Some("safetensors") => tools::safetensors(args),
        Some("-h" | "--help") => {
            emit(USAGE);
            Ok(0)
        }
        _ => Err(usage("unknown or missing subcommand")),
    }
}
