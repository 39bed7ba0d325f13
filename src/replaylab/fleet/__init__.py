"""Fleet: an offline, request-conserving simulator of GPU pools, telemetry and serving policies.

Nothing heavy at import; the simulator's public names load on first use
(`from replaylab.fleet import FleetSim`). See docs/fleet.md for the model.
"""

_LAZY = {
    "FleetSim": "replaylab.fleet.sim",
    "SimConfig": "replaylab.fleet.sim_fleet",
    "PoolConfig": "replaylab.fleet.sim_fleet",
    "Replica": "replaylab.fleet.sim_fleet",
    "SimResult": "replaylab.fleet.sim_result",
    "Policy": "replaylab.fleet.sim_policy",
    "PolicyError": "replaylab.fleet.sim_policy",
    "Controller": "replaylab.fleet.sim_policy",
    "ScaleAction": "replaylab.fleet.sim_policy",
    "RoundRobin": "replaylab.fleet.sim_policy",
    "LeastLoaded": "replaylab.fleet.sim_policy",
    "Workload": "replaylab.fleet.workload",
    "SyntheticWorkloadConfig": "replaylab.fleet.workload",
    "workload_from_ledger": "replaylab.fleet.workload",
    "workload_from_cdf": "replaylab.fleet.workload",
    "GpuProfile": "replaylab.fleet.profiles",
    "load_fleetsim_profiles": "replaylab.fleet.profiles",
    "calibrate_mlenergy": "replaylab.fleet.profiles",
    "calibrate_splitwise": "replaylab.fleet.profiles",
    "SloTarget": "replaylab.fleet.outcomes",
    "summarize": "replaylab.fleet.outcomes",
    "compare_policies": "replaylab.fleet.outcomes",
    "StaticController": "replaylab.fleet.autoscaling",
    "HPAController": "replaylab.fleet.autoscaling",
    "HPAConfig": "replaylab.fleet.autoscaling",
    "ForecastController": "replaylab.fleet.autoscaling",
    "ForecastPolicyConfig": "replaylab.fleet.autoscaling",
    "Recommendation": "replaylab.fleet.events",
    "EventLog": "replaylab.fleet.events",
    "sign_recommendation": "replaylab.fleet.events",
    "verify_recommendation": "replaylab.fleet.events",
    "RecommendationInbox": "replaylab.fleet.recommendations",
    "recommendations_from_forecast": "replaylab.fleet.recommendations",
    "work_per_request": "replaylab.fleet.capacity",
    "replicas_for_rate": "replaylab.fleet.capacity",
    "AutoscalingConfig": "replaylab.fleet.experiments.autoscaling",
    "autoscaling_config": "replaylab.fleet.experiments.autoscaling",
    "run_autoscaling_experiment": "replaylab.fleet.experiments.autoscaling",
}

__all__ = list(_LAZY)


def __getattr__(name: str):  # lazy: `import replaylab.fleet` stays cheap
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
