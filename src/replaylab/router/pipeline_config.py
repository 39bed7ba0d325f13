"""The router pipeline's config (conf/router/default.yaml): candidates, splits, stages, gate."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from replaylab.config import ConfigError, fail_field, from_mapping
from replaylab.router.config import (
    RouterCostConfig,
    RouterEvalConfig,
    RouterExplorationConfig,
    RouterReplayConfig,
    RouterRulesConfig,
)
from replaylab.router.head_config import HeadConfig, HeadSelectConfig
from replaylab.router.objective import ObjectiveConfig
from replaylab.router.policy import PolicyConfig
from replaylab.router.receipts import ReceiptsConfig
from replaylab.router.replay_plan import ReplayPlanConfig
from replaylab.router.sequential import SequentialConfig

GO_BASELINES = ("rules", "rules_equal")  # summary["test"] keys the gate may compare against


@dataclass(frozen=True)
class GoConfig:
    """The go/no-go gate and the learning curve.

    What the gate asks is `router.objective` (router/objective.py: the criteria of each
    kind; the margin of kind incumbent is `objective.margin`). sessions_per_day: new
    sessions a day in the deployment the report plans for (to turn explored sessions
    and the sessions a NOT ENOUGH EVIDENCE needs into days).
    curve_fractions: shares of the explored sessions the learning curve refits on.
    baseline: the incumbent of outcomes mode, the rules the gate compares against. `rules` (default): the scenario
    rules fitted on the training split's full outcome table, which in the simulation
    are also the logging policy, i.e. the policy the learned router would replace;
    `rules_equal`: the same rules fitted only on the label budget the learned router
    sees (the training prompts whose every candidate's outcome is known from the
    logged decision plus offline replay), the fair comparison of the two methods.
    """

    sessions_per_day: float = 10_000.0
    curve_fractions: tuple[float, ...] = (0.25, 0.5, 1.0)
    n_boot: int = 1000
    baseline: str = "rules"

    def __post_init__(self) -> None:
        name = type(self).__name__
        if self.baseline not in GO_BASELINES:
            fail_field(name, "baseline", self.baseline, f"must be one of {GO_BASELINES}")
        if not float(self.sessions_per_day) > 0:
            fail_field(name, "sessions_per_day", self.sessions_per_day, "must be > 0")
        fr = tuple(float(f) for f in self.curve_fractions)
        if not fr or any(not 0.0 < f <= 1.0 for f in fr):
            fail_field(name, "curve_fractions", self.curve_fractions, "values in (0, 1]")
        object.__setattr__(self, "curve_fractions", tuple(sorted(set(fr))))
        if int(self.n_boot) < 100:
            fail_field(name, "n_boot", self.n_boot, "must be >= 100")


@dataclass(frozen=True)
class RouterPipelineConfig:
    """Everything `train_router` needs.

    candidates: cheapest first (the strongest last); split: train / calibration /
    test shares of the prompts (seeded, by prompt); cost, rules, exploration, replay,
    evaluation: the label layer's stages (router/config.py), each under its YAML key
    (`router.cost`, ...); head, policy: the learned
    router and its threshold rule; head_select: which of the head's clip, teachers and
    width are chosen per run on calibration (router/head_select.py); objective: what the
    served threshold is chosen for AND what the gate judges (router/objective.py);
    sequential: the receipts gate re-run on a growing ledger (router/sequential.py: alpha
    spending over looks, the look recorded); receipts, replay_plan: receipts mode (`data.ledger`:
    time split, checks, the replay plan; pipelines/router_receipts.py); knn_neighbors, lgbm_estimators: baselines.
    """

    candidates: tuple[str, ...] = ()
    split: tuple[float, float, float] = (0.6, 0.2, 0.2)
    cost: RouterCostConfig = field(default_factory=RouterCostConfig)
    rules: RouterRulesConfig = field(default_factory=RouterRulesConfig)
    exploration: RouterExplorationConfig = field(default_factory=RouterExplorationConfig)
    replay: RouterReplayConfig = field(default_factory=RouterReplayConfig)
    evaluation: RouterEvalConfig = field(default_factory=RouterEvalConfig)
    head: HeadConfig = field(default_factory=HeadConfig)
    head_select: HeadSelectConfig = field(default_factory=HeadSelectConfig)
    policy: PolicyConfig = field(default_factory=lambda: PolicyConfig(escalate=False))
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    go: GoConfig = field(default_factory=GoConfig)
    receipts: ReceiptsConfig = field(default_factory=ReceiptsConfig)
    replay_plan: ReplayPlanConfig = field(default_factory=ReplayPlanConfig)
    sequential: SequentialConfig = field(default_factory=SequentialConfig)
    knn_neighbors: int = 25
    lgbm_estimators: int = 200
    seed: int = 0
    spread_seeds: int = 1  # head seeds the headline is refitted with (1: none), both modes


    def __post_init__(self) -> None:
        name = type(self).__name__
        cands = tuple(str(c) for c in self.candidates)
        if len(cands) < 2 or len(set(cands)) != len(cands):
            fail_field(name, "candidates", list(self.candidates),
                       "list at least two distinct candidates, cheapest first")
        object.__setattr__(self, "candidates", cands)
        sp = tuple(float(s) for s in self.split)
        if len(sp) != 3 or any(s <= 0 for s in sp) or abs(sum(sp) - 1.0) > 1e-9:
            fail_field(name, "split", list(self.split), "three positive shares summing to 1")
        object.__setattr__(self, "split", sp)
        n = self.spread_seeds
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            fail_field(name, "spread_seeds", n, "must be an integer >= 1")
        if self.sequential.kind != "none" and self.objective.kind != "incumbent":
            fail_field(name, "sequential", self.sequential.kind,
                       "the sequential gate judges objective kind incumbent only "
                       f"(objective.kind is {self.objective.kind!r})")


def router_config(values: Mapping[str, Any] | None, where: str = "router") -> RouterPipelineConfig:
    """Build the config from a plain mapping (Hydra's `router` node); ConfigError on bad input."""
    values = dict(values or {})
    # the operating point and the gate follow `objective`; the keys it replaced are refused
    # (the schema composes policy's library defaults, so only a changed value is a choice)
    moved = {("policy", "target_share", PolicyConfig.target_share):
             "kind quality_floor, fraction_of_strong",
             ("policy", "cost_budget", None): "kind budget, cost_per_call",
             ("go", "quality_margin", None): "kind incumbent, margin"}
    for (node, key, default), instead in moved.items():
        got = (values.get(node) or {}).get(key)
        if got is not None and got != default:
            raise ConfigError(f"{where}.{node}.{key}={got}: the operating point and the gate "
                              f"follow one objective now: set {where}.objective ({instead})")
    sub = {"cost": (RouterCostConfig, values.pop("cost", {}) or {}),
           "rules": (RouterRulesConfig, values.pop("rules", {}) or {}),
           "exploration": (RouterExplorationConfig, values.pop("exploration", {}) or {}),
           "replay": (RouterReplayConfig, values.pop("replay", {}) or {}),
           "evaluation": (RouterEvalConfig, values.pop("evaluation", {}) or {}),
           "head": (HeadConfig, values.pop("head", {}) or {}),
           "head_select": (HeadSelectConfig, values.pop("head_select", {}) or {}),
           "policy": (PolicyConfig, {"escalate": False, **(values.pop("policy", {}) or {})}),
           "go": (GoConfig, values.pop("go", {}) or {}),
           "objective": (ObjectiveConfig, values.pop("objective", {}) or {}),
           "receipts": (ReceiptsConfig, values.pop("receipts", {}) or {}),
           "replay_plan": (ReplayPlanConfig, values.pop("replay_plan", {}) or {}),
           "sequential": (SequentialConfig, values.pop("sequential", {}) or {})}
    built = {key: from_mapping(cls, raw, f"{where}.{key}") for key, (cls, raw) in sub.items()}
    return from_mapping(RouterPipelineConfig, {**values, **built}, where)

