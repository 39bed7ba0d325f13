"""Golden vectors: inputs and expected outputs carried by every artifact, checked where it is served.

An artifact built on one machine is served on another, and onnxruntime picks
its kernels by CPU (AVX2, AVX-512, VNNI, AMX): the same file gives slightly
different floats, and for int8 possibly a different embedding space. So every
artifact folder carries `golden.json`, listed (hashed) in its manifest like
any other file:

    {"format": 1, "kind": "<manifest kind>",
     "tolerances": {"<name>": <bound>, ...},
     "cases": [{"input": {...}, "expected": {...}}, ...],
     "built_on": {"machine": "x86_64", "cpu_flags": [...], "onnxruntime": "1.x"}}

`built_on` describes the exporting machine (`this_machine()`), for whoever reads a
failed check; no check reads it. A committed fixture, which must be the same
bytes wherever it is regenerated, records `ANY_MACHINE` instead
(`golden_document(..., built_on=ANY_MACHINE)`, docs/specs/artifacts.md "What a
committed fixture holds").

The meaning of each input, expected field and tolerance is the artifact's own
(the kind's runtime loader documents it: `replaylab.runtime.encoder`,
`replaylab.runtime.router`, `replaylab.runtime.demand`). This module holds only
what they share: the file format, reading it through the verified manifest,
CPU identification, and the comparisons. A check returns a `GoldenCheck`; it
never raises for a mismatch (the loader turns `ok=False` into its documented
fallback with `reason` = `golden_mismatch`).

Standard library + numpy: the serving runtime imports this.
"""

from __future__ import annotations

import base64
import functools
import json
import platform
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from replaylab.contracts.errors import InputError
from replaylab.contracts.manifest import ManifestError, read_verified_file

GOLDEN_FILE = "golden.json"
GOLDEN_FORMAT = 1
MISMATCH = "golden_mismatch"  # the reason code a loader reports when a check fails
# CPU features that change which onnxruntime (MLAS) kernels run; reported, never branched on.
KERNEL_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni",
                "amx_int8", "amx_bf16", "asimd", "sve")


class ParityError(InputError, ValueError):
    """A required output of an export misses its parity gate (nothing is published).

    Optional outputs (the int8 encoder) never raise this: they are left out and
    the export says why. The entry points turn it into one line and exit code 2.
    """


class GoldenError(ManifestError):
    """golden.json is absent, unreadable or malformed (`reason` says which)."""


@dataclass
class GoldenCheck:
    """The outcome of checking an artifact's golden vectors on this machine.

    `figures` holds the measured statistic beside each tolerance (for the
    summary and the load report); `failed` names each tolerance that was
    missed; `seconds` is the wall time of the check (its load-time cost).
    """

    ok: bool
    figures: dict[str, Any] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)
    seconds: float = 0.0
    cpu: dict[str, Any] = field(default_factory=dict)

    @property
    def reason(self) -> str | None:
        return None if self.ok else MISMATCH

    def as_dict(self) -> dict:
        return {"ok": self.ok, "figures": self.figures, "failed": list(self.failed),
                "seconds": self.seconds, "cpu": self.cpu}


# A 1x64 MatMulInteger of u8 255 x s8 127 (B a constant, as in the quantized encoder):
# exactly 2,072,640 where onnxruntime's kernel accumulates in int32 (VNNI, AMX, ARM),
# 1,048,544 (32 x 32767) where it sums u8*s8 pairs in saturating int16 (AVX2's
# vpmaddubsw). 163 bytes, built with onnx.helper (scripts/int8_cpu_parity.py); stored
# serialized so the runtime needs no `onnx` package.
_U8S8_PROBE = base64.b64decode(
    "CAg6mAEKGAoBYQoBYhIBeSINTWF0TXVsSW50ZWdlchIFcHJvYmUqSwhACAEQA0IBYkpAf39/f39/f39/f39/f39/"
    "f39/f39/f39/f39/f39/f39/f39/f39/f39/f39/f39/f39/f39/f39/f39/f39/f1oTCgFhEg4KDAgCEggKAggB"
    "CgIIQGITCgF5Eg4KDAgGEggKAggBCgIIAUIECgAQEQ==")
U8S8_EXACT = 255 * 127 * 64


@functools.lru_cache(maxsize=1)
def int8_kernel_probe() -> dict[str, Any]:
    """Which int8 kernel family onnxruntime runs here: {"u8s8_saturates": bool, "u8s8": int}.

    The flags in /proc/cpuinfo do not say it (under qemu-user they are the host's);
    running the kernel does. None values when onnxruntime is absent or refuses."""
    try:
        import onnxruntime as ort  # noqa: PLC0415 - optional here; the runtime has it

        sess = ort.InferenceSession(_U8S8_PROBE, providers=["CPUExecutionProvider"])
        got = int(sess.run(None, {"a": np.full((1, 64), 255, dtype=np.uint8)})[0][0, 0])
    except Exception:  # noqa: BLE001 - a probe: report unknown rather than fail a load
        return {"u8s8": None, "u8s8_saturates": None}
    return {"u8s8": got, "u8s8_saturates": got != U8S8_EXACT}


def cpu_info() -> dict[str, Any]:
    """This machine's architecture, the kernel-relevant CPU flags (Linux /proc/cpuinfo;
    elsewhere only the architecture) and the int8 kernel probe (`int8_kernel_probe`).
    Under qemu-user the flags are the host's; the probe is the emulated CPU's."""
    flags: set[str] = set()
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("flags", "Features") and not flags:
                    flags = set(value.split())
                elif key == "model name" and not model:
                    model = value.strip()
    except OSError:
        pass
    return {"machine": platform.machine(), "model": model,
            "cpu_flags": sorted(f for f in KERNEL_FLAGS if f in flags), **int8_kernel_probe()}


def _onnxruntime_version() -> str | None:
    try:
        import onnxruntime  # noqa: PLC0415 - reported only, optional at build time
    except ImportError:  # pragma: no cover - the builders all have onnxruntime
        return None
    return onnxruntime.__version__


def this_machine() -> dict[str, Any]:
    """This machine as golden.json's `built_on` records it: `cpu_info()` and the onnxruntime
    version (informative: no check reads it; a check's own `GoldenCheck.cpu` names the
    serving CPU)."""
    return {**cpu_info(), "onnxruntime": _onnxruntime_version()}


# What a committed fixture's golden.json records instead of `this_machine()`: the CPU
# model, flags and int8 probe of whoever regenerates it would change its bytes (and its
# manifest's content hash) on every other CPU. A constant, so nothing else is kept (the
# onnxruntime version is requirements.lock's).
ANY_MACHINE: Mapping[str, Any] = MappingProxyType({
    "machine": "any",
    "note": "left out on purpose: a committed fixture is the same bytes on any CPU",
})


def golden_document(kind: str, cases: list[dict], tolerances: dict[str, float],
                    *, built_on: Mapping[str, Any] | None = None, **extra: Any) -> dict:
    """The golden.json body (validated enough that the loader can trust its shape).

    `built_on`: what the file records about the machine that computed the expected
    values; None (real exports) describes this one (`this_machine()`), a committed fixture
    passes `ANY_MACHINE` so that its bytes do not depend on the CPU."""
    if not cases:
        raise ValueError("golden vectors need at least one case")
    for i, case in enumerate(cases):
        if set(case) < {"input", "expected"}:
            raise ValueError(f"golden case {i} needs 'input' and 'expected'")
    machine = this_machine() if built_on is None else dict(built_on)
    return {"format": GOLDEN_FORMAT, "kind": kind,
            "tolerances": {k: float(v) for k, v in tolerances.items()},
            "cases": cases, "built_on": machine, **extra}


def write_golden(folder: Path, document: dict) -> Path:
    """Write `folder/golden.json` (before the manifest is built, so it is hashed)."""
    path = Path(folder) / GOLDEN_FILE
    path.write_text(json.dumps(document, ensure_ascii=False, allow_nan=False) + "\n",
                    encoding="utf-8")
    return path


def read_golden(folder: Path, manifest: dict, kind: str | None = None) -> dict:
    """golden.json read through the verified manifest; GoldenError when absent or malformed."""
    try:
        raw = read_verified_file(Path(folder), manifest, GOLDEN_FILE)
    except ManifestError as exc:
        if exc.reason == "not_listed":
            raise GoldenError("golden_absent", "the artifact carries no golden.json") from None
        raise
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise GoldenError("golden_malformed", f"{GOLDEN_FILE} is not JSON: {exc}") from None
    ok = (isinstance(doc, dict) and doc.get("format") == GOLDEN_FORMAT
          and isinstance(doc.get("cases"), list) and doc["cases"]
          and isinstance(doc.get("tolerances"), dict)
          and all(isinstance(c, dict) and "input" in c and "expected" in c
                  for c in doc["cases"]))
    if not ok:
        raise GoldenError("golden_malformed", f"{GOLDEN_FILE}: not a format-{GOLDEN_FORMAT} "
                                              "document with cases and tolerances")
    if kind is not None and doc.get("kind") != kind:
        raise GoldenError("golden_malformed", f"{GOLDEN_FILE} kind {doc.get('kind')!r}, "
                                              f"expected {kind!r}")
    return doc


class Timer:
    """`with Timer() as t: ...; t.seconds` (perf_counter)."""

    def __enter__(self) -> Timer:
        self._t0 = time.perf_counter()
        self.seconds = 0.0
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._t0


def row_cosines(expected: np.ndarray, got: np.ndarray) -> np.ndarray:
    """(n, d), (n, d) -> (n,) float64 cosine; 1.0 where both rows are zero, 0.0 where one is."""
    a, b = np.asarray(expected, np.float64), np.asarray(got, np.float64)
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    den = na * nb
    cos = np.divide((a * b).sum(axis=1), den, out=np.zeros(len(a)), where=den > 0)
    return np.where((na == 0) & (nb == 0), 1.0, cos)


def max_abs_diff(expected: Any, got: Any) -> float:
    """max |expected - got| over all elements (float64); inf on a shape mismatch or NaN."""
    a, b = np.asarray(expected, np.float64), np.asarray(got, np.float64)
    if a.shape != b.shape:
        return float("inf")
    if a.size == 0:
        return 0.0
    d = np.abs(a - b)
    return float("inf") if np.isnan(d).any() else float(d.max())


def stable_agreement(expected: list, got: list, margins: np.ndarray, tolerance: float
                     ) -> tuple[float, int]:
    """Agreement of decisions on the cases whose decision margin exceeds `tolerance`.

    A case whose expected score sits within `tolerance` of its threshold may
    legitimately flip on another CPU's kernels; every other case must agree.
    Returns (share agreeing among the stable cases, count of stable cases); the
    share is 1.0 when no case is stable.
    """
    stable = np.abs(np.asarray(margins, np.float64)) > tolerance
    n = int(stable.sum())
    if n == 0:
        return 1.0, 0
    same = np.array([e == g for e, g in zip(expected, got, strict=True)])
    return float(same[stable].mean()), n


def check(figures: dict[str, float], bounds: dict[str, tuple[str, float]], seconds: float
          ) -> GoldenCheck:
    """Compare measured `figures` with bounds {figure: (">=" | "<=", bound)}."""
    failed = []
    for name, (op, bound) in bounds.items():
        value = figures.get(name)
        good = value is not None and np.isfinite(value) and (
            value >= bound if op == ">=" else value <= bound)
        figures[f"bound_{name}"] = f"{op} {bound:g}"
        if not good:
            failed.append(name)
    return GoldenCheck(ok=not failed, figures=figures, failed=failed, seconds=seconds,
                       cpu=cpu_info())
