"""pipeline=router compute=dask over a receipts ledger dataset: the one receipts pipeline
(pipelines/router_receipts.py) on the Dask engine against the same on the local engine.

A GSM8K receipts ledger (the logging policy's sessions with 8% explored, 25% of the
openings replayed offline) written as a 4-file Parquet dataset; the real MiniLM ONNX
encoder export; the session's LocalCluster of 2 worker processes (conftest
`dask_address`). The Dask run (the dataset read per partition on the workers) must equal
the local run (the whole ledger validated in memory, one partition): same split, head,
threshold, estimates, intervals, verdict; refuse what the local run refuses with the same
line; and pass the exported artifact's served check at the entry point.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.conftest import REPO
from tests.helpers.router import CHEAP, STRONG, receipts_world

pytestmark = pytest.mark.slow


def router_cfg(**over):
    from replaylab.router.pipeline_config import router_config

    base = {"candidates": [CHEAP, STRONG],
            "cost": {"call_cost_usd": {CHEAP: 0.00012, STRONG: 0.01235}},
            "head": {"max_epochs": 20, "num_threads": 1, "teachers": 1},
            "head_select": {"enabled": False},
            "receipts": {"n_boot": 200, "min_explored_per_candidate": 5}, "spread_seeds": 2,
            "replay_plan": {"budget": 50}}
    base.update(over)
    return router_config(base)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The receipts ledger (whole, and as a 4-file dataset), its replays, the encoder."""
    from replaylab.artifacts.encoder_export import export_encoder
    from replaylab.router.encoder import load_minilm

    root = tmp_path_factory.mktemp("router_dask")
    w = receipts_world(router_cfg())
    led, rep, texts = w.ledger, w.replays, w.texts
    ds = root / "ledger"
    ds.mkdir()
    shuffled = led.sample(frac=1.0, random_state=1)  # sessions spread over files and rows
    for i, chunk in enumerate(np.array_split(np.arange(len(led)), 4)):
        shuffled.iloc[chunk].to_parquet(ds / f"part-{i}.parquet", index=False)
    rep_file = root / "replays.parquet"
    rep.to_parquet(rep_file, index=False)
    cache = root / "cache"
    folder = cache / "encoder-minilm"
    export_encoder(load_minilm(), folder, parity_texts=list(texts.values())[:40], int8=False,
                   overwrite=True)
    return {"ledger": led, "replays": rep, "dataset": ds, "replay_file": rep_file,
            "cache": cache, "folder": folder}


def spec_of(world):
    from replaylab.router.worker_encoder import EncoderSpec
    from replaylab.runtime.encoder import load_encoder

    enc = load_encoder(world["folder"], variant="fp32")
    return enc, EncoderSpec("minilm", str(world["folder"]), enc.encoder_id, enc.dimension,
                            "fp32", 1, str(world["cache"] / "embeddings"))


@pytest.fixture(scope="module")
def both(world, dask_address, tmp_path_factory):
    from replaylab.compute import ComputeConfig, engine
    from replaylab.contracts import validate_ledger
    from replaylab.pipelines.router_receipts import train_router_receipts
    from replaylab.router.embed_cache import cached_embed

    enc, spec = spec_of(world)
    embed, _ = cached_embed(enc, world["cache"] / "embeddings")
    cfg = router_cfg()
    out_l, out_d = tmp_path_factory.mktemp("local"), tmp_path_factory.mktemp("dask")
    local = train_router_receipts(validate_ledger(world["ledger"]), world["replays"], cfg,
                                  out_l, embed, enc.encoder_id)
    lines: list[str] = []
    with engine(ComputeConfig(kind="dask", address=dask_address)) as eng:
        dask = train_router_receipts(eng.read_ledger(str(world["dataset"])), world["replays"],
                                     cfg, out_d, spec, engine=eng, progress=lines.append)
    return local, dask, out_l, out_d, lines


def leaves(x, path=""):
    if isinstance(x, dict):
        for k, v in x.items():
            yield from leaves(v, f"{path}/{k}")
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from leaves(v, f"{path}[{i}]")
    else:
        yield path, x


SKIP = ("/timings_s", "/artifacts", "/replay_plan/path", "/compute")


def test_dask_summary_equals_local(both):
    """Every figure of the summary (splits, counts, head, threshold, every estimate and
    interval, the verdict, the seed spread) equals the local run's: exactly for counts and
    text, to 1e-9 relative for floats (sums taken in another order)."""
    (s_l, _), (s_d, _), *_ = both
    a = {p: v for p, v in leaves(s_l) if not p.startswith(SKIP)}
    b = {p: v for p, v in leaves(s_d) if not p.startswith(SKIP)}
    assert a.keys() == b.keys()
    for p, v in a.items():
        w = b[p]
        if isinstance(v, float) and isinstance(w, float):
            assert (math.isnan(v) and math.isnan(w)) or math.isclose(v, w, rel_tol=1e-9,
                                                                     abs_tol=1e-12), p
        else:
            assert v == w, p
    assert len(a) > 200 and s_d["go"] == s_l["go"]
    # the gain's attribution (own decisions / exploration / replays) is among the leaves
    assert s_l["attribution"]["status"] == s_d["attribution"]["status"] == "done"
    assert any(p.startswith("/attribution/increments/replays") for p in a)
    assert s_d["compute"]["kind"] == "dask" and s_l["compute"]["kind"] == "local"
    assert s_d["compute"]["partitions"] == 4 and s_l["compute"]["partitions"] == 1
    assert s_d["compute"]["driver_rows"] == s_l["compute"]["driver_rows"]


def test_dask_files_equal_local(both):
    """The test decisions, the curve and the replay plan the workers write equal the local
    files; the label rows are the same decisions."""
    (s_l, _), (s_d, _), out_l, out_d, _ = both
    dl = pd.read_parquet(out_l / "router_decisions_test.parquet").sort_values("prompt_id")
    dd = pd.read_parquet(out_d / "router_decisions_test.parquet").sort_values("prompt_id")
    pd.testing.assert_frame_equal(dl.reset_index(drop=True), dd.reset_index(drop=True),
                                  check_dtype=False)
    cl, cd = (pd.read_parquet(o / "router_curves_test.parquet") for o in (out_l, out_d))
    pd.testing.assert_frame_equal(cl, cd, rtol=1e-9)
    pl, pdk = (pd.read_json(o / "replay_plan.jsonl", lines=True) for o in (out_l, out_d))
    assert len(pl) == len(pdk) == 50
    np.testing.assert_allclose(pl["priority"], pdk["priority"], rtol=1e-12)
    pairs = [set(zip(p["prompt_id"], p["candidate"], strict=True)) for p in (pl, pdk)]
    assert pairs[0] == pairs[1]
    labels_l = pd.read_parquet(out_l / "router_labels.parquet")
    labels_d = pd.read_parquet(out_d / "router_labels.parquet")
    for src in ("replay", "exploration"):
        assert sorted(labels_l.loc[labels_l["label_source"] == src, "opening_request_id"]) \
            == sorted(labels_d.loc[labels_d["label_source"] == src, "opening_request_id"])
    assert len(labels_l) == len(labels_d)


def test_dask_served_sample_and_stages(both):
    """The test decisions brought back for the artifact's check are the local run's for
    the same sessions; every stage said its line."""
    (_, run_l), (_, run_d), *_, lines = both
    got = dict(zip(run_d.test_sessions, run_d.test_choice, strict=True))
    want = dict(zip(run_l.test_sessions, run_l.test_choice, strict=True))
    assert got and all(want[s] == c for s, c in got.items())
    assert len(got) == len(want)  # a small ledger: every test decision comes back
    starts = [x.split(":")[0] for x in lines if x.startswith("dask stage") and " done " not in x]
    ends = [x.split(" done ")[0] for x in lines if x.startswith("dask stage") and " done " in x]
    assert starts == ends == [f"dask stage {i}/8" for i in range(1, 9)]


def test_dask_refuses_as_local(world, dask_address, tmp_path):
    """Too little exploration: the same ReceiptsError line on either engine."""
    from replaylab.compute import ComputeConfig, engine
    from replaylab.contracts import validate_ledger
    from replaylab.pipelines.router_receipts import train_router_receipts
    from replaylab.router.receipts import ReceiptsError

    enc, spec = spec_of(world)
    cfg = router_cfg(receipts={"n_boot": 200, "min_explored_per_candidate": 10_000})
    with pytest.raises(ReceiptsError) as local:
        train_router_receipts(validate_ledger(world["ledger"]), None, cfg, tmp_path / "l",
                              lambda t: np.zeros((len(t), 384), np.float32), enc.encoder_id)
    with pytest.raises(ReceiptsError) as dask, \
            engine(ComputeConfig(kind="dask", address=dask_address)) as eng:
        train_router_receipts(eng.read_ledger(str(world["dataset"])), None, cfg, tmp_path / "d",
                              spec, engine=eng)
    assert str(dask.value) == str(local.value) and "too little exploration" in str(dask.value)


def test_entry_point_on_dask(world, dask_address, tmp_path):
    """`python -m training pipeline=router compute=dask data.ledger=DIR`: exit 0, the exported
    artifact makes the judged decisions (served check), the summary says the cluster."""
    out = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    res = subprocess.run(
        [sys.executable, "-m", "training", "pipeline=router", "compute=dask",
         f"compute.address={dask_address}",
         f"data.ledger={world['dataset']}", f"data.replays={world['replay_file']}",
         f"router.encoder.cache_dir={world['cache']}", "router.encoder.int8=false",
         "router.head_select.enabled=false", "router.head.teachers=1",
         "router.head.max_epochs=20", "router.spread_seeds=1", "router.receipts.n_boot=200",
         "router.evaluation.attribution=off",  # the parity above compares it; not about it here
         "router.receipts.min_explored_per_candidate=5", "tracking=off",
         f"hydra.run.dir={out}"], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["compute"]["kind"] == "dask" and s["compute"]["n_workers"] == 2
    assert s["compute"]["address"] == dask_address
    assert s["served_check"]["agreement"] == 1.0 and s["served_check"]["n"] > 100
    assert s["replays"]["file"]["rows_read"] == len(world["replays"])
    assert Path(s["artifacts"]["router"], "manifest.json").is_file()
    verdict = [x for x in (res.stdout + res.stderr).splitlines() if x.startswith("router: ")]
    assert verdict and verdict[-1].startswith(("router: GO", "router: NO-GO"))
    assert s["verdict"] == verdict[-1]
