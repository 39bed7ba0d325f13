"""The Rust crate (scorers/rust) tests itself on its committed fixture artifacts.

scorers/rust/tests/fixtures holds a tiny demand artifact, a tiny static-tier router
artifact and a tiny MiniLM-tier one (`router-minilm`: a 1-layer BERT of all-MiniLM-L6-v2's
shape, for routing on the host's embedding), written by the real exporters through
scripts/make_rust_fixtures.py. Here:

- Python side (no cargo needed): every fixture manifest verifies with
  `replaylab.contracts.manifest.verify_manifest` and lists exactly the files of its
  folder; the Python runtime loads both artifacts with their golden vectors passed
  (`Router.load`, `DemandPredictor.load`);
- the fixtures hold nothing of the machine that wrote them: their golden.json files record
  `golden.ANY_MACHINE`, not a CPU model, flags or int8 probe; the manifests a fixed
  creation time; no file an absolute path (docs/specs/artifacts.md "What a committed
  fixture holds");
- regenerating the fixtures with the script (into a temp folder, ~60 s) reproduces every
  committed file's sha256, on any x86-64 CPU: the fixtures are what the exporters write
  today (rerun the script and commit when an exporter changes on purpose). The MiniLM
  tier's golden vectors are onnxruntime's, whose fp32 kernels differ by CPU in the last
  bits: there its golden files (and the manifests that hash them) are compared within the
  artifact's own fp32 tolerances, every other file byte for byte;
- `cargo test --offline` in the crate, no environment variable set, passes and checks
  the fixtures (manifests, golden vectors, tampered copies refused); skipped, saying so,
  without cargo.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from replaylab.contracts.golden import ANY_MACHINE, GOLDEN_FILE
from replaylab.contracts.manifest import verify_manifest
from tests.helpers.rust import CRATE, cargo_env, cargo_or_skip

REPO = Path(__file__).resolve().parents[2]
FIXTURES = CRATE / "tests" / "fixtures"
SCRIPT = REPO / "scripts" / "make_rust_fixtures.py"
# (fixture, folder inside it, kind)
MANIFESTS = [("demand", "", "demand"), ("router", "", "router"), ("router", "encoder", "encoder"),
             ("router-minilm", "", "router"), ("router-minilm", "encoder", "encoder")]
FIXTURE_NAMES = ("demand", "router", "router-minilm")
# router-minilm files computed by onnxruntime (its CPU-dependent fp32 kernels), and the
# manifests that pin their hashes: compared within tolerance (`_same_minilm_golden`)
ONNXRUNTIME_FILES = {"golden.json", "manifest.json", "encoder/golden.json", "encoder/manifest.json"}


def _files(folder: Path) -> dict[str, str]:
    """{relative POSIX path: sha256} of every file under `folder`."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_fixtures_are_small():
    files = [p for p in FIXTURES.rglob("*") if p.is_file()]
    assert {p.relative_to(FIXTURES).parts[0] for p in files} == set(FIXTURE_NAMES)
    assert sum(p.stat().st_size for p in files) < 1_000_000


@pytest.mark.parametrize(("name", "sub", "kind"), MANIFESTS)
def test_fixture_manifests_verify_in_python(name, sub, kind):
    folder = FIXTURES / name / sub
    manifest = verify_manifest(folder, required_kind=kind)
    listed = {e["path"] for e in manifest["files"]}
    assert listed == set(_files(folder)) - {"manifest.json"}


@pytest.mark.parametrize(("name", "sub", "kind"), MANIFESTS)
def test_fixtures_hold_nothing_of_the_machine_that_wrote_them(name, sub, kind):
    folder = FIXTURES / name / sub
    golden = json.loads((folder / GOLDEN_FILE).read_text(encoding="utf-8"))
    # no CPU model, flags or int8 probe: another CPU regenerates the same bytes
    assert golden["built_on"] == dict(ANY_MACHINE), golden["built_on"]
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["created_at"] == "2026-01-01T00:00:00Z"  # scripts/make_rust_fixtures.py
    for path in folder.iterdir():
        if path.is_file():
            data = path.read_bytes()
            for marker in (str(REPO), "cpu_flags", "model name"):
                assert marker.encode() not in data, (path.name, marker)
            # no absolute path under a temporary, home or root folder of the writer
            assert not re.search(rb"/(?:tmp|home|root|Users)/", data), path.name


def test_fixtures_load_with_their_golden_vectors_in_python():
    from replaylab.runtime import DemandPredictor, Router

    router = Router.load(FIXTURES / "router")
    assert router.loaded and router.tier == "static", router.reason
    assert router.golden_status == "passed"
    minilm = Router.load(FIXTURES / "router-minilm")
    assert minilm.loaded and minilm.tier == "minilm", minilm.reason
    assert minilm.golden_status == "passed"
    # its golden triples: the runtime's own encoder reproduces them
    assert minilm.check_host_encoder(minilm.encoder.encode_one).ok
    demand = DemandPredictor.load(FIXTURES / "demand", online=False)
    assert demand.loaded, demand.reason
    assert demand.golden_status == "passed"


def test_regenerated_fixtures_are_the_committed_ones(tmp_path):
    # Byte for byte on any x86-64 CPU: the script pins the machine description
    # (golden.ANY_MACHINE) and the numeric kernels (PINNED_NUMERICS). Under `make
    # test-haswell` pytest runs in qemu-user, whose child processes run natively unless
    # started through it: REPLAYLAB_EMULATOR (the qemu command line) puts the script there too.
    emulator = shlex.split(os.environ.get("REPLAYLAB_EMULATOR", ""))
    proc = subprocess.run([*emulator, sys.executable, str(SCRIPT), "--out", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True,
                          timeout=2400 if emulator else 600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in FIXTURE_NAMES:
        got, want = _files(tmp_path / name), _files(FIXTURES / name)
        differ = sorted(k for k in got.keys() | want.keys() if got.get(k) != want.get(k)
                        and not (name == "router-minilm" and k in ONNXRUNTIME_FILES
                                 and k in got and k in want
                                 and _same_minilm_golden(tmp_path / name, FIXTURES / name, k)))
        assert not differ, (f"{name}: {differ} differ from the committed fixtures; if an exporter "
                            f"changed on purpose, run `python {SCRIPT.relative_to(REPO)}` and "
                            "commit scorers/rust/tests/fixtures")


def _same_minilm_golden(got: Path, want: Path, rel: str) -> bool:
    """A router-minilm golden file or manifest regenerated on another CPU: the same cases
    and decisions, P(success) within fp32_prob_abs, every vector's cosine >= 0.99999 (the
    encoder's fp32_min_cosine); a manifest the same but for the hashes and parity figures
    of the onnxruntime files."""
    from replaylab.contracts.golden import row_cosines

    a = json.loads((got / rel).read_text(encoding="utf-8"))
    b = json.loads((want / rel).read_text(encoding="utf-8"))
    if rel.endswith("manifest.json"):
        def stable(m: dict) -> dict:
            return {**{k: m[k] for k in ("kind", "version", "features", "outputs", "runtime",
                                         "created_at", "valid_until")},
                    "files": [(f["path"], f["sha256"]) for f in m["files"]
                              if f["path"] not in ONNXRUNTIME_FILES
                              and f"{rel.rsplit('/', 1)[0]}/{f['path']}" not in ONNXRUNTIME_FILES]}
        return stable(a) == stable(b)
    if a["tolerances"] != b["tolerances"] or len(a["cases"]) != len(b["cases"]):
        return False
    for ca, cb in zip(a["cases"], b["cases"], strict=True):
        ea, eb = ca["expected"], cb["expected"]
        if ca["input"] != cb["input"] or set(ea) != set(eb):
            return False
        if rel == "golden.json":  # the router's: {variant: {success_prob, candidate, ...}}
            ea, eb = ea["fp32"], eb["fp32"]
            if ea["candidate"] != eb["candidate"] or max(
                    abs(x - y) for x, y in zip(ea["success_prob"], eb["success_prob"],
                                               strict=True)) > a["tolerances"]["fp32_prob_abs"]:
                return False
            vectors = [("embedding", ea["embedding"], eb["embedding"])]
        else:  # the encoder's: token ids, the reference and fp32 vectors
            if ea["token_ids"] != eb["token_ids"]:
                return False
            vectors = [(k, ea[k], eb[k]) for k in ea if k != "token_ids"]
        for _, va, vb in vectors:
            if row_cosines([va], [vb])[0] < 0.99999:
                return False
    return True


def test_cargo_test_checks_the_fixtures():
    cargo = cargo_or_skip()
    env = {k: v for k, v in cargo_env(cargo).items()
           if k not in ("REPLAYLAB_ROUTER_ARTIFACT", "REPLAYLAB_DEMAND_ARTIFACT")}
    # --nocapture: the tests' stderr says which artifacts they checked
    proc = subprocess.run([cargo, "test", "--offline", "--", "--nocapture"], cwd=CRATE, env=env,
                          capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "FAILED" not in proc.stdout
    for test in ("golden_vectors_route_identically", "golden_hints_are_reproduced",
                 "a_tampered_artifact_is_refused", "malformed_requests_fall_back",
                 "binder_openings_are_the_routers_choice_or_explored",
                 "the_fixtures_verify_and_list_every_file", "the_checks_refuse_with_their_reason",
                 "the_minilm_tier_loads_for_embedding_only_routing",
                 "a_host_encoder_is_checked_on_the_golden_triples"):
        assert f"test {test} ... ok" in proc.stdout, test
    assert "checked the fixture router alone" in proc.stderr
    assert "checked the fixture demand alone" in proc.stderr
    assert f"{FIXTURES / 'router'}: " in proc.stderr  # the golden summaries, per artifact
    assert f"{FIXTURES / 'demand'}: " in proc.stderr
