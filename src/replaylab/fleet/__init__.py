"""Fleet: an offline, request-conserving simulator of GPU pools, telemetry and serving policies.

Sub-packages, by role (docs/design/fleet.md has the model):

    sim/          the discrete-event simulator: FleetSim, its config, replicas, arrivals,
                  result, workloads, per-run outcomes, saturation capacity, M/G/c checks
    hardware/     GPU replica profiles, their fitted power/throughput curves, capacity sizing
    policies/     serving policies: reference (round robin, least loaded), spillover,
                  admission by hint, energy-aware; what they share
    telemetry/    the simulator's modeled feed and the Prometheus adapters that produce
                  observation-v1 (the contract itself: replaylab.contracts.observation)
    control/      autoscaling controllers, signed recommendations and their inbox, shadow
                  (the events-v1 contract they log: replaylab.contracts.events)
    experiments/  `python -m evaluation experiment=<name>`: one module per experiment
                  (autoscaling: a package), the harness and the shared workload section

Nothing heavy at import; the public names below load on first use
(`from replaylab.fleet import FleetSim`).
"""

from replaylab.contracts.lazy import lazy_exports

_EXPORTS = {  # module (under replaylab.fleet) -> the public names it gives this package
    "sim.simulator": "FleetSim",
    "sim.fleet": "SimConfig PoolConfig Replica",
    "sim.result": "SimResult",
    "sim.policy": "Policy PolicyError Controller ScaleAction",
    "sim.workload": "Workload SyntheticWorkloadConfig workload_from_ledger workload_from_cdf",
    "sim.outcomes": "SloTarget summarize compare_policies",
    "policies.reference": "RoundRobin LeastLoaded",
    "hardware.profiles": "GpuProfile load_fleetsim_profiles calibrate_mlenergy calibrate_splitwise",
    "hardware.capacity": "work_per_request replicas_for_rate",
    "control.controllers": "StaticController HPAController HPAConfig ForecastController "
                           "ForecastPolicyConfig",
    "control.recommendations": "RecommendationInbox recommendations_from_forecast",
    "experiments.autoscaling.experiment": "AutoscalingConfig autoscaling_config "
                                          "run_autoscaling_experiment",
}
_LAZY = {name: f"{__name__}.{module}" for module, names in _EXPORTS.items()
         for name in names.split()}

__all__ = list(_LAZY)


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)  # `import replaylab.fleet` stays cheap
