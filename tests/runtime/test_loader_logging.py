"""`DemandPredictor.load` and `Router.load` log exactly one WARNING (reason code and path,
on the `replaylab` logger hierarchy) when they fall back, and nothing on a good load."""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

import pytest

from replaylab.contracts.manifest import build_manifest, write_manifest
from replaylab.runtime import DemandPredictor, Router
from tests.conftest import edit_golden


def _warnings(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.WARNING]


def _one_warning(caplog, logger: str, reason: str, path: Path | None) -> logging.LogRecord:
    got = _warnings(caplog)
    assert len(got) == 1, [r.getMessage() for r in got]
    record = got[0]
    assert record.levelno == logging.WARNING and record.name == logger
    assert record.name.startswith("replaylab.")  # reaches handlers set on "replaylab"
    assert f"reason {reason}" in record.getMessage()
    assert str(path) in record.getMessage()
    return record


# ---------------------------------------------------------------- demand


@pytest.fixture(scope="module")
def demand_artifact(tmp_path_factory) -> Path:
    """A small demand run on a synthetic ledger, exported (about 5 s)."""
    from replaylab.artifacts.demand_export import export_demand
    from replaylab.demand import DemandConfig
    from replaylab.pipelines.demand import train_demand
    from replaylab.pipelines.project import LedgerInput, load_ledger
    from replaylab.projection import ProjectionConfig, SplitConfig
    from replaylab.sources.synthetic import SyntheticLedgerConfig

    out = tmp_path_factory.mktemp("demand")
    loaded = load_ledger(LedgerInput(
        synthetic=SyntheticLedgerConfig(n_sessions=1200, sessions_per_s=0.25)))
    summary, run = train_demand(loaded, ProjectionConfig(), SplitConfig(embargo_ms=60_000),
                                DemandConfig(), out)
    return export_demand(run, summary, out / "artifacts" / "demand")


def test_demand_good_load_logs_no_warning(demand_artifact, caplog):
    caplog.set_level(logging.DEBUG, logger="replaylab")
    p = DemandPredictor.load(demand_artifact)
    assert p.loaded and p.golden_status == "passed"
    assert _warnings(caplog) == []


def test_demand_tampered_artifact_logs_one_warning(demand_artifact, tmp_path, caplog):
    art = tmp_path / "a"
    shutil.copytree(demand_artifact, art)
    data = bytearray((art / "model.onnx").read_bytes())
    data[len(data) // 2] ^= 0x01
    (art / "model.onnx").write_bytes(bytes(data))
    caplog.set_level(logging.DEBUG, logger="replaylab")
    p = DemandPredictor.load(art)
    assert not p.loaded and p.reason == "hash_mismatch"
    rec = _one_warning(caplog, "replaylab.runtime.demand", "hash_mismatch", art)
    assert "max_tokens_cap" in rec.getMessage()  # which baseline answers instead


@pytest.mark.parametrize("case", ["missing", "none", "expired", "unsigned", "golden"])
def test_demand_each_fallback_logs_one_warning(demand_artifact, tmp_path, caplog, case):
    caplog.set_level(logging.DEBUG, logger="replaylab")
    path, kw = demand_artifact, {}
    if case == "missing":
        path = tmp_path / "nowhere"
    elif case == "none":
        path = None
    elif case == "expired":
        later = time.time() + 400 * 86400
        kw = {"clock": lambda: later}
    elif case == "unsigned":
        kw = {"hmac_key": b"k"}
    else:
        path = edit_golden(shutil.copytree(demand_artifact, tmp_path / "g"),
                           lambda doc: doc["cases"][0].update(input=7))
    p = DemandPredictor.load(path, **kw)
    assert not p.loaded
    _one_warning(caplog, "replaylab.runtime.demand", p.reason, path)
    assert p.reason == {"missing": "missing_artifact", "none": "missing_artifact",
                        "expired": "expired", "unsigned": "missing_signature",
                        "golden": "golden_mismatch"}[case]


# ---------------------------------------------------------------- router


def _fake_router(folder: Path) -> Path:
    """A verified manifest of kind router over a router.json (no model: enough for the
    checks that fail before one is read)."""
    folder.mkdir(parents=True)
    (folder / "router.json").write_text('{"candidates": ["weak", "strong"]}')
    m = build_manifest(folder, kind="router", version="1.0.0", contracts={}, valid_days=30,
                       features=[], outputs={}, calibration={}, training={}, runtime={},
                       fallback={})
    write_manifest(folder, m)
    return folder


@pytest.mark.parametrize("case, reason", [("missing", "missing_artifact"),
                                          ("tampered", "hash_mismatch"),
                                          ("kind", "kind"),
                                          ("no_encoder", "unreadable")])
def test_router_each_fallback_logs_one_warning(demand_artifact, tmp_path, caplog, case, reason):
    caplog.set_level(logging.DEBUG, logger="replaylab")
    if case == "missing":
        path = tmp_path / "nowhere"
    elif case == "kind":
        path = demand_artifact  # a verified artifact, of another kind
    else:
        path = _fake_router(tmp_path / "r")
        if case == "tampered":
            (path / "router.json").write_text('{"candidates": ["weak", "STRONG"]}')
    r = Router.load(path, fallback_candidate="strong")
    assert not r.loaded and r.reason == reason
    rec = _one_warning(caplog, "replaylab.runtime.router", reason, path)
    assert "strong" in rec.getMessage()
    assert r.route("hello").candidate == "strong"
