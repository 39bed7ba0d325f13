"""The Rust reference scorer (scorers/rust, docs/specs/router-scorer.md) against the Python runtime.

The crate is built with `cargo build --offline --release` (the test module skips, saying
so, when `cargo` is neither on PATH nor in ~/.cargo/bin). Then:

- fast: its canonical JSON equals `canonical_json` on seeded random documents (floats of
  every magnitude, big ints, escapes, surrogate pairs), its SHA-256 equals hashlib's, its
  safetensors reader reads what the exporter's `safetensors_bytes` writes, value for value;
- slow (a static-tier router trained and exported by `python -m training pipeline=router
  router.encoder.tier=static`, the static encoder taken from the repo cache when present):
  `replaylab-route golden` passes; `route` gives the golden token ids and decisions bit
  for bit and probabilities within `static_prob_abs`, and the same as `replaylab.runtime.
  Router` on 400 more texts (GSM8K prompts, the encoder edge cases, mixed-script noise);
  a tampered file, an edited manifest, a missing file and a bad input line are refused
  with exit code 2 and one `error:` line; `cargo test --offline` passes with
  REPLAYLAB_ROUTER_ARTIFACT pointing at the artifact (the crate's own fixture, a tiny
  static-tier router, is checked without it: tests/scorers/test_rust_crate.py).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from replaylab.contracts.manifest import canonical_json
from tests.helpers.rust import (
    CRATE,
    build_binary,
    cargo_env,
    cargo_or_skip,
    router_texts,
    run_bin,
    train_static_router,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cargo() -> str:
    return cargo_or_skip()


@pytest.fixture(scope="module")
def binary(cargo) -> Path:
    return build_binary(cargo)


# ------------------------------------------------------------------------ fast: the parts
def _random_float(rng: random.Random) -> float:
    kind = rng.random()
    if kind < 0.4:  # any finite bit pattern: subnormals, huge, tiny
        while True:
            x = struct.unpack("<d", rng.randbytes(8))[0]
            if math.isfinite(x):
                return x
    if kind < 0.7:
        return rng.uniform(-1, 1) * 10.0 ** rng.randint(-8, 20)
    return rng.choice([0.0, -0.0, 1e-5, 1e16, 1e15, 123456789012345680.0, 0.1, 2.5, 1e-4,
                       9.999999999999999e-05, 5e-324, 1.7976931348623157e308])


def _random_str(rng: random.Random) -> str:
    pools = [range(0x20, 0x7F), range(0x0, 0x20), range(0xA0, 0x800), range(0x2000, 0x2070),
             range(0x4E00, 0x4F00), range(0x1F300, 0x1F650), range(0xE000, 0xE010)]
    return "".join(chr(rng.choice(rng.choice(pools))) for _ in range(rng.randint(0, 12)))


def _random_doc(rng: random.Random, depth: int = 0):
    r = rng.random()
    if depth > 3 or r < 0.45:
        return rng.choice([
            lambda: _random_float(rng), lambda: rng.randint(-10**30, 10**30),
            lambda: rng.randint(-5, 5), lambda: _random_str(rng),
            lambda: rng.choice([True, False, None])])()
    if r < 0.7:
        return [_random_doc(rng, depth + 1) for _ in range(rng.randint(0, 5))]
    return {_random_str(rng): _random_doc(rng, depth + 1) for _ in range(rng.randint(0, 5))}


def test_canonical_json_is_pythons(binary):
    rng = random.Random(0)
    docs = [_random_doc(rng) for _ in range(150)]
    docs.append([_random_float(rng) for _ in range(3000)])
    for i, doc in enumerate(docs):
        # fed in another form (indented, ASCII-escaped: \\u escapes, surrogate pairs)
        text = json.dumps(doc, indent=1, ensure_ascii=bool(i % 2))
        proc = run_bin(binary, "canon", stdin=text)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.encode("utf-8") == canonical_json(doc) + b"\n", text[:300]


def test_bad_json_is_refused(binary):
    for bad in ["{", "[1,]", "NaN", '"\\ud800"', "1e999", '{"a":1} x']:
        proc = run_bin(binary, "canon", stdin=bad)
        assert proc.returncode == 2 and proc.stderr.startswith("error: invalid_json"), bad


def test_sha256_is_hashlibs(binary, tmp_path):
    rng = random.Random(1)
    files = []
    for n in (0, 1, 55, 56, 63, 64, 65, 119, 120, 1000, (1 << 20) + 3):
        f = tmp_path / f"f{n}"
        f.write_bytes(rng.randbytes(n))
        files.append(f)
    proc = run_bin(binary, "sha256", *map(str, files))
    assert proc.returncode == 0, proc.stderr
    got = [line.split()[0] for line in proc.stdout.splitlines()]
    assert got == [hashlib.sha256(f.read_bytes()).hexdigest() for f in files]


def test_safetensors_reader_reads_the_exporters_files(binary, tmp_path):
    from replaylab.artifacts.static_export import safetensors_bytes

    rng = np.random.default_rng(2)
    tensors = {"embeddings": rng.standard_normal((7, 5)).astype(np.float32),
               "layer0.bias": (rng.standard_normal(3) * 1e-30).astype(np.float32),
               "tok_mean": np.array([3.25], np.float32),
               "z": np.array([np.finfo(np.float32).max, -0.0, 1e-45], np.float32)}
    f = tmp_path / "t.safetensors"
    f.write_bytes(safetensors_bytes(tensors, {"encoder_id": "x"}))
    proc = run_bin(binary, "safetensors", str(f))
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert sorted(got) == sorted(tensors)
    for name, arr in tensors.items():
        assert got[name]["shape"] == list(arr.shape)
        assert got[name]["data"] == [float(x) for x in arr.reshape(-1)]  # exact
    data = bytearray(f.read_bytes())
    data[:8] = (len(data)).to_bytes(8, "little")  # header length past the end
    f.write_bytes(bytes(data))
    proc = run_bin(binary, "safetensors", str(f))
    assert proc.returncode == 2 and proc.stderr.startswith("error: safetensors")


# ------------------------------------------------------------------ slow: a real artifact
@pytest.fixture(scope="module")
def static_router(tmp_path_factory, cargo) -> Path:
    """A static-tier router artifact from the real pipeline (see train_static_router)."""
    return train_static_router(tmp_path_factory.mktemp("rust-scorer") / "run")


def _route(binary: Path, art: Path, queries: list[dict]) -> list[dict]:
    stdin = "".join(json.dumps(q) + "\n" for q in queries)
    proc = run_bin(binary, "route", str(art), stdin=stdin)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(out) == len(queries)
    return out


@pytest.mark.slow
def test_golden_subcommand_passes(binary, static_router):
    proc = run_bin(binary, "golden", str(static_router))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(proc.stdout)
    n = summary["n_cases"]
    assert summary["ok"] and n > 0
    assert summary["token_ids_equal"] == n and summary["decisions_equal"] == n
    assert summary["static_prob_max_abs"] <= summary["static_prob_abs"] == 1e-5
    assert summary["encoder"]["ok"] and summary["encoder"]["token_ids_equal"] == \
        summary["encoder"]["n_cases"]


@pytest.mark.slow
def test_route_is_the_golden_vectors_and_the_python_router(binary, static_router):
    from replaylab.runtime import Router
    from replaylab.runtime.routing import decision_margin

    golden = json.loads((static_router / "golden.json").read_text())
    tol = golden["tolerances"]["static_prob_abs"]
    cases = golden["cases"]
    got = _route(binary, static_router, [c["input"] for c in cases])
    for c, g in zip(cases, got, strict=True):
        e = c["expected"]["static"]
        assert g["token_ids"] == e["token_ids"]  # bit for bit
        assert g["candidate"] == e["candidate"]  # every golden decision, stable or not
        assert np.abs(np.array(g["success_prob"]) - e["success_prob"]).max() <= tol

    # the Python static tier on many more texts, categories and lengths
    router = Router.load(static_router)
    assert router.loaded and router.tier == "static", router.reason
    vocab = list(router.head.vocabulary)
    texts = router_texts()
    queries = [{"text": t, "category": [None, *vocab, "not-a-label"][i % (len(vocab) + 2)],
                "prompt_tokens": [None, None, 17.0, 0.0, -3.0, 4000.0][i % 6]}
               for i, t in enumerate(texts)]
    got = _route(binary, static_router, queries)
    want = [router.route(q["text"], q["category"], q["prompt_tokens"]) for q in queries]
    assert not any(w.fallback for w in want)
    ids = router.encoder.token_ids(texts)
    assert [g["token_ids"] for g in got] == ids
    p_py = np.array([[w.scores[c] for c in router.candidates] for w in want])
    p_rs = np.array([g["success_prob"] for g in got])
    assert np.abs(p_py - p_rs).max() <= tol
    margin = decision_margin(p_py, router.threshold, fallback=router.fallback,
                             rule=router.rule)
    moved = tol * (2.0 if router.rule == "margin" else 1.0)
    stable = margin > moved
    assert stable.mean() > 0.9
    same = np.array([g["candidate"] == w.candidate for g, w in zip(got, want, strict=True)])
    assert same[stable].all()


@pytest.mark.slow
def test_tampered_artifacts_and_bad_input_are_refused(binary, static_router, tmp_path):
    def refused(art: Path, reason: str, stdin: str | None = None, cmd: str = "golden") -> None:
        proc = run_bin(binary, cmd, str(art), stdin=stdin)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {reason}"), proc.stderr

    bad = tmp_path / "router"
    shutil.copytree(static_router, bad)  # copies: the cache's hard-linked files stay intact
    emb = bad / "encoder" / "embeddings.safetensors"
    good = emb.read_bytes()
    data = bytearray(good)
    data[-1] ^= 1
    emb.write_bytes(bytes(data))
    refused(bad, "hash_mismatch")
    refused(bad, "hash_mismatch", stdin='{"text": "hi"}\n', cmd="route")
    emb.write_bytes(good)
    manifest = bad / "manifest.json"
    body = manifest.read_text()
    manifest.write_text(body.replace('"normalized":"l2"', '"normalized":"L2"', 1))
    refused(bad, "content_hash")
    manifest.write_text(body)
    (bad / "encoder" / "vocab.txt").unlink()
    refused(bad, "missing_file")
    refused(tmp_path / "nowhere", "missing_artifact")
    refused(static_router, "bad_input", stdin='{"text": "ok"}\n{"text": 3}\n', cmd="route")
    refused(static_router, "bad_input", stdin='{"text": "\\ud800"}\n', cmd="route")


@pytest.mark.slow
def test_cargo_test_against_the_artifact(cargo, static_router):
    env = {**cargo_env(cargo), "REPLAYLAB_ROUTER_ARTIFACT": str(static_router)}
    # --nocapture: the tests' stderr names each artifact they checked (the fixture, then this)
    proc = subprocess.run([cargo, "test", "--offline", "--", "--nocapture"], cwd=CRATE, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "golden_vectors_route_identically ... ok" in proc.stdout
    assert "a_tampered_artifact_is_refused ... ok" in proc.stdout
    assert f"{static_router}: " in proc.stderr and "REPLAYLAB_ROUTER_ARTIFACT not set" not in proc.stderr
