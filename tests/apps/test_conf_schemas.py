"""The one conf/ tree and its ConfigStore schemas (replaylab.apps.schemas).

Every entry config composes for every pipeline and experiment; a misspelt key in a
YAML file of any group fails at composition with Hydra's own message; a pipeline
composes only the groups it reads; and the schemas' defaults are the library's, so a
key the YAML leaves out builds the same typed config as before.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from replaylab.apps.schemas import experiment_schemas, register_schemas, schema_of
from replaylab.config import from_mapping

CONF = Path(__file__).resolve().parents[2] / "conf"
PIPELINES = ("project", "demand", "forecast", "import", "router")
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))


def _compose(conf: Path, name: str, overrides: list[str]):
    register_schemas()
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        return compose(config_name=name, overrides=overrides)


def test_one_conf_tree():
    assert not (CONF.parent / "conf_eval").exists() and not (CONF.parent / "conf_export").exists()
    assert {"train.yaml", "evaluate.yaml", "export.yaml"} <= {p.name for p in CONF.glob("*.yaml")}
    # tracking/ exists once, shared by all three entry configs
    for group in ("tracking", "export", "pipeline", "experiment", "slo", "pools",
                  "fleet/workload"):
        assert (CONF / group).is_dir(), group
    # no default reads a folder outside the checkout: no shared data folder, no paths/ group
    assert not (CONF / "paths").exists()
    for p in CONF.rglob("*.yaml"):
        assert "shared_dir" not in p.read_text() and "../" not in p.read_text(), p


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_each_pipeline_composes_only_what_it_reads(pipeline):
    cfg = _compose(CONF, "train", [f"pipeline={pipeline}"])
    assert cfg.pipeline == pipeline
    groups = set(cfg) - {"pipeline", "seed", "out"}
    needs = {"project": {"data", "projection", "split", "compute"},
             "demand": {"data", "projection", "split", "demand", "export", "compute"},
             "forecast": {"data", "forecast", "compute"}, "import": set(),
             "router": {"data", "router", "export", "compute"}}[pipeline]
    assert groups == {"tracking"} | needs


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_each_experiment_composes(experiment):
    cfg = _compose(CONF, "evaluate", [f"experiment={experiment}"])
    assert cfg.experiment.name == experiment
    values = OmegaConf.to_container(cfg.experiment, resolve=True)
    if "slo" in values:  # the shared slo/ group, not a copy per experiment
        from replaylab.fleet.experiments.harness import slo_targets
        from replaylab.fleet.sim.outcomes import SloTarget

        # autoscaling scores a 70B model: its interactive class is looser
        interactive = SloTarget(ttft_s=2.0, tpot_s=0.1) if experiment == "autoscaling" \
            else SloTarget(ttft_s=1.0, tpot_s=0.05)
        assert slo_targets(values["slo"]) == {"interactive": interactive,
                                              "batch": SloTarget(e2e_s=3600.0)}
    assert "shared_dir" not in values  # the shipped data, or a file the user names


def test_export_and_import_compose():
    cfg = _compose(CONF, "export", ["run_dir=x"])
    assert cfg.export.version == "1.0.0" and cfg.run_dir == "x"
    cfg = _compose(CONF, "train", ["pipeline=import", "source=servegen", "out=a.parquet"])
    assert cfg.source.name == "servegen" and cfg.source.path is None  # required: no default
    cfg = _compose(CONF, "train", ["pipeline=import", "source=servegen", "out=a.parquet",
                                   "source.path=m-large"])
    assert cfg.source.path == "m-large"


def test_a_router_run_cannot_set_a_demand_key():
    with pytest.raises(ConfigCompositionException):
        _compose(CONF, "train", ["pipeline=router", "demand.alpha=0.1"])


@pytest.mark.parametrize("where, old, new", [
    ("router/default.yaml", "  patience: 8", "  patiense: 8"),
    ("router/default.yaml", "knn_neighbors: 25", "knn_neighbours: 25"),
    ("demand/default.yaml", None, "learning_rat: 0.1"),
    ("data/default.yaml", "  n_sessions: 4000", "  n_session: 4000"),
    ("projection/default.yaml", None, "typo_key: 1"),
    ("experiment/energy.yaml", "  queue_capacity: 256", "  queue_capacty: 256"),
    ("experiment/autoscaling.yaml", "  cold_start_s: 180.0", "  coldstart_s: 180.0"),
    ("slo/default.yaml", "batch: {e2e_s: 3600.0}", "batch: {e2e_s: 3600.0, e2e: 1}"),
    ("fleet/workload/trace.yaml", "windows: 4", "windoes: 4"),
    ("experiment/energy.yaml", "    time_scale: 12.0", "    time_scal: 12.0"),
    ("experiment/hint_admission.yaml", "n_sessions: 3000", "n_session: 3000"),
    ("tracking/local.yaml", "run_name: null", "runname: null"),
])
def test_a_misspelt_yaml_key_fails_at_composition(tmp_path, where, old, new):
    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    path = conf / where
    text = path.read_text()
    if old is None:
        text += f"\n{new}\n"
    else:
        assert old in text, f"{where} no longer has {old!r}: update this test"
        text = text.replace(old, new, 1)
    path.write_text(text)
    name, overrides = ("evaluate", [f"experiment={path.stem}"]) \
        if where.startswith(("experiment/", "slo/", "fleet/")) else ("train", ["pipeline=demand"])
    if where.startswith(("slo/", "fleet/")):
        overrides = ["experiment=energy"]
    if where.startswith("router/"):
        overrides = ["pipeline=router"]
    bad_key = new.split(":")[0].strip().split("{")[-1].split(",")[-1].strip()
    with pytest.raises((ConfigCompositionException, ConfigKeyError, ValidationError)) as err:
        _compose(conf, name, overrides)
    assert bad_key in str(err.value) or bad_key in str(err.value.__cause__), str(err.value)


def _defaults_of(schema):
    return OmegaConf.to_container(OmegaConf.structured(schema), resolve=False)


@pytest.mark.parametrize("cls_path", [
    "replaylab.router.head.HeadConfig", "replaylab.router.policy.PolicyConfig",
    "replaylab.demand.DemandConfig", "replaylab.demand.hpo.HPOConfig",
    "replaylab.projection.ProjectionConfig", "replaylab.projection.SplitConfig",
    "replaylab.forecast.ForecastConfig",
    "replaylab.sources.synthetic.config.SyntheticLedgerConfig",
    "replaylab.fleet.experiments.workloads.WorkloadSpec",
])
def test_schema_defaults_are_the_library_defaults(cls_path):
    """A key the YAML leaves out composes to the schema default; building the dataclass
    from all the schema's defaults must give the library's own default object."""
    import importlib

    module, name = cls_path.rsplit(".", 1)
    cls = getattr(importlib.import_module(module), name)
    values = _defaults_of(schema_of(cls))

    def build(c, v):
        kw = {}
        for f in dataclasses.fields(c):
            if f.name in v and dataclasses.is_dataclass(f.default_factory()
                                                        if f.default_factory is not
                                                        dataclasses.MISSING else None):
                kw[f.name] = build(type(f.default_factory()), v[f.name])
            elif f.name in v:
                kw[f.name] = tuple(v[f.name]) if isinstance(v[f.name], list) else v[f.name]
        return from_mapping(c, kw, name)

    assert build(cls, values) == cls()


def test_router_policy_default_keeps_escalation_off():
    """The router's policy default is PolicyConfig(escalate=False), not PolicyConfig()."""
    cfg = _compose(CONF, "train", ["pipeline=router"])
    assert cfg.router.policy.escalate is False


def test_every_experiment_has_a_schema():
    assert set(experiment_schemas()) == set(EXPERIMENTS)
