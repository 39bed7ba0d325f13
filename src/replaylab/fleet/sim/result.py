"""What one simulation run returns: every request's fate and timings, every replica's totals.

Request states (int8 codes in `SimResult.state`): after the drain every request
is in exactly one of COMPLETED, REJECTED, TIMED_OUT, CANCELLED; the simulator
checks that the four counts sum to the number of arrivals before it returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from replaylab.fleet.hardware.profiles import weakest
from replaylab.fleet.sim.workload import Workload

PENDING, QUEUED, RUNNING, COMPLETED, REJECTED, TIMED_OUT, CANCELLED = range(7)
TERMINAL = {"completed": COMPLETED, "rejected": REJECTED, "timed_out": TIMED_OUT,
            "cancelled": CANCELLED}


@dataclass(frozen=True)
class SimResult:
    """Per-request arrays (n,) in workload order and one row per replica.

    start_s: service start (joined a batch); first_token_s; end_s: completion,
    rejection, timeout or cancellation time. All absolute simulated seconds,
    NaN where never reached. output_tokens: tokens generated (partial for a
    request cancelled or timed out mid-stream). replica: -1 if never placed.
    """

    workload: Workload
    state: np.ndarray
    replica: np.ndarray
    start_s: np.ndarray
    first_token_s: np.ndarray
    end_s: np.ndarray
    output_tokens: np.ndarray
    replicas: pd.DataFrame
    reject_reasons: dict[str, int] = field(default_factory=dict)
    drained: int = 0          # still queued at the drain: counted as timed_out
    end_time_s: float = 0.0   # energy and GPU-hours window end
    events: int = 0
    wall_s: float = 0.0

    def counts(self) -> dict[str, int]:
        """arrived and the four terminal counts (which sum to arrived)."""
        bc = np.bincount(self.state.astype("int64"), minlength=7)
        out = {"arrived": int(self.state.size)}
        out.update({name: int(bc[code]) for name, code in TERMINAL.items()})
        return out

    @property
    def completed(self) -> np.ndarray:
        return self.state == COMPLETED

    @property
    def ttft_s(self) -> np.ndarray:
        """Time to first token (n,), NaN where no first token reached the client."""
        return self.first_token_s - self.workload.arrival_s

    @property
    def e2e_s(self) -> np.ndarray:
        """End-to-end latency (n,) of completed requests; NaN otherwise."""
        return np.where(self.completed, self.end_s - self.workload.arrival_s, np.nan)

    @property
    def tpot_s(self) -> np.ndarray:
        """Time per output token after the first (n,), completed requests with >= 2 tokens."""
        c = self.workload.completion_tokens
        ok = self.completed & (c > 1)
        return np.where(ok, (self.end_s - self.first_token_s) / np.maximum(c - 1, 1), np.nan)

    @property
    def queue_wait_s(self) -> np.ndarray:
        """Arrival to service start (n,), NaN for requests never started."""
        return self.start_s - self.workload.arrival_s

    @property
    def energy_j(self) -> float:
        return float(self.replicas["energy_j"].sum()) if len(self.replicas) else 0.0

    @property
    def gpu_hours(self) -> float:
        return float(self.replicas["gpu_hours"].sum()) if len(self.replicas) else 0.0

    @property
    def cost(self) -> float:
        return float(self.replicas["cost"].sum()) if len(self.replicas) else 0.0

    @property
    def energy_provenance(self) -> str:
        """The weakest energy provenance among replicas that were switched on."""
        on = self.replicas[self.replicas["on_s"] > 0] if len(self.replicas) else self.replicas
        return weakest(on["energy_provenance"]) if len(on) else "modeled"

    def utilization(self) -> float:
        """Busy replica-seconds / switched-on replica-seconds (batch >= 1 counts as busy)."""
        on = float(self.replicas["on_s"].sum())
        return float(self.replicas["busy_s"].sum()) / on if on > 0 else float("nan")

    def to_frame(self) -> pd.DataFrame:
        """One row per request: state name, replica, timings and tokens."""
        names = np.array(["pending", "queued", "running", *TERMINAL], dtype=object)
        w = self.workload
        return pd.DataFrame({
            "arrival_s": w.arrival_s, "state": names[self.state], "replica": self.replica,
            "model": np.asarray(w.models, dtype=object)[w.model] if w.models else None,
            "prompt_tokens": w.prompt_tokens, "completion_tokens": w.completion_tokens,
            "output_tokens": self.output_tokens, "start_s": self.start_s,
            "first_token_s": self.first_token_s, "end_s": self.end_s, "ttft_s": self.ttft_s,
            "e2e_s": self.e2e_s, "tpot_s": self.tpot_s})
