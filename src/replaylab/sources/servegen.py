"""ServeGen per-client rate traces -> aggregates-v1 demand buckets.

Source: alibaba/ServeGen, its `language/m-large` and `reason/deepseek-r1` client data,
copied unchanged under ../shared/data/traces/servegen/. License: Apache-2.0.
Cite: Xiang et al., "ServeGen: Workload Characterization of Large Language Model
Serving in Production", 2025 (arXiv:2505.09999), Alibaba Cloud Model Studio.

What a source row is: `chunk-N-trace.csv` (no header) holds one client's 10-minute
windows `start_s, rate_req_per_s, cv, arrival_dist, p1, p2` (14 days for language,
1 day for reason); `chunk-N-dataset.json` (reason only) maps 6-hour window starts
to token-length histograms {"input_tokens": "{tokens: probability, ...}", ...}.

Mapping (one row per bucket x archetype; clients are summed, never emitted):
- bucket_start = origin_ms + 1000 * start_s (epoch ms). The source gives only
  seconds since the trace start; the default origin 0 (1970-01-01, a Thursday)
  marks the time as trace-relative. Pass the real start when known.
- bucket_seconds = the step of `start_s` (600).
- requests = sum over clients of round(rate x width). In the published files
  rate x 600 is an integer to 1e-10, so this recovers each client's window
  count (an expected count only if a rate is not count/width). The smallest
  non-zero client count is 10: ServeGen appears to zero client windows below it.
- archetype = `<category>/<model>` of the trace folder (e.g. `language/m-large`),
  or the `archetype` argument. A per-client label (`chunk-N`) would be a caller
  identifier, which aggregates-v1 forbids, so clients are pooled per archetype;
  slo_class = region = `all`; taxonomy_version as given.
- rate_cv = sqrt(sum n_i cv_i^2 / sum n_i) over clients with n_i > 0 (modeled:
  the count-dispersion CV of a superposition of independent renewal processes;
  it equals the client's cv when one client contributes). Null when requests = 0
  or a contributing client lacks a cv.
- prompt/completion_tokens_p50/p90: quantiles (smallest token count whose
  cumulative probability reaches q) of the request-weighted mixture of the
  contributing clients' `input_tokens` / `output_tokens` histograms for the
  histogram window holding the bucket start. Null without dataset.json (all of
  language/m-large) or when a contributing client has no histogram there.
- token sums stay null: the source has no per-request token counts.
- No k_min suppression here (pooled buckets hold thousands of requests).
- `arrival_dist`, `p1`, `p2` (the fitted Gamma/Weibull inter-arrival law) are not used.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from replaylab.contracts.columns import Aggregates as A

AGGREGATES_VERSION = "1"
_COLS = ("start_s", "rate", "cv", "arrival_dist", "p1", "p2")
_KINDS = {"input_tokens": (A.PROMPT_TOKENS_P50, A.PROMPT_TOKENS_P90),
          "output_tokens": (A.COMPLETION_TOKENS_P50, A.COMPLETION_TOKENS_P90)}
_QUANTILES = (0.5, 0.9)
_ORDER = (A.VERSION, A.BUCKET_START, A.BUCKET_SECONDS, A.ARCHETYPE, A.TAXONOMY_VERSION,
          A.SLO_CLASS, A.REGION, A.REQUESTS, A.PROMPT_TOKENS_SUM, A.COMPLETION_TOKENS_SUM,
          A.PROMPT_TOKENS_P50, A.PROMPT_TOKENS_P90, A.COMPLETION_TOKENS_P50,
          A.COMPLETION_TOKENS_P90, A.RATE_CV)


def _read_trace(path: Path) -> pd.DataFrame:
    """One client's trace -> start_s (int), n (requests), cv, width (s)."""
    try:
        raw = pd.read_csv(path, header=None)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a readable ServeGen trace CSV ({e})") from e
    if raw.shape[1] != len(_COLS):
        raise ValueError(f"{path}: expected {len(_COLS)} columns {_COLS}, found {raw.shape[1]}")
    raw.columns = list(_COLS)
    num = raw[["start_s", "rate", "cv"]].apply(pd.to_numeric, errors="coerce")
    steps = np.unique(np.diff(num["start_s"].to_numpy()))
    if num[["start_s", "rate"]].isna().any().any() or len(steps) != 1 or steps[0] <= 0 or (
            num["rate"] < 0).any():
        raise ValueError(f"{path}: expected numeric start_s on a fixed step and rates >= 0")
    width = int(steps[0])
    return pd.DataFrame({"start_s": num["start_s"].astype("int64"),
                         "n": (num["rate"] * width).round().astype("int64"),
                         "cv": num["cv"], "width": width})


def _parse_hist(value: object, path: Path) -> tuple[np.ndarray, np.ndarray]:
    """`"{39: 0.0003, 40: ...}"` (or a dict) -> (token counts, probabilities); empty if none."""
    if isinstance(value, dict):
        pairs = np.array([[float(k), float(v)] for k, v in value.items()]).reshape(-1, 2)
    else:
        body = str(value).strip().strip("{}").strip()
        try:
            flat = np.array(body.replace(":", ",").split(","), dtype=float) if body else []
            pairs = np.asarray(flat, dtype=float).reshape(-1, 2)
        except ValueError as e:
            raise ValueError(f"{path}: token histogram is not {{tokens: probability}}") from e
    if (pairs[:, 0] < 0).any() or (pairs[:, 1] < 0).any():
        raise ValueError(f"{path}: negative token count or probability in a histogram")
    return pairs[:, 0], pairs[:, 1]


def _read_histograms(path: Path) -> dict[int, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """chunk-N-dataset.json -> {window start_s: {kind: (tokens, probs)}} (non-empty only)."""
    try:
        data = json.loads(path.read_text())
        windows = {int(k): v for k, v in data.items()}
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError, AttributeError) as e:
        raise ValueError(f"{path}: expected {{window_start_s: {{input_tokens, ...}}}}") from e
    out: dict[int, dict] = {}
    for start, hists in windows.items():
        parsed = {k: _parse_hist(hists[k], path) for k in _KINDS if k in hists}
        parsed = {k: h for k, h in parsed.items() if len(h[0]) and h[1].sum() > 0}
        if parsed:
            out[start] = parsed
    return out


def _mixture_quantiles(n: pd.DataFrame, hists: dict, kind: str) -> pd.DataFrame:
    """n: start_s x client request counts of one archetype -> p50/p90 of the mixture.

    A bucket uses the histogram window (union of the clients' window starts)
    holding its start; a client without a histogram for that window makes the
    bucket's quantiles null if it has requests there.
    """
    out = pd.DataFrame(np.nan, index=n.index, columns=list(_KINDS[kind]))
    windows = np.array(sorted({w for h in hists.values() for w in h}))
    if not len(windows):
        return out
    pos = np.searchsorted(windows, n.index.to_numpy(), side="right") - 1
    for j, window in enumerate(windows):
        rows = n.index[pos == j]
        has = [c for c in n.columns if kind in hists.get(c, {}).get(window, {})]
        if not has or not len(rows):
            continue
        covered = (n.loc[rows].drop(columns=has) == 0).all(axis=1).to_numpy()
        support = np.unique(np.concatenate([hists[c][window][kind][0] for c in has]))
        pmf = np.zeros((len(has), len(support)))
        for i, c in enumerate(has):
            tokens, probs = hists[c][window][kind]
            np.add.at(pmf[i], np.searchsorted(support, tokens), probs / probs.sum())
        mix = n.loc[rows, has].to_numpy(float) @ pmf  # (buckets, support), weights = requests
        total = mix.sum(axis=1)
        cdf = np.cumsum(mix, axis=1) / np.where(total > 0, total, 1.0)[:, None]
        for col, q in zip(_KINDS[kind], _QUANTILES, strict=True):
            idx = np.minimum((cdf < q - 1e-12).sum(axis=1), len(support) - 1)
            out.loc[rows, col] = np.where((total > 0) & covered, support[idx], np.nan)
    return out


def _group_name(trace: Path) -> str:
    return f"{trace.parent.parent.name}/{trace.parent.name}"


def import_servegen(path: str | Path, *, origin_ms: int = 0, archetype: str | None = None,
                    taxonomy_version: str = "servegen-1") -> pd.DataFrame:
    """One `chunk-N-trace.csv`, or a folder (searched recursively) -> aggregates-v1 rows.

    Full shared folder: 2,016 buckets (language/m-large) + 144 (reason/deepseek-r1).
    """
    path = Path(path)
    traces = [path] if path.is_file() else sorted(path.rglob("chunk-*-trace.csv"))
    if not traces:
        raise ValueError(f"{path}: expected chunk-N-trace.csv files (ServeGen per-client traces)")
    frames, hists = [], {}
    for t in traces:
        group = archetype or _group_name(t)
        frames.append(_read_trace(t).assign(group=group, client=str(t)))
        ds = t.with_name(t.name.replace("-trace.csv", "-dataset.json"))
        if ds.is_file():
            hists.setdefault(group, {})[str(t)] = _read_histograms(ds)
    df = pd.concat(frames, ignore_index=True)
    widths = df.groupby("group")["width"].nunique()
    if (widths > 1).any():
        raise ValueError(f"{path}: traces of {widths[widths > 1].index[0]!r} mix window widths")
    df["w"] = df["n"] * df["cv"] ** 2
    df["cv_missing"] = df["cv"].isna() & (df["n"] > 0)
    g = df.groupby(["group", "start_s"])
    agg = g.agg(n=("n", "sum"), w=("w", "sum"), cv_missing=("cv_missing", "any"),
                width=("width", "first")).reset_index()
    rate_cv = np.sqrt(agg["w"] / agg["n"].where(agg["n"] > 0))
    agg["rate_cv"] = rate_cv.where(~agg["cv_missing"])
    quantiles = []
    for group, part in df.groupby("group"):
        counts = part.pivot_table(index="start_s", columns="client", values="n",
                                  aggfunc="sum", fill_value=0)
        qs = [_mixture_quantiles(counts, hists.get(group, {}), k) for k in _KINDS]
        quantiles.append(pd.concat(qs, axis=1).assign(group=group).reset_index())
    agg = agg.merge(pd.concat(quantiles, ignore_index=True), on=["group", "start_s"])
    out = pd.DataFrame({
        A.VERSION: AGGREGATES_VERSION,
        A.BUCKET_START: int(origin_ms) + agg["start_s"] * 1000,
        A.BUCKET_SECONDS: agg["width"].astype("int64"),
        A.ARCHETYPE: agg["group"], A.TAXONOMY_VERSION: taxonomy_version,
        A.SLO_CLASS: "all", A.REGION: "all", A.REQUESTS: agg["n"].astype("int64"),
        A.PROMPT_TOKENS_SUM: pd.array([pd.NA] * len(agg), dtype="Int64"),
        A.COMPLETION_TOKENS_SUM: pd.array([pd.NA] * len(agg), dtype="Int64"),
        **{c: agg[c].astype(float) for cols in _KINDS.values() for c in cols},
        A.RATE_CV: agg["rate_cv"].astype(float),
    })
    out = out[list(_ORDER)].sort_values([A.ARCHETYPE, A.BUCKET_START]).reset_index(drop=True)
    out.attrs["import_report"] = {"source": str(path), "clients": len(traces),
                                  "clients_with_histograms": sum(map(len, hists.values()))}
    return out
