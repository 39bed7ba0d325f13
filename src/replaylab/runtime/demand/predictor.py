"""DemandPredictor: a verified demand artifact answering pre-dispatch hints (numpy + onnxruntime).

`DemandPredictor.load(path, ...)` never raises for a bad artifact. It verifies
(`replaylab.contracts.manifest.verify_manifest`: schema version, every file's
size and sha256, no path leaving the folder, validity period, optional HMAC
signature) and then checks what this runtime needs: the feature schema (every
feature one it can assemble, vocabularies well-formed, the ONNX input width
equal to the schema), the outputs (levels 0.5 and 0.9 present) and the
calibration. On any failure the model is not used: every hint comes from the
conservative baseline with `hint_fallback=True` and the reason code
(`DemandPredictor.reason`), see `FallbackBaseline`.

Golden vectors (`golden.json`, `replaylab.contracts.golden`): the export
records ~32 requests of its test split with the hints this very code computed
for them; `load` recomputes them on the serving machine and compares
(`check_golden`): `hint_p50`, `hint_p90`, `hint_lo`, `hint_hi` within the
file's `hint_abs` (tokens) and `hint_rel` (relative to max(|expected|, 1)),
and exactly the fallback flag and reason, the conformal cell key and its
correction. A miss means the model does not compute here what it computed
where it was built: the predictor is not used (reason `golden_mismatch`).

Requests and their feature row: `replaylab.runtime.demand.request`; the manifest
sections read: `replaylab.runtime.demand.spec`.

A loaded predictor is immutable but for its online recalibration
(`replaylab.runtime.online`, on by default, `online=False` or
`OnlineConfig(enabled=False)` serves the exported correction exactly): after a
request ends, `acknowledge(hint, actual_total, lower_bound)` feeds its actual
back, and later hints of its conformal cell use the adapted correction (every
hint says which: `correction_cell`, `correction`, `correction_version`, and the
exported band in `frozen_lo` / `frozen_hi`). `online_state()` reports the
corrections and the drift flags. `predict` and `acknowledge` may be called from
many threads at once (onnxruntime's `InferenceSession.run` is thread-safe; the
online state takes a lock on update, the hint path reads a snapshot).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from replaylab.contracts.golden import (
    MISMATCH,
    GoldenCheck,
    GoldenError,
    Timer,
    check,
    cpu_info,
    max_abs_diff,
    read_golden,
)
from replaylab.contracts.hints import HINT_VERSION, DemandHint
from replaylab.contracts.manifest import ManifestError, read_verified_file, verify_manifest
from replaylab.runtime.demand.fallback import FallbackBaseline
from replaylab.runtime.demand.request import (
    BadRequest,
    assemble,
    cell_key,
    number,
    request_id,
)
from replaylab.runtime.demand.spec import KIND, MODEL_FILE, ArtifactError, DemandSpec
from replaylab.runtime.demand_math import (
    conformal_band,
    conformal_band_row,
    total_and_band,
    total_and_band_row,
)
from replaylab.runtime.online import GLOBAL_CELL, OnlineConfig, OnlineConformal

# One WARNING per load that falls back (reason code and path), nothing on a good load: on
# the package's logger, `replaylab.runtime.demand`.
log = logging.getLogger("replaylab.runtime.demand")

# golden.json of kind demand: what each case's `expected` holds. Compared within tolerance:
GOLDEN_HINTS = ("hint_p50", "hint_p90", "hint_lo", "hint_hi")
# ... and exactly (the fallback decision, the conformal cell and the correction it gets):
GOLDEN_EXACT = ("hint_fallback", "fallback_reason", "cell", "correction")
GOLDEN_TOLERANCES = ("hint_abs", "hint_rel")  # the tolerances golden.json must carry


@dataclass(frozen=True)
class BatchQuantiles:
    """`DemandPredictor.quantiles_batch`: total-token quantiles of a batch, (n, q) in the
    artifact's level order, the exported interval (n,), and per row the fallback reason
    (None: the model answered; else that row's values are NaN)."""

    levels: tuple[float, ...]
    total: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    fallback: list[str | None]


class DemandPredictor:
    """Pre-dispatch demand hints from a verified artifact, or the fallback with its reason.

    Build with `DemandPredictor.load`; `predict(request)` / `predict_batch(requests)`.
    `loaded` says whether the model answers; `reason` why not; `version` the
    artifact version (`<semver>+<content hash prefix>`). `golden_status` and
    `golden` (a `GoldenCheck`, None unless the check ran) say how the golden
    vectors went at load, for the serving log: `passed`, `failed` (reason
    `golden_mismatch`), `malformed` (reason `golden_malformed`), `absent` (no
    golden.json: an older artifact, loaded as before), `skipped`
    (`check_golden=False`), `not_checked` (the artifact failed before the check).
    """

    def __init__(self, *, spec: DemandSpec | None, session: Any, reason: str | None,
                 fallback: FallbackBaseline, clock: Callable[[], float],
                 online: OnlineConfig | bool | None = None) -> None:
        self._spec = spec
        self._online = None if spec is None else OnlineConformal(
            spec.calibration.corrections, spec.calibration.global_correction,
            spec.calibration.level, _online_config(online))
        self._session = session
        self.reason = reason
        self._fallback = spec.fallback if spec is not None else fallback
        self._clock = clock
        self.version = spec.version if spec is not None else None
        self.manifest: dict | None = None
        self.golden: GoldenCheck | None = None
        self.golden_status = "not_checked"

    @property
    def loaded(self) -> bool:
        return self._session is not None

    @classmethod
    def load(cls, path: str | Path | None, *, hmac_key: bytes | None = None,
             fallback: FallbackBaseline | None = None, threads: int = 1,
             now: datetime | None = None, clock: Callable[[], float] = time.time,
             check_golden: bool = True, online: OnlineConfig | bool | None = None,
             ) -> DemandPredictor:
        """Verify and load an artifact folder; never raises for a bad or missing artifact.

        hmac_key: when given, the manifest must carry a matching signature.
        fallback: the baseline used when the artifact cannot be trusted (a
        trusted artifact brings its own, from its manifest). threads: onnxruntime
        intra-op threads per call. now / clock: verification time / the clock
        for hint ages and expiry (seconds since the epoch).

        check_golden: after verification, recompute the artifact's golden
        vectors on this machine (`check_golden`, about a millisecond, see
        docs/specs/artifacts.md). A miss (or an unreadable golden.json) falls back
        like any other load failure, reason `golden_mismatch` (`golden_malformed`),
        with the manifest's own fallback parameters (the manifest verified: it
        is the model that does not compute here what it computed at export).
        An artifact without golden.json (exported before golden vectors
        existed) is not a failure: it loads as before, `golden_status` "absent".
        False skips the check (`golden_status` "skipped").

        online: the online recalibration (`OnlineConfig`; True / None: the
        defaults, on; False: off, the exported correction served exactly).

        A load that falls back logs one WARNING on this module's logger
        (`replaylab.runtime.demand`) naming the reason code and the path.
        """
        predictor = cls._load(path, hmac_key=hmac_key, fallback=fallback, threads=threads,
                              now=now, clock=clock, check_golden=check_golden, online=online)
        if not predictor.loaded:
            log.warning("demand artifact %s not loaded (reason %s): serving the fallback "
                        "baseline %s", path, predictor.reason, predictor._fallback.name)
        return predictor

    @classmethod
    def _load(cls, path: str | Path | None, *, hmac_key: bytes | None,
              fallback: FallbackBaseline | None, threads: int, now: datetime | None,
              clock: Callable[[], float], check_golden: bool,
              online: OnlineConfig | bool | None) -> DemandPredictor:
        fallback = fallback or FallbackBaseline()
        if path is None or not Path(path).is_dir():
            return cls(spec=None, session=None, reason="missing_artifact", fallback=fallback,
                       clock=clock)
        try:
            manifest = verify_manifest(Path(path), hmac_key=hmac_key, required_kind=KIND,
                                       now=now or datetime.fromtimestamp(clock(), UTC))
            predictor = cls.from_manifest(manifest,
                                          read_verified_file(Path(path), manifest, MODEL_FILE),
                                          fallback=fallback, threads=threads, clock=clock,
                                          online=online)
        except (ManifestError, ArtifactError) as exc:
            return cls(spec=None, session=None, reason=exc.reason, fallback=fallback,
                       clock=clock)
        except Exception:  # noqa: BLE001 - onnxruntime refusing the graph, etc.: fall back
            return cls(spec=None, session=None, reason="onnx_load", fallback=fallback,
                       clock=clock)
        if not check_golden:
            predictor.golden_status = "skipped"
            return predictor
        try:
            golden = read_golden(Path(path), manifest, KIND)
        except GoldenError as exc:
            if exc.reason == "golden_absent":
                predictor.golden_status = "absent"
                return predictor
            failed = cls(spec=None, session=None, reason=exc.reason,
                         fallback=predictor._fallback, clock=clock)
            failed.manifest, failed.golden_status = manifest, "malformed"
            return failed
        except ManifestError as exc:  # cannot happen after verify_manifest, unless raced
            return cls(spec=None, session=None, reason=exc.reason, fallback=fallback,
                       clock=clock)
        result = predictor.check_golden(golden)
        if result.ok:
            predictor.golden, predictor.golden_status = result, "passed"
            return predictor
        failed = cls(spec=None, session=None, reason=MISMATCH, fallback=predictor._fallback,
                     clock=clock)
        failed.manifest, failed.golden, failed.golden_status = manifest, result, "failed"
        return failed

    @classmethod
    def from_manifest(cls, manifest: dict, model: bytes, *,
                      fallback: FallbackBaseline | None = None, threads: int = 1,
                      clock: Callable[[], float] = time.time,
                      online: OnlineConfig | bool | None = None) -> DemandPredictor:
        """A predictor from a manifest dict already verified (or being built) and the model bytes.

        `load` calls it after verification; the exporter calls it on the staged
        folder before the final manifest exists, to compute the golden vectors
        through this very code. Raises ArtifactError when the runtime cannot use
        the sections, onnxruntime's error when it refuses the graph. No golden check.
        """
        spec = DemandSpec.from_manifest(manifest)
        session = _session(model, threads)
        _check_signature(session, len(spec.features), len(spec.quantiles))
        predictor = cls(spec=spec, session=session, reason=None,
                        fallback=fallback or FallbackBaseline(), clock=clock, online=online)
        predictor.manifest = manifest
        return predictor

    def with_fresh_online(self, online: OnlineConfig | bool | None = None) -> DemandPredictor:
        """The same model (session shared) with a new online state at version 0.

        online: None keeps this predictor's online config; a replay uses it so that
        it neither reads nor moves the serving predictor's corrections.
        """
        twin = DemandPredictor(spec=self._spec, session=self._session, reason=self.reason,
                               fallback=self._fallback, clock=self._clock,
                               online=self.online_config if online is None else online)
        twin.manifest, twin.golden, twin.golden_status = \
            self.manifest, self.golden, self.golden_status
        return twin

    # ------------------------------------------------------------------ online recalibration
    @property
    def online_config(self) -> OnlineConfig | None:
        """The online recalibration's config (None without a model)."""
        return None if self._online is None else self._online.config

    def acknowledge(self, hint: DemandHint, actual_total: float | None,
                    lower_bound: bool = False) -> bool:
        """Feed an ENDED request's actual total tokens back into its cell's correction.

        hint: the hint this predictor served for it; actual_total: prompt +
        completion (None / NaN: usage absent, ignored); lower_bound: the actual is
        censored (cap hit, cancelled, failed: `contracts.hints.is_lower_bound`),
        which only proves a miss above hint_hi. Fallback hints and hints of
        another artifact are ignored. True when the actual was used.
        """
        online = self._online
        if online is None or hint.correction_cell is None or \
                hint.hint_model_version != self.version:
            return False
        return online.update(hint.correction_cell, hint.hint_lo, hint.hint_hi, hint.frozen_lo,
                             hint.frozen_hi, actual_total, lower_bound)

    def online_state(self) -> dict | None:
        """The online corrections, their versions, rolling coverage and drift flags."""
        return None if self._online is None else self._online.state()

    def online_drift(self, cell: str | None = None) -> str | None:
        """`ok` / `retrain` / `fallback` for one correction cell, or the worst of all."""
        return None if self._online is None else self._online.drift(cell)

    # ------------------------------------------------------------------ golden vectors
    def golden_expected(self, requests: Sequence[Mapping[str, Any]]) -> list[dict]:
        """What a golden case expects for each request, computed by this predictor.

        {hint_p50, hint_p90, hint_lo, hint_hi, hint_fallback, fallback_reason,
        cell, correction}: the hint of `predict_batch` (validity not checked:
        a golden case tests the arithmetic, not the clock) and the conformal
        cell key with the correction it gets (None: unbounded).
        """
        if self._spec is None or self._session is None:
            raise ArtifactError(self.reason or "not_loaded", "no model to compute golden vectors")
        spec = self._spec
        hints = self._hints(requests, int(self._clock() * 1000), None, frozen=True)
        out = []
        for r, h in zip(requests, hints, strict=True):
            cell = cell_key(r, spec.calibration.group_columns)
            out.append({"hint_p50": h.hint_p50, "hint_p90": h.hint_p90, "hint_lo": h.hint_lo,
                        "hint_hi": h.hint_hi, "hint_fallback": h.hint_fallback,
                        "fallback_reason": h.fallback_reason, "cell": cell,
                        "correction": spec.calibration.corrections.get(
                            cell, spec.calibration.global_correction)})
        return out

    def check_golden(self, golden: dict) -> GoldenCheck:
        """Recompute a golden.json document's cases here and compare; never raises.

        Figures: `cases`; `hint_max_abs` (tokens) and `hint_max_rel` (|diff| /
        max(|expected|, 1)) over the four hint values of every case, bounded by
        the file's `hint_abs` and `hint_rel`; `exact_agreement`, the share of
        cases whose fallback flag, reason, cell and correction are the same
        (must be 1). `seconds`: the wall time of running the cases and comparing
        (reading golden.json is apart), the check's load-time cost.
        """
        error = None
        with Timer() as t:
            try:
                tol = {k: float(golden["tolerances"][k]) for k in GOLDEN_TOLERANCES}
                cases = golden["cases"]
                expected = [c["expected"] for c in cases]
                got = self.golden_expected([dict(c["input"]) for c in cases])
                exp_hints = np.array([[e[k] for k in GOLDEN_HINTS] for e in expected], float)
                got_hints = np.array([[g[k] for k in GOLDEN_HINTS] for g in got], float)
                same = [all(e.get(k) == g[k] for k in GOLDEN_EXACT)
                        for e, g in zip(expected, got, strict=True)]
            except (KeyError, TypeError, ValueError, ArtifactError) as exc:
                error = ("golden_cases", exc)  # a case the runtime cannot read
            except Exception as exc:  # noqa: BLE001 - onnxruntime failing on this CPU: a miss
                error = ("golden_run", exc)
            else:
                # relative to max(|expected|, 1): a hint of 0 tokens is held to the absolute bound
                scale = np.maximum(np.abs(exp_hints), 1.0)
                figures = {"cases": len(cases),
                           "hint_max_abs": max_abs_diff(exp_hints, got_hints),
                           "hint_max_rel": max_abs_diff(exp_hints / scale, got_hints / scale),
                           "exact_agreement": float(np.mean(same))}
        if error is not None:
            return GoldenCheck(ok=False, figures={"error": f"{type(error[1]).__name__}: "
                                                           f"{error[1]}"},
                               failed=[error[0]], seconds=t.seconds, cpu=cpu_info())
        return check(figures, {"hint_max_abs": ("<=", tol["hint_abs"]),
                               "hint_max_rel": ("<=", tol["hint_rel"]),
                               "exact_agreement": (">=", 1.0)}, t.seconds)

    # ------------------------------------------------------------------ predict
    def predict(self, request: Mapping[str, Any]) -> DemandHint:
        """One request's hint (see the module docstring for the request fields).

        The same answer as `predict_batch((request,))[0]`, computed on Python
        floats after the model call (numpy's per-call overhead dominates one row).
        """
        now_ms = int(self._clock() * 1000)
        reason, age = self._usable(now_ms)
        if reason is not None:
            return self._fallback.hint(request, reason, age)
        spec = self._spec
        X = np.empty((1, len(spec.features)), dtype="float64")
        prepared = self._prepare(request, now_ms, X[0])
        if isinstance(prepared, str):
            return self._fallback.hint(request, prepared, age)
        prompt, cap, q0, key = prepared
        q, version = self._online.current(key) if self._online.enabled else (q0, 0)
        raw = self._session.run(None, {"X": X})[0][0].tolist()
        total, blo, bhi = total_and_band_row(raw, prompt, cap, spec.outputs.scale,
                                             spec.clipped_band)
        flo, fhi = conformal_band_row(blo, bhi, prompt, q0, cap, spec.outputs.scale)
        lo, hi = (flo, fhi) if q == q0 else conformal_band_row(blo, bhi, prompt, q, cap,
                                                               spec.outputs.scale)
        return DemandHint(HINT_VERSION, spec.version, total[spec.i50], total[spec.i90], lo, hi,
                          spec.calibration.level, age, False, None, request_id(request), key,
                          q, version, flo, fhi)

    def predict_batch(self, requests: Sequence[Mapping[str, Any]]) -> list[DemandHint]:
        """Hints for many requests with one model call; each row falls back on its own."""
        now_ms = int(self._clock() * 1000)
        reason, age = self._usable(now_ms)
        if reason is not None:
            return [self._fallback.hint(r, reason, age) for r in requests]
        return self._hints(requests, now_ms, age)

    def quantiles_batch(self, requests: Sequence[Mapping[str, Any]]) -> BatchQuantiles:
        """Every quantile the model predicts and the exported interval, for offline scoring.

        What `predict_batch` computes before it keeps p50 / p90 (the same feature
        assembly, model call, clip and conformal band), for every quantile level of
        the artifact, with the exported (frozen) corrections and no validity check:
        the registry scores a champion artifact on a challenger's test rows with it
        (`replaylab.artifacts.rescore_demand`). Raises ArtifactError when no model is loaded.
        """
        if self._spec is None or self._session is None:
            raise ArtifactError(self.reason or "not_loaded", "no model to score with")
        total, lo, hi, *_, bad = self._batch(requests, int(self._clock() * 1000), False)
        reasons: list[str | None] = [bad.get(i) for i in range(len(requests))]
        if bad:
            rows = list(bad)
            total[rows], lo[rows], hi[rows] = np.nan, np.nan, np.nan
        return BatchQuantiles(self._spec.outputs.quantiles, total, lo, hi, reasons)

    def _batch(self, requests: Sequence[Mapping[str, Any]], now_ms: int, adapt: bool):
        """(total (n, q), lo, hi, frozen lo, frozen hi, corrections, cell keys, correction
        versions, bad rows) of a batch; rows in `bad` (index -> fallback reason) hold garbage."""
        spec = self._spec
        n, nf = len(requests), len(spec.features)
        X = np.empty((n, nf), dtype="float64")
        prompt, cap, corr, corr0 = np.zeros(n), np.full(n, np.nan), np.zeros(n), np.zeros(n)
        keys: list[str | None] = [None] * n
        versions = [0] * n
        bad: dict[int, str] = {}
        for i, r in enumerate(requests):
            prepared = self._prepare(r, now_ms, X[i])
            if isinstance(prepared, str):
                bad[i] = prepared
            else:
                prompt[i], cap[i], corr0[i], keys[i] = prepared
                corr[i], versions[i] = self._online.current(keys[i]) if adapt else (corr0[i], 0)
        if bad:
            X[list(bad)] = 0.0  # keep the batch shape; these rows' outputs are discarded
        raw = self._session.run(None, {"X": X})[0]
        clip = cap if spec.outputs.clip_to_cap else None
        total, blo, bhi = total_and_band(raw, prompt, clip, spec.outputs.scale,
                                         spec.clipped_band)
        flo, fhi = conformal_band(blo, bhi, prompt, corr0, clip, spec.outputs.scale)
        lo, hi = (flo, fhi) if not adapt or np.array_equal(corr, corr0) else \
            conformal_band(blo, bhi, prompt, corr, clip, spec.outputs.scale)
        return total, lo, hi, flo, fhi, corr, keys, versions, bad

    def _hints(self, requests: Sequence[Mapping[str, Any]], now_ms: int,
               age: int | None, frozen: bool = False) -> list[DemandHint]:
        """The model's hints for a batch (the caller has checked the model may answer).

        frozen: serve the exported corrections whatever the online state (golden vectors).
        """
        spec = self._spec
        adapt = self._online.enabled and not frozen
        total, lo, hi, flo, fhi, corr, keys, versions, bad = self._batch(requests, now_ms, adapt)
        out = []
        for i, r in enumerate(requests):
            if i in bad:
                out.append(self._fallback.hint(r, bad[i], age))
                continue
            out.append(DemandHint(HINT_VERSION, spec.version, float(total[i, spec.i50]),
                                  float(total[i, spec.i90]), float(lo[i]), float(hi[i]),
                                  spec.calibration.level, age, False, None, request_id(r),
                                  keys[i], float(corr[i]), versions[i], float(flo[i]),
                                  float(fhi[i])))
        return out

    def _usable(self, now_ms: int) -> tuple[str | None, int | None]:
        """(why the model cannot answer at `now_ms`, or None; the artifact's age in ms)."""
        spec = self._spec
        if spec is None or self._session is None:
            return self.reason or "not_loaded", None
        age = max(now_ms - spec.created_ms, 0)  # created up to MAX_CLOCK_SKEW ahead: 0
        return ("expired" if now_ms > spec.valid_until_ms else None), age

    def _prepare(self, r: Mapping[str, Any], now_ms: int,
                 row: np.ndarray) -> tuple[float, float, float, str] | str:
        """Fill `row`; (prompt, cap or NaN, exported correction, its online cell key), or the
        reason this request falls back."""
        spec = self._spec
        try:
            assemble(spec.plan, r, now_ms, row)
            p = number(r.get("prompt_tokens"))
            if not math.isfinite(p) or p < 0:
                return "missing_prompt_tokens"
            c = math.nan
            if spec.outputs.clip_to_cap:
                c = number(r.get("max_tokens"))
                c = c if c >= 0 else math.nan
        except BadRequest:
            return "bad_request"
        cell = cell_key(r, spec.calibration.group_columns)
        if cell in spec.calibration.corrections:
            q, key = spec.calibration.corrections[cell], cell
        else:
            q, key = spec.calibration.global_correction, GLOBAL_CELL
        if q is None or q == math.inf:
            return "uncertain"  # too few calibration rows: unbounded interval
        return p, c, q, key


def _online_config(online: OnlineConfig | bool | None) -> OnlineConfig:
    if isinstance(online, OnlineConfig):
        return online
    if online is None or online is True:
        return OnlineConfig()
    if online is False:
        return OnlineConfig(enabled=False)
    raise ValueError(f"online={online!r}: an OnlineConfig, True, False or None")


def _session(model: bytes, threads: int) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = int(threads)
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


def _check_signature(session: Any, n_features: int, n_outputs: int) -> None:
    inputs, outputs = session.get_inputs(), session.get_outputs()
    if [i.name for i in inputs] != ["X"] or inputs[0].type != "tensor(double)" or \
            inputs[0].shape[1] != n_features:
        raise ArtifactError("feature_schema",
                            f"graph input {[(i.name, i.type, i.shape) for i in inputs]} does not "
                            f"take {n_features} float64 features")
    if [o.name for o in outputs] != ["raw"] or outputs[0].shape[1] != n_outputs:
        raise ArtifactError("outputs", f"graph output {[(o.name, o.shape) for o in outputs]}")
