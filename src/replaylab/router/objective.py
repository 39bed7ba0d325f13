"""What the router is for: one objective for the served threshold AND the gate (issue 45).

`router.objective` (YAML: conf/router/default.yaml) says what the user wants:

    incumbent      (default) the cheapest threshold whose calibration quality is at least
                   the incumbent's minus `margin`; the incumbent is the scenario rules in
                   outcomes mode (`go.baseline`) and the logging policy in receipts mode.
                   GO: test quality vs the incumbent has its interval's lower bound
                   >= -margin AND the served point is significantly cheaper.
    quality_floor  the cheapest threshold reaching `fraction_of_strong` x strong-only
                   quality on calibration. GO: test quality - fraction x strong-only
                   quality has its lower bound >= 0 AND the served point is
                   significantly cheaper than the incumbent.
    budget         the best calibration quality with mean cost per call <=
                   `cost_per_call` (USD). GO: the served point's test cost has its upper
                   bound <= cost_per_call AND its quality is significantly better than
                   the incumbent's.

The threshold is chosen on calibration (`selection`), the gate judges the same objective
at that threshold on test (`criteria`, read by `router.gate`). Nothing else picks an
operating point: `policy.target_share` / `policy.cost_budget` are derived from here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from replaylab.config import fail_field
from replaylab.router.policy import PolicyConfig

OBJECTIVE_KINDS = ("incumbent", "quality_floor", "budget")


@dataclass(frozen=True)
class ObjectiveConfig:
    """router.objective: kind (OBJECTIVE_KINDS), margin (incumbent: quality the router may
    lose, absolute), fraction_of_strong (quality_floor: share of strong-only quality),
    cost_per_call (budget: USD per opening call; required for kind=budget)."""

    kind: str = "incumbent"
    margin: float = 0.01
    fraction_of_strong: float = 0.95
    cost_per_call: float | None = None

    def __post_init__(self) -> None:
        name = type(self).__name__
        if self.kind not in OBJECTIVE_KINDS:
            fail_field(name, "kind", self.kind, f"must be one of {OBJECTIVE_KINDS}")
        if isinstance(self.margin, bool) or not 0.0 <= float(self.margin) < 1.0:
            fail_field(name, "margin", self.margin, "must be in [0, 1)")
        if not 0.0 < float(self.fraction_of_strong) <= 1.0:
            fail_field(name, "fraction_of_strong", self.fraction_of_strong, "must be in (0, 1]")
        if self.cost_per_call is not None and not float(self.cost_per_call) >= 0.0:
            fail_field(name, "cost_per_call", self.cost_per_call, "must be >= 0 or null")
        if self.kind == "budget" and self.cost_per_call is None:
            fail_field(name, "cost_per_call", None, "kind=budget needs a cost per call (USD)")

    def label(self, incumbent: str = "incumbent") -> str:
        """The objective in words, as every verdict line names it."""
        if self.kind == "incumbent":
            return (f"objective incumbent: the cheapest point with quality >= the incumbent "
                    f"({incumbent}) - {self.margin:g}")
        if self.kind == "quality_floor":
            return (f"objective quality_floor: the cheapest point with quality >= "
                    f"{self.fraction_of_strong:g} x strong-only")
        return f"objective budget: the best quality at cost <= {self.cost_per_call:g} USD/call"

    def quality_floor(self, incumbent_quality: float, strong_quality: float) -> float | None:
        """The absolute calibration quality floor the served threshold must reach (None for
        budget, which chooses by cost)."""
        if self.kind == "incumbent":
            return float(incumbent_quality) - float(self.margin)
        if self.kind == "quality_floor":
            return float(self.fraction_of_strong) * float(strong_quality)
        return None

    def to_dict(self) -> dict:
        return {"kind": self.kind, "margin": float(self.margin),
                "fraction_of_strong": float(self.fraction_of_strong),
                "cost_per_call": None if self.cost_per_call is None else float(self.cost_per_call)}


def served_policy(objective: ObjectiveConfig, base: PolicyConfig,
                  incumbent_quality: float) -> PolicyConfig:
    """`base` with the operating point the objective asks for (`policy.select_threshold`):
    incumbent -> the absolute floor incumbent_quality - margin; quality_floor ->
    target_share = fraction_of_strong; budget -> cost_budget = cost_per_call."""
    if objective.kind == "budget":
        return dataclasses.replace(base, cost_budget=float(objective.cost_per_call or 0.0),
                                   quality_floor=None)
    if objective.kind == "quality_floor":
        return dataclasses.replace(base, target_share=float(objective.fraction_of_strong),
                                   cost_budget=None, quality_floor=None)
    return dataclasses.replace(base, cost_budget=None,
                               quality_floor=float(incumbent_quality) - float(objective.margin))
