"""Typed configs of the router's label layer: costs, rules, exploration, replay, evaluation.

Frozen dataclasses; YAML (conf/router/) carries the values. A bad value fails at
construction with `Cls.field=value: why`; `from_mapping` turns that into a
ConfigError naming the config path at the entry point. Mappings (price tables,
per-task rules) arrive from Hydra as DictConfig or dict and are stored as plain
dicts of plain values.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field

from replaylab.config import fail_field as _fail

PRICE_KEYS = ("input_usd_per_million", "output_usd_per_million")


def _int_at_least(cls: str, name: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        _fail(cls, name, value, f"must be an integer >= {low}")


def _str_map(cls: str, name: str, value: object) -> dict[str, str]:
    if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        _fail(cls, name, value, "must be a mapping of names to candidate names")
    return dict(value)  # type: ignore[union-attr]


@dataclass(frozen=True)
class RouterCostConfig:
    """How a call is priced when the outcome table has no `cost` (outcomes-v1 rules).

    prices: {candidate: {input_usd_per_million, output_usd_per_million}}: turns the
        table's token counts into USD (e.g. `load_llmrouter_prices`, RouterArena's
        cost.json). Used only where `cost` is null and both token counts are known.
    call_cost_usd: {candidate: USD per call}: the last resort when neither cost nor
        token counts are known (RouteLLM's GSM8K/MMLU). A number from here is
        MODELED, and the matrix report counts the calls priced this way.
    """

    prices: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    call_cost_usd: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        name = type(self).__name__
        if not isinstance(self.prices, Mapping):
            _fail(name, "prices", self.prices, "must be a mapping candidate -> prices")
        prices: dict[str, dict[str, float]] = {}
        for cand, row in self.prices.items():
            if not isinstance(row, Mapping) or set(row) != set(PRICE_KEYS) or any(
                    isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0
                    for v in row.values()):
                _fail(name, f"prices.{cand}", row,
                      f"must hold exactly {', '.join(PRICE_KEYS)} as numbers >= 0")
            prices[str(cand)] = {k: float(row[k]) for k in PRICE_KEYS}
        object.__setattr__(self, "prices", prices)
        if not isinstance(self.call_cost_usd, Mapping) or any(
                isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0
                for v in self.call_cost_usd.values()):
            _fail(name, "call_cost_usd", self.call_cost_usd,
                  "must be a mapping candidate -> USD per call (>= 0)")
        object.__setattr__(self, "call_cost_usd",
                           {str(k): float(v) for k, v in self.call_cost_usd.items()})


@dataclass(frozen=True)
class RouterRulesConfig:
    """The scenario-rules policy deployed before learning (rules.py).

    task_candidate: {task: candidate} configured by hand; wins over fitting.
    default_candidate: for tasks with no rule; null: fitted on the training split.
    long_prompt_tokens, long_prompt_candidate: a prompt longer than the threshold
        goes to that candidate (both set or both null). Length = prompt tokens when
        the table has them, else ceil(characters / chars_per_token).
    fit_tasks: tasks without a configured rule get one fitted on the training split:
        the cheapest candidate whose mean score on the task is within
        `quality_tolerance` (absolute) of the task's best; a task with fewer than
        `min_task_prompts` training prompts uses the default.
    """

    task_candidate: Mapping[str, str] = field(default_factory=dict)
    default_candidate: str | None = None
    long_prompt_tokens: int | None = None
    long_prompt_candidate: str | None = None
    fit_tasks: bool = True
    quality_tolerance: float = 0.02
    min_task_prompts: int = 30
    chars_per_token: float = 4.0

    def __post_init__(self) -> None:
        name = type(self).__name__
        object.__setattr__(self, "task_candidate",
                           _str_map(name, "task_candidate", self.task_candidate))
        for f in ("default_candidate", "long_prompt_candidate"):
            v = getattr(self, f)
            if v is not None and (not isinstance(v, str) or not v):
                _fail(name, f, v, "must be a candidate name or null")
        if (self.long_prompt_tokens is None) != (self.long_prompt_candidate is None):
            _fail(name, "long_prompt_tokens", self.long_prompt_tokens,
                  "must be set together with long_prompt_candidate (or both null)")
        if self.long_prompt_tokens is not None:
            _int_at_least(name, "long_prompt_tokens", self.long_prompt_tokens, 1)
        if not isinstance(self.fit_tasks, bool):
            _fail(name, "fit_tasks", self.fit_tasks, "must be a bool")
        if not 0.0 <= float(self.quality_tolerance) <= 1.0:
            _fail(name, "quality_tolerance", self.quality_tolerance, "must be in [0, 1]")
        _int_at_least(name, "min_task_prompts", self.min_task_prompts, 1)
        if not float(self.chars_per_token) > 0:
            _fail(name, "chars_per_token", self.chars_per_token, "must be > 0")


@dataclass(frozen=True)
class RouterExplorationConfig:
    """Session-scoped exploration of the simulated logging policy (exploration.py).

    rate: share of NEW sessions bound to another candidate drawn uniformly among the
        K-1 candidates the rules did not choose; refused above `cap`.
    cap: the most exploration the deployment tolerates (a guard, not a target).
    mean_turns, max_turns: turns per session ~ min(Geometric(1/mean_turns), max_turns).
    sessions_per_prompt: independent sessions opened by each prompt (>= 1).
    escalation: rebind to the next stronger candidate of the ladder after a failed
        turn, for the remaining turns (rebind_reason=escalation).
    ladder: candidates weakest -> strongest; empty: ordered by mean score on the
        table handed to the simulation (the report says it was fitted).
    start_ms, mean_session_gap_s, mean_think_s: simulated clock (epoch ms; mean
        exponential gap between session openings; between turns of a session).
    """

    rate: float = 0.05
    cap: float = 0.10
    mean_turns: float = 3.0
    max_turns: int = 8
    sessions_per_prompt: int = 1
    escalation: bool = True
    ladder: tuple[str, ...] = ()
    start_ms: int = 1_735_689_600_000  # 2025-01-01T00:00:00Z
    mean_session_gap_s: float = 30.0
    mean_think_s: float = 20.0
    seed: int = 0

    def __post_init__(self) -> None:
        name = type(self).__name__
        if not 0.0 < float(self.cap) < 1.0:
            _fail(name, "cap", self.cap, "must be in (0, 1)")
        if not 0.0 <= float(self.rate) <= float(self.cap):
            _fail(name, "rate", self.rate,
                  f"must be in [0, cap={self.cap}]: exploration above the cap is refused")
        if not float(self.mean_turns) >= 1.0:
            _fail(name, "mean_turns", self.mean_turns, "must be >= 1")
        _int_at_least(name, "max_turns", self.max_turns, 1)
        _int_at_least(name, "sessions_per_prompt", self.sessions_per_prompt, 1)
        if not isinstance(self.escalation, bool):
            _fail(name, "escalation", self.escalation, "must be a bool")
        if isinstance(self.ladder, str) or not all(isinstance(c, str) for c in self.ladder):
            _fail(name, "ladder", self.ladder, "must be a list of candidate names")
        if len(set(self.ladder)) != len(tuple(self.ladder)):
            _fail(name, "ladder", self.ladder, "must not repeat a candidate")
        object.__setattr__(self, "ladder", tuple(self.ladder))
        _int_at_least(name, "start_ms", self.start_ms, 0)
        _int_at_least(name, "seed", self.seed, 0)
        for f in ("mean_session_gap_s", "mean_think_s"):
            if not float(getattr(self, f)) > 0:
                _fail(name, f, getattr(self, f), "must be > 0")


@dataclass(frozen=True)
class RouterReplayConfig:
    """Offline replay of logged opening prompts against the other candidates (replay.py).

    share: fraction of distinct logged opening prompts replayed.
    selection: which prompts: `random` (a seeded draw), `planned` (the top of the replay
        plan, router/replay.py `plan_prompts`), `planned_gain` (the same plan ranked by
        the expected gain, `replay_plan.expected_gain`; tried in issue 46, never chosen by
        `auto`), `planned_halves` (`planned` at share/2, the round-0 head refitted on the
        receipts plus those replays, then `planned` again for the other share/2 among the
        prompts not yet replayed; tried in issue 46, never chosen by `auto`) or `auto`
        (random and planned; the one whose head is cheaper on the calibration split at the
        served quality, chosen per run).
    """

    share: float = 0.10
    seed: int = 0
    selection: str = "auto"

    def __post_init__(self) -> None:
        name = type(self).__name__
        if not 0.0 <= float(self.share) <= 1.0:
            _fail(name, "share", self.share, "must be in [0, 1]")
        _int_at_least(name, "seed", self.seed, 0)
        if self.selection not in ("random", "planned", "planned_gain", "planned_halves", "auto"):
            _fail(name, "selection", self.selection,
                  "must be random, planned, planned_gain, planned_halves or auto")


@dataclass(frozen=True)
class RouterEvalConfig:
    """Off-policy estimates and cost/quality curves (ope.py, metrics.py).

    n_boot, level: session-bootstrap replicates and the two-sided interval level
        (0.95 -> columns `*-lo-95`, `*-hi-95`).
    n_thresholds: threshold grid of a curve (quantiles of the router's scores,
        plus both ends: all-weakest and all-strongest).
    quality_target: cost_ratio_at_95 looks for quality >= target x strong-only quality.
    strong, weak: the PGR anchors; null: strong = best mean score, weak = cheapest.
    max_weight: clip importance weights at this value (null: no clipping, unbiased).
    attribution: receipts mode's gain attribution (own decisions / exploration / replays,
        pipelines/router_attribution.py): auto (on when the run has replays or explored
        sessions; one refit of the served head per point) or off (nothing computed or written).
    """

    n_boot: int = 500
    level: float = 0.95
    n_thresholds: int = 101
    quality_target: float = 0.95
    strong: str | None = None
    weak: str | None = None
    max_weight: float | None = None
    seed: int = 0
    attribution: str = "auto"

    def __post_init__(self) -> None:
        name = type(self).__name__
        if self.attribution not in ("auto", "off"):
            _fail(name, "attribution", self.attribution, "must be one of ('auto', 'off')")
        _int_at_least(name, "n_boot", self.n_boot, 0)
        _int_at_least(name, "n_thresholds", self.n_thresholds, 2)
        _int_at_least(name, "seed", self.seed, 0)
        if not 0.5 <= float(self.level) < 1.0:
            _fail(name, "level", self.level, "must be in [0.5, 1)")
        if not 0.0 < float(self.quality_target) <= 1.0:
            _fail(name, "quality_target", self.quality_target, "must be in (0, 1]")
        if self.max_weight is not None and not float(self.max_weight) >= 1.0:
            _fail(name, "max_weight", self.max_weight, "must be >= 1 or null")
        for f in ("strong", "weak"):
            v = getattr(self, f)
            if v is not None and (not isinstance(v, str) or not v):
                _fail(name, f, v, "must be a candidate name or null")

    @property
    def level_tag(self) -> str:
        """`95` for level 0.95: the suffix of interval keys (`quality-lo-95`)."""
        return f"{round(float(self.level) * 100, 6):g}"
