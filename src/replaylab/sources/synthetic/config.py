"""What the seeded synthetic ledger holds: its config, validated at construction.

The generator is sources/synthetic/generator.py (docs/design/synthetic-ledger.md); the fitted
distributions the config may name are in params.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from replaylab.sources.synthetic import params as P

_CATEGORIES = ("chat", "code", "rag", "math")
_MODELS = ("llama-3.1-8b-instruct", "llama-3.3-70b-instruct", "llama-3.1-405b-instruct")


def _default_policy() -> dict[str, tuple[float, ...]]:
    """P(model | category) of the logging router's classifier; models small -> large."""
    return {"chat": (0.6, 0.35, 0.05), "code": (0.25, 0.55, 0.2), "rag": (0.4, 0.5, 0.1),
            "math": (0.2, 0.5, 0.3)}


@dataclass
class SyntheticLedgerConfig:
    """What the synthetic ledger holds. Rates are per request unless said per session."""

    n_sessions: int = 4000
    n_requests: int | None = None  # if set: exactly this many rows (overrides n_sessions)
    start_ms: int = 1_700_092_800_000  # 2023-11-16T00:00:00Z, the day of the Azure traces
    sessions_per_s: float = 2.0  # session starts per second of active (non-OFF) time
    min_window_s: float = 3600.0  # starts spread over at least this: small ledgers keep
    # whole conversations (think times are minutes); 1 h, the length of the Azure traces
    max_turns: int = 200
    # Daily and weekly profile of session starts (chosen, not fitted; 0 / 1: none, the
    # default): the start rate at clock time t is proportional to 1 + diurnal_amplitude x
    # cos(2 pi (hour of day UTC - diurnal_peak_hour) / 24), times weekend_factor on Saturday
    # and Sunday (UTC). The mean rate over the ledger is unchanged.
    diurnal_amplitude: float = 0.0
    diurnal_peak_hour: float = 14.0
    weekend_factor: float = 1.0
    categories: tuple[str, ...] = _CATEGORIES  # each must have a fit in params
    category_mix: tuple[float, ...] = (0.5, 0.25, 0.15, 0.10)  # per session
    models: tuple[str, ...] = _MODELS  # small -> large; escalation goes one step up
    router_policy: dict[str, tuple[float, ...]] = field(default_factory=_default_policy)
    exploration_rate: float = 0.05  # per binding: uniform model instead of the classifier
    escalation_rate: float = 0.3  # P(rebind to the next model | a failing turn, turns left)
    auto_model_share: float = 0.8  # per session: client asks "auto"; else it fixes a model
    slo_classes: tuple[str, ...] = ("interactive", "batch")
    slo_mix: tuple[float, ...] = (0.85, 0.15)
    regions: tuple[str, ...] = ("us-east", "us-west", "eu-west")
    region_mix: tuple[float, ...] = (0.5, 0.2, 0.3)
    capped_share: float = 0.5  # per session: the client sets max_tokens
    cap_values: tuple[int, ...] = (256, 512, 1024, 2048, 4096)
    cap_weights: tuple[float, ...] = (0.15, 0.25, 0.3, 0.2, 0.1)
    streaming_share: float = 0.7  # per interactive session; batch sessions never stream
    abort_rate: float = 0.03
    failure_rate: float = 0.01
    unknown_state_rate: float = 0.005  # lifecycle unknown: no usage, no end time
    absent_usage_rate: float = 0.02  # of completed requests: completion_tokens null
    overlap_rate: float = 0.02  # of turns k >= 1: dispatched before turn k-1 ended
    receipt_rate: float = 0.9  # turns with an outcome receipt (else outcome_status unknown)
    cache_hit_rate: float = 0.8  # turns k >= 1 whose conversation prefix is still cached
    currency: str = "USD"

    def __post_init__(self) -> None:
        for name in ("categories", "category_mix", "models", "slo_classes", "slo_mix",
                     "regions", "region_mix", "cap_values", "cap_weights"):
            setattr(self, name, tuple(getattr(self, name)))  # YAML gives lists
        self.router_policy = {k: tuple(v) for k, v in dict(self.router_policy).items()}

        def bad(name: str, why: str) -> None:
            raise ValueError(f"{name}={getattr(self, name)!r}: {why}")

        for name, ok, why in (
            ("n_sessions", self.n_sessions >= 1, "must be >= 1"),
            ("n_requests", self.n_requests is None or self.n_requests >= 1, "must be >= 1 or null"),
            ("sessions_per_s", self.sessions_per_s > 0, "must be > 0"),
            ("min_window_s", self.min_window_s >= 0, "must be >= 0"),
            ("max_turns", self.max_turns >= 1, "must be >= 1"),
            ("diurnal_amplitude", 0.0 <= self.diurnal_amplitude < 1.0, "must be in [0, 1)"),
            ("diurnal_peak_hour", 0.0 <= self.diurnal_peak_hour < 24.0, "must be in [0, 24)"),
            ("weekend_factor", self.weekend_factor > 0, "must be > 0"),
            ("cap_values", min(self.cap_values, default=0) >= 1, "caps must be >= 1 token"),
            ("abort_rate", self.abort_rate + self.failure_rate + self.unknown_state_rate < 1,
             "abort + failure + unknown_state rates must sum below 1"),
        ):
            if not ok:
                bad(name, why)
        for name in ("exploration_rate", "escalation_rate", "auto_model_share", "capped_share",
                     "streaming_share", "abort_rate", "failure_rate", "unknown_state_rate",
                     "absent_usage_rate", "overlap_rate", "receipt_rate", "cache_hit_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                bad(name, "must be in [0, 1]")
        for names, mix in (("categories", "category_mix"), ("slo_classes", "slo_mix"),
                           ("regions", "region_mix"), ("cap_values", "cap_weights")):
            w = getattr(self, mix)
            if len(w) != len(getattr(self, names)) or min(w, default=-1) < 0 or sum(w) <= 0:
                bad(mix, f"needs one weight >= 0 per entry of {names}, not all zero")
        if unknown := [c for c in self.categories if c not in P.CATEGORY_TOKENS]:
            bad("categories", f"no fitted parameters for {unknown}; known {list(P.CATEGORY_TOKENS)}")
        if unknown := [m for m in self.models if m not in P.MODEL_PROFILES]:
            bad("models", f"no profile for {unknown}; known {list(P.MODEL_PROFILES)}")
        for c in self.categories:
            p = self.router_policy.get(c, ())
            if len(p) != len(self.models) or min(p) < 0 or sum(p) <= 0:
                bad("router_policy", f"needs {len(self.models)} weights >= 0 for {c!r}")
