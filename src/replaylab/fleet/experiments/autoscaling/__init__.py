"""experiment=autoscaling, as a package: the experiment (experiment.py: its config and `run`),
the demand scenarios it replays (scenarios.py), one simulated policy run and its metrics
(runs.py), and the statistics, verdicts and figures of the summary (report.py).

`run` and the config are re-exported here: `run_fleet_experiment("autoscaling", ...)`
imports this package as it imports any experiment module.
"""

from replaylab.fleet.experiments.autoscaling.experiment import (
    AutoscalingConfig,
    autoscaling_config,
    run,
    run_autoscaling_experiment,
)

__all__ = ["AutoscalingConfig", "autoscaling_config", "run", "run_autoscaling_experiment"]
