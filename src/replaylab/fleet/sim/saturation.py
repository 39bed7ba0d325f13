"""A fleet's capacity measured on the simulator itself: a short saturation run.

Definition. The capacity of a fleet (pools of `PoolConfig`) for a token mix is
the rate at which it completes requests while it is saturated: every replica
has a non-empty queue, so every iteration runs as full a batch as max_batch and
the KV cache allow, with the batch composition the simulator's own admission
rule (FCFS, head-of-line, whole KV reservations) produces. It is measured by
offering `requests` requests at t = 0 (an offered load far above any capacity),
their prompt and completion tokens resampled with replacement (seed `seed`) from
the mix, to an unbounded FIFO with no timeouts, deadlines or cancellations,
placed by least-loaded. The measurement window opens once `warmup` of the
requests have completed (the batches have filled and the first, short-request
heavy completions are past) and closes when the first replica takes the last
request of its queue (after that it drains and is no longer saturated):

    capacity = completions in (t_open, t_close] / (t_close - t_open)

This is the throughput the fleet serves when offered more than it can take; an
offered rate below it leaves the queues bounded, one above it makes them grow
at (offered - capacity) requests/s. It includes what the analytic formula
(`overload.capacity_estimate`: a full KV-limited batch, mean iteration, no
head-of-line blocking) leaves out, which is why that formula overstates it.

Cost: the simulator handles ~10^5 requests/s of wall time, so the default
40,000-request run takes well under a second. Results are cached in memory per
fingerprint (every pool's profile, replicas and model, the token mix, the run's
settings) and, with `cache_dir`, on disk as `capacity-<fingerprint>.json`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from replaylab.fleet.sim.fleet import QUEUEING

SOURCE = "simulated saturation run"
_MEMORY: dict[str, dict[str, Any]] = {}


def fingerprint(pools: Sequence, prompt: np.ndarray, completion: np.ndarray,
                requests: int, seed: int, warmup: float, queueing: str) -> str:
    """sha256 of what the capacity depends on: pools (profile, replicas, model), mix, settings."""
    h = hashlib.sha256()
    desc = [{"pool_id": p.pool_id, "model": p.model, "replicas": p.replicas,
             "region": p.region, "profile": dataclasses.asdict(p.profile)} for p in pools]
    h.update(json.dumps({"pools": desc, "requests": int(requests), "seed": int(seed),
                         "warmup": float(warmup), "queueing": queueing},
                        sort_keys=True, default=str).encode())
    for a in (prompt, completion):
        h.update(np.ascontiguousarray(a, dtype="int64").tobytes())
        h.update(b"|")
    return h.hexdigest()


def saturated_capacity(pools: Sequence, prompt: np.ndarray, completion: np.ndarray, *,
                       requests: int = 40_000, seed: int = 0, warmup: float = 0.1,
                       queueing: str = "replica",
                       cache_dir: str | Path | None = None) -> dict[str, Any]:
    """Requests/s the fleet completes while saturated (module docstring), cached.

    Returns {"source", "req_per_s", "pools": {pool_id: req/s}, "duration_s" (the
    measurement window, simulated), "window_s": [open, close], "completions"
    (in the window), "requests", "seed", "warmup", "queueing", "fingerprint",
    "wall_s" (of the run that measured it), "cache": "computed" | "memory" | "disk"}.
    """
    prompt = np.asarray(prompt, dtype="int64")
    completion = np.maximum(np.asarray(completion, dtype="int64"), 1)
    if prompt.size == 0 or prompt.size != completion.size:
        raise ValueError("saturated_capacity: an empty or ragged token mix")
    if not pools or not sum(p.replicas for p in pools):
        raise ValueError("saturated_capacity: the fleet has no replica")
    if len({p.model for p in pools}) != 1:
        raise ValueError("saturated_capacity: every pool must serve the one model of the mix")
    if not (isinstance(requests, int) and requests >= 1000):
        raise ValueError(f"requests={requests}: must be an integer >= 1000")
    if not 0 <= warmup < 0.5:
        raise ValueError(f"warmup={warmup}: must be in [0, 0.5)")
    if queueing not in QUEUEING:
        raise ValueError(f"queueing={queueing!r}: one of {QUEUEING}")
    key = fingerprint(pools, prompt, completion, requests, seed, warmup, queueing)
    if key in _MEMORY:
        return {**_MEMORY[key], "cache": "memory"}
    path = Path(cache_dir) / f"capacity-{key[:24]}.json" if cache_dir else None
    if path is not None and path.is_file():
        try:
            hit = json.loads(path.read_text())
        except (OSError, ValueError):
            hit = None
        if isinstance(hit, dict) and hit.get("fingerprint") == key:
            _MEMORY[key] = hit
            return {**hit, "cache": "disk"}
    out = _measure(pools, prompt, completion, requests, seed, warmup, queueing)
    out["fingerprint"] = key
    _MEMORY[key] = out
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=1, sort_keys=True))
    return {**out, "cache": "computed"}


def _measure(pools: Sequence, prompt: np.ndarray, completion: np.ndarray, requests: int,
             seed: int, warmup: float, queueing: str) -> dict[str, Any]:
    from replaylab.fleet.policies.reference import LeastLoaded
    from replaylab.fleet.sim.fleet import SimConfig
    from replaylab.fleet.sim.simulator import FleetSim
    from replaylab.fleet.sim.workload import Workload

    idx = np.random.default_rng(seed).integers(0, prompt.size, requests)
    z = np.zeros(requests, dtype="int16")
    w = Workload(np.zeros(requests), prompt[idx], completion[idx], z, (pools[0].model,),
                 z, ("interactive",), np.full(requests, -1, dtype="int16"),
                 source="saturation")
    t0 = time.perf_counter()
    res = FleetSim(list(pools), SimConfig(queueing=queueing, queue_capacity=requests),
                   LeastLoaded()).run(w)
    wall = time.perf_counter() - t0
    if not res.completed.all():
        raise RuntimeError(f"saturation run: {int((~res.completed).sum())} of {requests} "
                           "requests did not complete")
    end = res.end_s
    t_open = float(np.sort(end)[int(warmup * requests)])
    last_start = {}
    for r, s in zip(res.replica.tolist(), res.start_s.tolist(), strict=True):
        if s > last_start.get(r, -math.inf):
            last_start[r] = s
    t_close = min(last_start.values())
    inside = (end > t_open) & (end <= t_close)
    n_in = int(inside.sum())
    if not t_close > t_open or n_in < 0.25 * requests:
        raise ValueError(f"saturation run too short: {n_in} of {requests} completions "
                         f"in ({t_open:.1f}, {t_close:.1f}] s; raise `requests`")
    span = t_close - t_open
    pool_of = dict(zip(res.replicas["replica"].tolist(), res.replicas["pool_id"].tolist(),
                       strict=True))
    per_pool = dict.fromkeys((p.pool_id for p in pools), 0)
    for r in res.replica[inside].tolist():
        per_pool[pool_of[r]] += 1
    return {"source": SOURCE, "req_per_s": n_in / span,
            "pools": {p: k / span for p, k in per_pool.items()},
            "duration_s": span, "window_s": [t_open, t_close], "completions": n_in,
            "requests": requests, "seed": seed, "warmup": warmup, "queueing": queueing,
            "wall_s": wall}


def clear_memory_cache() -> None:
    """Forget the in-memory results (tests)."""
    _MEMORY.clear()
