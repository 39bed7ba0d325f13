"""Analytic queueing formulas that cross-check the simulator in its stable regime.

M/G/c with c identical servers, Poisson arrivals of rate lam, service time S
with mean E[S] and squared coefficient of variation cs2 = Var[S] / E[S]^2:

    offered load  a   = lam * E[S]                 (Erlangs)
    utilisation   rho = a / c                      (< 1 for stability)
    Erlang C      C(c, a) = P(wait > 0) in M/M/c, from the Erlang B recursion
                  B(0) = 1,  B(k) = a B(k-1) / (k + a B(k-1)),
                  C = B(c) / (1 - rho (1 - B(c)))
    M/M/c wait    Wq_mmc = C(c, a) * E[S] / (c - a)
    M/G/c wait    Wq ~= (ca2 + cs2) / 2 * Wq_mmc          (Allen-Cunneen)

With Poisson arrivals (ca2 = 1) the Allen-Cunneen factor is (1 + cs2) / 2, the
Lee-Longton approximation; it is exact for c = 1 (Pollaczek-Khinchine) and for
exponential service (cs2 = 1). The simulator reproduces M/G/c when every
replica has max_batch = 1 (one sequence: one server) and queueing is shared
(one FIFO for the fleet): `single_sequence_service_s` gives each request's
service time on such a replica.

Why by hand: these are five lines of closed-form arithmetic; no queueing
library in the environment provides M/G/c approximations.
"""

from __future__ import annotations

import math

import numpy as np

from replaylab.fleet.hardware.profiles import GpuProfile


def erlang_b(c: int, a: float) -> float:
    """Blocking probability of M/M/c/c with offered load a (Erlangs)."""
    b = 1.0
    for k in range(1, c + 1):
        b = a * b / (k + a * b)
    return b


def erlang_c(c: int, a: float) -> float:
    """Probability that an arrival waits in M/M/c with offered load a < c."""
    if not 0 <= a < c:
        raise ValueError(f"erlang_c needs 0 <= a < c, got a={a}, c={c}")
    b = erlang_b(c, a)
    rho = a / c
    return b / (1.0 - rho * (1.0 - b))


def mgc_mean_wait(lam: float, mean_s: float, cs2: float, c: int, ca2: float = 1.0) -> float:
    """Mean time in queue (s) by Allen-Cunneen; ca2 = 1 (Poisson) is Lee-Longton's M/G/c."""
    a = lam * mean_s
    if a >= c:
        return math.inf
    return (ca2 + cs2) / 2.0 * erlang_c(c, a) * mean_s / (c - a)


def mgc_summary(lam: float, service_s: np.ndarray, c: int) -> dict[str, float]:
    """Analytic utilisation and mean wait for arrival rate lam and sampled service times (n,)."""
    s = np.asarray(service_s, dtype="float64")
    mean = float(s.mean())
    cs2 = float(s.var() / mean ** 2)
    return {"c": c, "lam": lam, "mean_service_s": mean, "cs2": cs2,
            "utilization": lam * mean / c, "mean_wait_s": mgc_mean_wait(lam, mean, cs2, c)}


def single_sequence_service_s(prompt_tokens: np.ndarray, completion_tokens: np.ndarray,
                              profile: GpuProfile) -> np.ndarray:
    """Service time (n,) of each request alone on a replica (batch of one), in seconds.

    pf = max(1, ceil(prompt / chunk)) prefill iterations, then completion - 1
    decode iterations; each iteration costs base + per_seq + per_kv * K (+ the
    prefill chunk cost while prefilling), K = the request's KV reservation.
    """
    p = np.asarray(prompt_tokens, dtype="int64")
    c = np.asarray(completion_tokens, dtype="int64")
    pf = np.maximum(1, -(-p // profile.chunk_tokens))
    blk = profile.kv_block_tokens
    kv = -(-(p + c) // blk) * blk
    it = profile.base_s + profile.per_seq_s + profile.per_kv_token_s * kv
    return pf * (it + profile.prefill_chunk_s) + (c - 1) * it
