"""LEGACY alias: the scenarios moved to `replaylab.fleet.autoscaling_scenarios`.

Only forecast/experiments.py (the fluid autoscaling experiment) imports this
name; it goes when that experiment is rewired to
`replaylab.fleet.autoscaling_experiment`.
"""

from replaylab.fleet.autoscaling_scenarios import (
    DAY_S,
    SCENARIO_KINDS,
    BaseRates,
    Demand0,
    ScenarioConfig,
    TraceConfig,
    base_rates,
    draw_arrivals,
    scenario_rates,
    servegen_bucket_rps,
    synthetic_bucket_rps,
)

__all__ = ["DAY_S", "SCENARIO_KINDS", "BaseRates", "Demand0", "ScenarioConfig", "TraceConfig",
           "base_rates", "draw_arrivals", "scenario_rates", "servegen_bucket_rps",
           "synthetic_bucket_rps"]
