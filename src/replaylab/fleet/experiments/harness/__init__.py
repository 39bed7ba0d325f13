"""The harness every fleet experiment runs on; it knows no experiment by name.

An experiment imports the harness from here (`from replaylab.fleet.experiments.harness
import ...`) and `workloads.py`, the other half of the harness (ledger files, the shipped
traces, token CDFs: the shared `fleet.workload` section), and nothing else of this
package. The harness's parts, one role each:

    config.py      the base every experiment's config extends (`ExperimentConfig`,
                   `SimExperimentConfig`; conf/experiment/base/*.yaml), `parse_config`,
                   SLO targets
    simulation.py  pools (`PoolSpec`, `build_pools`), the policy factory (`make_policy`,
                   the hint-policy check), the simulator's config (`SimSpec`,
                   `sim_config`) and one run (`simulate`)
    summaries.py   pooled summaries, replicate statistics, per-request slices, figures
    grid.py        the one home of every experiment's fan-out: its grid of
                   (policy x window/load x seed) cells, a loop here (`LocalGrid`) or
                   tasks of the run's compute engine (`EngineGrid`), same results

This file is the harness's public face and defines nothing.
"""

from replaylab.fleet.experiments.harness.config import (
    ExperimentConfig,
    SimExperimentConfig,
    parse_config,
    slo_targets,
)
from replaylab.fleet.experiments.harness.grid import (
    EngineGrid,
    GridRunner,
    LocalGrid,
    call_cell,
    local_grid,
    progress_bar,
)
from replaylab.fleet.experiments.harness.simulation import (
    PoolSpec,
    SimSpec,
    aligned_workload,
    build_pools,
    build_profile,
    has_hints,
    hint_policy_check,
    make_policy,
    needs_hint,
    pool_mapping,
    scaled_power,
    sim_config,
    simulate,
)
from replaylab.fleet.experiments.harness.summaries import (
    ci_table,
    conserved,
    masked_slo,
    pooled_summary,
    pyplot,
    replicate_metrics,
    run_energy_j,
    save_figure,
)

__all__ = [
    "EngineGrid", "ExperimentConfig", "GridRunner", "LocalGrid", "PoolSpec", "SimExperimentConfig",
    "SimSpec", "aligned_workload", "build_pools", "build_profile", "call_cell", "ci_table",
    "conserved", "has_hints", "hint_policy_check", "local_grid", "make_policy", "masked_slo",
    "needs_hint", "parse_config", "pool_mapping", "pooled_summary", "progress_bar", "pyplot",
    "replicate_metrics", "run_energy_j", "save_figure", "scaled_power", "sim_config",
    "simulate", "slo_targets",
]
