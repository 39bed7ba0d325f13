"""Fleet experiment configs composed as the entry point composes them."""

from __future__ import annotations

from omegaconf import OmegaConf

from tests.conftest import REPO


def composed_config(name: str, *overrides: str):
    """The evaluate config of `experiment=name` with Hydra command-line `overrides`, as the
    entry point composes it (conf/, the schemas registered)."""
    from hydra import compose, initialize_config_dir

    from replaylab.apps.schemas import register_schemas

    register_schemas()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose(config_name="evaluate", overrides=[f"experiment={name}", *overrides])


def experiment_config(name: str, **overrides) -> dict:
    """conf/experiment/<name>.yaml composed by Hydra (its pools/, slo/ and fleet/workload/
    groups), with overrides of dotted keys from the root (`experiment.sim.queue_capacity`,
    `fleet.workload.windows`): what the entry point hands the library. No data folder: the
    defaults read only what the package ships."""
    from replaylab.apps.evaluate import fleet_values

    root = composed_config(name)
    for key, value in overrides.items():
        OmegaConf.update(root, key, value, merge=isinstance(value, dict))
    return fleet_values(root)


# tiny sizes: the defaults' sources and pools, fewer windows, seeds and requests
TINY = {
    "energy": {"fleet.workload.windows": 2, "fleet.workload.max_requests": 150},
    "stale_telemetry": {"fleet.workload.windows": 2, "fleet.workload.max_requests": 150},
    "rollout": {"fleet.workload.windows": 2, "fleet.workload.max_requests": 150,
                "experiment.shares": [0.0, 1.0]},
    "overload": {"fleet.workload.duration_s": 10.0, "fleet.workload.seeds": [0],
                 "experiment.load_factors": [1.0], "experiment.saturation.requests": 4000},
    "hint_admission": {"fleet.workload.synthetic": {"n_sessions": 300},
                       "fleet.workload.windows": 2,
                       "experiment.ledger.replicate_seeds": [0]},
    "autoscaling": {"experiment.seeds": [0], "experiment.sweep": None,
                    "experiment.trace.hours": 0.25, "experiment.trace.scale": 0.1,
                    "experiment.policies": ["static", "reactive"]},
}


def tiny_overrides(name: str) -> list[str]:
    """TINY[name] as Hydra command-line overrides (nested dicts flattened, lists as [a,b])."""
    def text(v) -> str:
        if v is None:
            return "null"
        if isinstance(v, list):
            return "[" + ",".join(text(x) for x in v) + "]"
        return str(v)

    def flat(prefix: str, v) -> list[str]:
        if isinstance(v, dict):
            return [o for k, x in v.items() for o in flat(f"{prefix}.{k}", x)]
        return [f"{prefix}={text(v)}"]

    return [o for k, v in TINY[name].items() for o in flat(k, v)]
