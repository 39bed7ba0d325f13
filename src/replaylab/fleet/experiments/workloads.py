"""`fleet.workload`: what every fleet experiment replays (the harness's workload half).

One config section, `WorkloadSpec`, composed at the top level of the evaluate config
(`conf/fleet/workload/`) and handed to every fleet experiment as its `workload` key:

    ledger=PATH   a ledger-v1 file (Parquet or JSON Lines), read and validated by the
                  contract (`replaylab.contracts.read_ledger`): real arrival times and
                  token counts, quarantined rows counted. When set it wins over `source`.
    source=       azure_conv_slice: the first 15 minutes of the Azure LLM 2023
                  conversation trace (4,424 requests), shipped in the package
                  (`replaylab.data`, fleet/; ledger-v1 via `replaylab.sources.azure`);
                  azure_conv | azure_code: the full Azure LLM 2023 traces, a download
                  named by `path` (absent: one line saying where to get it, exit 2);
                  cdf: total tokens from a token CDF (`cdf`: a shipped CDF's name, or a
                  file) with an arrival process (`arrival`, `cv`,
                  `duration_s`, `hint_sigma`, `cancel_share`, `cancel_after_mean_s`),
                  one replicate per entry of `seeds`;
                  synthetic: the seeded synthetic ledger (`synthetic`:
                  SyntheticLedgerConfig fields; hint_admission).
    windows, window_s, max_requests: a ledger is cut into `windows` consecutive time
                  windows (the replicates; `window_s` null: span / windows), each capped
                  at `max_requests` rows (tests).
    time_scale:   arrivals compressed this much (the same requests, denser).
    cancel_aborted: a row with lifecycle `aborted` and a duration is cancelled by its
                  client that long after arrival (compressed by `time_scale` too).

How a ledger's rows are replayed (docs/design/demand-target.md's six cases, read by a
simulator that needs the tokens a request occupies, not its desired length):

- `label` rows: replayed as recorded.
- `length` rows (finish_reason=length): replayed with their observed tokens. The
  tokens a capped request consumes are prompt + min(desired, cap), which the row
  observes exactly (docs/design/demand-target.md, "What this means for the numbers").
- `cancelled` (finish_reason=cancelled or lifecycle aborted) and `failed` rows:
  replayed with the tokens they made before the cut (what they occupied);
  aborted rows are cancelled by their client when `cancel_aborted`.
  All three are counted in `rows_censored`.
- `absent_usage` (completion_tokens null, NOT zero) and `prompt_absent` rows: there
  is nothing to simulate; skipped and counted in `rows_skipped`, never dropped
  silently. A completion of 0 tokens is simulated as 1 (`fleet.workload`).
- quarantined rows (the contract rejects them): never replayed; counted.

The summary's `workload` (`workload_facts`) names the file or source, its
fingerprint (sha256 of the file's bytes), rows read / quarantined / used / skipped
by reason, requests simulated, windows and time_scale, with a text `description`.
For a ledger, rows_read = rows_quarantined + rows_used + sum(rows_skipped).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from replaylab.config import ConfigError, fail_field, from_mapping
from replaylab.contracts import LEDGER_SCHEMA, ValidationResult, read_ledger, validate_ledger
from replaylab.contracts.columns import Ledger as L
from replaylab.contracts.enums import FinishReason, LifecycleState
from replaylab.data import PUBLIC_FILES, require_public, shipped
from replaylab.fleet.sim.workload import ARRIVALS, Workload, workload_from_ledger
from replaylab.sources.synthetic.config import SyntheticLedgerConfig

SLICE_SOURCE = "azure_conv_slice"                       # shipped in replaylab.data/fleet
AZURE_SLICE = "AzureLLMInferenceTrace_conv_first15min.csv"
DOWNLOADED_SOURCES = ("azure_conv", "azure_code")       # full traces: fleet.workload.path
LEDGER_SOURCES = (SLICE_SOURCE, *DOWNLOADED_SOURCES)
SHIPPED_CDFS = ("azure_cdf.json", "lmsys_cdf.json", "agent_heavy_cdf.json")
GENERATED_SOURCES = ("cdf", "synthetic")
SOURCES = (*LEDGER_SOURCES, *GENERATED_SOURCES)


@dataclass(frozen=True)
class WorkloadSpec:
    """`fleet.workload`: the workload of a fleet experiment (see the module docstring)."""

    ledger: str | None = None          # a ledger-v1 file; wins over source
    source: str = SLICE_SOURCE         # azure_conv_slice | azure_conv | azure_code | cdf | synthetic
    path: str | None = None            # source=azure_conv|azure_code: the downloaded trace
    windows: int = 4                   # ledger: consecutive time windows = replicates
    window_s: float | None = None      # null: the ledger's span / windows
    time_scale: float = 8.0            # arrivals compressed this much
    max_requests: int | None = None    # per window (tests)
    cancel_aborted: bool = True        # aborted rows cancelled at their recorded duration
    # source=cdf: a synthetic stream from a token CDF
    cdf: str = "azure_cdf.json"        # a shipped CDF (SHIPPED_CDFS) or a file
    duration_s: float = 300.0
    arrival: str = "gamma"             # poisson | gamma
    cv: float = 1.5
    hint_sigma: float | None = 0.5     # calibrated p90 hint (log-normal noise); null: none
    cancel_share: float = 0.05
    cancel_after_mean_s: float = 30.0
    seeds: tuple[int, ...] = (0, 1, 2)
    # source=synthetic: the seeded synthetic ledger
    synthetic: SyntheticLedgerConfig = field(default_factory=SyntheticLedgerConfig)

    def __post_init__(self) -> None:
        c = "fleet.workload"
        if self.source not in SOURCES:
            fail_field(c, "source", self.source, f"must be one of {', '.join(SOURCES)}")
        if not isinstance(self.windows, int) or self.windows < 1:
            fail_field(c, "windows", self.windows, "must be an integer >= 1")
        if self.window_s is not None and not self.window_s > 0:
            fail_field(c, "window_s", self.window_s, "must be > 0 or null")
        if not self.time_scale > 0:
            fail_field(c, "time_scale", self.time_scale, "must be > 0")
        if self.max_requests is not None and not self.max_requests >= 1:
            fail_field(c, "max_requests", self.max_requests, "must be >= 1 or null")
        if self.arrival not in ARRIVALS:
            fail_field(c, "arrival", self.arrival, f"must be one of {ARRIVALS}")
        if not self.duration_s > 0:
            fail_field(c, "duration_s", self.duration_s, "must be > 0")
        if not self.seeds:
            fail_field(c, "seeds", self.seeds, "needs at least one seed")
        if self.path and self.source not in DOWNLOADED_SOURCES and not self.ledger:
            fail_field(c, "path", self.path, "names the file of source="
                       f"{' | '.join(DOWNLOADED_SOURCES)} (a ledger-v1 file: fleet.workload."
                       "ledger)")

    @property
    def replays_ledger(self) -> bool:
        """A ledger file or a shipped trace (not a generated stream)."""
        return bool(self.ledger) or self.source in LEDGER_SOURCES

    @property
    def kind(self) -> str:
        """What is replayed: `ledger` (a file named by `ledger`) or the source's name."""
        return "ledger" if self.ledger else self.source


def workload_spec(values: Mapping[str, Any] | None) -> WorkloadSpec:
    """The typed `fleet.workload` of a plain mapping (None: the defaults)."""
    v = dict(values or {})
    if isinstance(v.get("synthetic"), Mapping):
        v["synthetic"] = from_mapping(SyntheticLedgerConfig, dict(v["synthetic"]),
                                      "fleet.workload.synthetic")
    return from_mapping(WorkloadSpec, v, "fleet.workload")


def require_source(spec: WorkloadSpec, experiment: str, generated: tuple[str, ...] = ()) -> None:
    """ConfigError unless `experiment` can run `spec` (a ledger, or one of `generated`)."""
    if spec.replays_ledger or spec.source in generated:
        return
    allowed = " | ".join((*LEDGER_SOURCES, *generated))
    raise ConfigError(f"experiment={experiment} cannot run fleet.workload.source="
                      f"{spec.source!r}: set fleet.workload.ledger=PATH (ledger-v1) or "
                      f"fleet.workload.source={allowed}")


# ---------------------------------------------------------------- ledgers


@dataclass(frozen=True)
class ReplayedLedger:
    """A validated ledger to replay and where it came from."""

    result: ValidationResult
    kind: str            # "ledger" (a file named by fleet.workload.ledger) or a source
    file: str
    fingerprint: str     # sha256 hex of the file's bytes
    label: str           # how descriptions name it


def file_sha256(path: str | Path) -> str:
    """sha256 hex of a file's bytes."""
    with Path(path).open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def azure_trace_path(spec: WorkloadSpec) -> Path:
    """The Azure LLM inference trace 2023 CSV of a trace source: the shipped slice
    (azure_conv_slice), or the downloaded file `spec.path` names (azure_conv, azure_code;
    absent or unnamed: one line saying what it is and where to download it)."""
    if spec.source == SLICE_SOURCE:
        return shipped("fleet", AZURE_SLICE)
    if not spec.path:
        f = PUBLIC_FILES[spec.source]
        raise ConfigError(f"fleet.workload.source={spec.source} needs fleet.workload.path="
                          f"FILE: {f.what} ({f.license}), {f.where}; or "
                          f"source={SLICE_SOURCE} (its first 15 minutes, shipped)")
    return require_public(spec.path, spec.source, "fleet.workload.path")


def read_workload_ledger(spec: WorkloadSpec) -> ReplayedLedger:
    """The ledger `spec` names, validated: its file, or the trace of its source.

    A missing file is one line saying what it is and where to get it (FileNotFoundError);
    an unreadable one a ContractError (one line naming the path).
    """
    if spec.ledger:
        path = require_public(spec.ledger, "ledger", "fleet.workload.ledger")
        result = read_ledger(path)
        label = f"ledger-v1 file {path}"
    elif spec.source in LEDGER_SOURCES:
        from replaylab.sources.azure import import_azure_llm_2023

        path = azure_trace_path(spec)
        service = "conv" if spec.source == SLICE_SOURCE else spec.source.split("_", 1)[1]
        result = validate_ledger(import_azure_llm_2023(path, service=service),
                                 source=str(path))
        label = ("Azure LLM inference trace 2023 (conversation, its first 15 minutes: the "
                 "slice shipped in replaylab.data; ledger-v1 via replaylab.sources.azure)"
                 if spec.source == SLICE_SOURCE else
                 f"Azure LLM inference trace 2023 ({spec.source}, ledger-v1 via "
                 "replaylab.sources.azure)")
    else:
        raise ConfigError(f"fleet.workload.source={spec.source!r} is not a ledger")
    return ReplayedLedger(result, spec.kind, str(path), file_sha256(path), label)


def ledger_windows(ledger: pd.DataFrame, windows: int, window_s: float | None = None,
                   max_requests: int | None = None) -> tuple[list[pd.DataFrame], dict[str, int]]:
    """`windows` consecutive time windows of the ledger (equal length; window_s: fixed),
    and the rows left out: {"outside_windows": n, "beyond_max_requests": n}."""
    ts = ledger[L.TIMESTAMP].to_numpy("int64")
    t0, span = int(ts.min()), int(ts.max() - ts.min()) + 1
    w_ms = int(window_s * 1000) if window_s else span // max(windows, 1)
    out, inside, beyond = [], 0, 0
    for k in range(windows):
        part = ledger[(ts >= t0 + k * w_ms) & (ts < t0 + (k + 1) * w_ms)]
        inside += len(part)
        if max_requests:
            kept = part.sort_values(L.TIMESTAMP, kind="stable").head(int(max_requests))
            beyond += len(part) - len(kept)
            part = kept
        if len(part):
            out.append(part)
    if not out:
        raise ConfigError(f"no ledger rows in {windows} windows of {w_ms} ms")
    return out, {"outside_windows": len(ledger) - inside, "beyond_max_requests": beyond}


def row_cases(frame: pd.DataFrame) -> tuple[dict[str, int], dict[str, int]]:
    """(rows that cannot be simulated, censored rows replayed) of valid ledger rows:
    ({absent_usage, prompt_absent}, {length, cancelled, failed}); docs/design/demand-target.md."""
    comp_null = frame[L.COMPLETION_TOKENS].isna().to_numpy()
    prompt_null = frame[L.PROMPT_TOKENS].isna().to_numpy() & ~comp_null
    kept = ~(comp_null | prompt_null)
    finish = LEDGER_SCHEMA.column(frame, L.FINISH_REASON)
    state = LEDGER_SCHEMA.column(frame, L.LIFECYCLE_STATE)
    length = (finish == FinishReason.LENGTH).to_numpy(dtype=bool) & kept
    cancelled = ((finish == FinishReason.CANCELLED) | (state == LifecycleState.ABORTED)
                 ).to_numpy(dtype=bool) & kept & ~length
    failed = ((state == LifecycleState.FAILED) | (finish == FinishReason.ERROR)
              ).to_numpy(dtype=bool) & kept & ~length & ~cancelled
    return ({"absent_usage": int(comp_null.sum()), "prompt_absent": int(prompt_null.sum())},
            {"length": int(length.sum()), "cancelled": int(cancelled.sum()),
             "failed": int(failed.sum())})


def window_workloads(parts: Sequence[pd.DataFrame], model: str, time_scale: float,
                     cancel_aborted: bool) -> list[Workload]:
    """One Workload per ledger part, every row served by `model`."""
    return [workload_from_ledger(p, model_map={m: model for m in p[L.SELECTED_MODEL].unique()},
                                 time_scale=time_scale, cancel_aborted=cancel_aborted)
            for p in parts]


def trace_workloads(spec: WorkloadSpec, model: str) -> tuple[list[Workload], dict[str, Any]]:
    """(workloads per time window, the summary's `workload` mapping) of the ledger
    `spec` names, all rows served as `model`."""
    led = read_workload_ledger(spec)
    parts, cut = ledger_windows(led.result.valid, spec.windows, spec.window_s,
                                spec.max_requests)
    wls = window_workloads(parts, model, spec.time_scale, spec.cancel_aborted)
    n = sum(w.n for w in wls)
    skipped = sum(sum(w.skipped.values()) for w in wls)
    span = sum(w.duration_s for w in wls) / len(wls)
    desc = workload_text(
        led.label, n, f"{len(wls)} windows, arrivals compressed {spec.time_scale:g}x "
        f"(~{span:.0f} s simulated each), {skipped} rows skipped, all served as {model!r}")
    return wls, ledger_facts(led, parts, cut, description=desc, requests_simulated=n,
                             windows=len(wls), time_scale=spec.time_scale)


def token_cdf_path(spec: WorkloadSpec) -> Path:
    """The token CDF `spec.cdf` names: a shipped one (SHIPPED_CDFS), or a file (absent:
    one line saying what it is and where FleetSim's come from)."""
    if spec.cdf in SHIPPED_CDFS:
        return shipped("fleet", spec.cdf)
    return require_public(spec.cdf, "token_cdf", "fleet.workload.cdf")


def workload_text(source: str, n: int, note: str = "") -> str:
    return f"{source}: {n} requests" + (f"; {note}" if note else "")


# ---------------------------------------------------------------- the summary's `workload`


def workload_facts(*, description: str, kind: str, file: str | None = None,
                   fingerprint: str | None = None, rows_read: int | None = None,
                   rows_quarantined: int | None = None,
                   quarantine_by_reason: Mapping[str, int] | None = None,
                   rows_used: int | None = None, rows_skipped: Mapping[str, int] | None = None,
                   rows_censored: Mapping[str, int] | None = None, requests_simulated: int,
                   windows: int | None = None, seeds: Sequence[int] | None = None,
                   time_scale: Any = None) -> dict[str, Any]:
    """The summary's `workload` mapping; the same keys for every source (None: n/a)."""
    return {"description": description, "source": kind, "file": file,
            "fingerprint": fingerprint, "rows_read": rows_read,
            "rows_quarantined": rows_quarantined,
            "quarantine_by_reason": dict(quarantine_by_reason or {}),
            "rows_used": rows_used, "rows_skipped": dict(rows_skipped or {}),
            "rows_censored": dict(rows_censored or {}),
            "requests_simulated": int(requests_simulated), "windows": windows,
            "seeds": None if seeds is None else [int(s) for s in seeds],
            "time_scale": time_scale}


def ledger_facts(led: ReplayedLedger, parts: Sequence[pd.DataFrame],
                 left_out: Mapping[str, int], **kw: Any) -> dict[str, Any]:
    """`workload_facts` of a replayed ledger: `parts` are the rows it replayed (before
    rows without usage are skipped), `left_out` the other valid rows by reason."""
    frame = pd.concat(parts) if parts else led.result.valid.iloc[:0]
    skipped, censored = row_cases(frame)
    r = led.result
    return workload_facts(kind=led.kind, file=led.file, fingerprint=led.fingerprint,
                          rows_read=r.rows_read, rows_quarantined=r.rows_quarantined,
                          quarantine_by_reason=r.by_reason(),
                          rows_used=len(frame) - sum(skipped.values()),
                          rows_skipped={**skipped, **left_out}, rows_censored=censored, **kw)
