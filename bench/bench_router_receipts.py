"""Benchmark: the router trained from a --rows-turn receipts ledger (pipeline=router data.ledger).

Ledger: `simulate_receipts` on the shipped RouteLLM GSM8K outcomes with enough sessions
per prompt for --rows turns (5% exploration, escalation), written as a deployment writes
it (`deployment_ledger`) to Parquet, plus replays of 25% of the opening prompts (not
timed). The router config is conf/router/default.yaml as
`python -m training pipeline=router` composes it (the shipped GSM8K candidates). Timed,
with the peak RSS of this process (bench_projection.PeakRSS):

- read: `read_ledger` of the Parquet file (validation and quarantine included);
- train: `train_router_receipts` (receipts table, time split, embeddings through the
  static tier's cache, the head, threshold on calibration, OPE on the test sessions,
  replay plan, curves and tables written), the router config's defaults.

Needs the static encoder export in outputs/cache/encoder-static (made by
`python -m training pipeline=router router.encoder.tier=static` once; made here when
absent). Prints one JSON object on the last line.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

from bench_projection import PeakRSS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from router_results import router_values  # noqa: E402

from replaylab.apps.inputs import default_outcomes
from replaylab.artifacts.encoder_cache import static_encoder_folder
from replaylab.contracts import read_ledger
from replaylab.pipelines.router_receipts import train_router_receipts
from replaylab.router.config import RouterExplorationConfig
from replaylab.router.embed_cache import cached_embed
from replaylab.router.exploration import deployment_ledger, replay_outcomes, simulate_receipts
from replaylab.router.pipeline_config import router_config
from replaylab.router.replay import outcome_matrix
from replaylab.router.rules import ScenarioRules
from replaylab.runtime.static_encoder import load_static_encoder
from replaylab.sources.routellm import import_routellm_gsm8k

REPO = Path(__file__).resolve().parents[1]
GB = 2**30


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    outcomes = import_routellm_gsm8k(default_outcomes())
    values = router_values(0)  # conf/router/default.yaml as `python -m training` composes it
    values.pop("encoder")
    cfg = router_config(values)
    m = outcome_matrix(outcomes, cfg.cost, candidates=cfg.candidates)
    rules = ScenarioRules(cfg.rules).fit(m)
    per = max(1, math.ceil(args.rows / (m.n_prompts * 2.9)))  # ~2.9 turns a session
    t = time.perf_counter()
    sim = simulate_receipts(m, rules, RouterExplorationConfig(sessions_per_prompt=per, seed=0,
                                                              mean_session_gap_s=1.0))
    texts = outcomes.drop_duplicates("prompt_id").set_index("prompt_id")["prompt_text"].to_dict()
    led = deployment_ledger(sim, texts)
    rep = replay_outcomes(sim, m, texts, share=0.25, seed=0)
    made = time.perf_counter() - t
    cache = REPO / "outputs" / "cache"
    folder = static_encoder_folder({"cache_dir": str(cache)}, list(texts.values())[:500])
    embed, _ = cached_embed(load_static_encoder(folder), cache / "embeddings")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "receipts.parquet"
        led.to_parquet(path, index=False)
        n_rows, n_sessions = len(led), int(sim.stats["sessions"])
        del led, sim
        with PeakRSS(children=False) as rss:
            t0 = time.perf_counter()
            checked = read_ledger(path)
            t_read = time.perf_counter() - t0
            summary, _ = train_router_receipts(checked, rep, cfg, Path(tmp) / "run", embed,
                                               load_static_encoder(folder).encoder_id,
                                               head_scorer="numpy")
            wall = time.perf_counter() - t0
    out = {"rows": n_rows, "sessions": n_sessions, "generate_s": round(made, 1),
           "read_s": round(t_read, 1), "train_s": round(wall - t_read, 1),
           "wall_s": round(wall, 1), "rows_per_s": round(n_rows / wall),
           "peak_rss_gb": round(rss.peak / GB, 2), "stages_s": summary["timings_s"],
           "test_sessions": summary["ope"]["sessions"], "go": summary["go"],
           "diff_quality": summary["ope"]["diff"]["quality"],
           "diff_cost": summary["ope"]["diff"]["cost"]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
