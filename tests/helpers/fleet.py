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
