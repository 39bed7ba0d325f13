"""Config schemas in Hydra's ConfigStore, derived from the library's dataclasses.

Each group's YAML lists its schema first (`defaults: [schema, _self_]`), so a key
the library's dataclass does not have fails at composition with Hydra's own
message (`Key 'hiden' not in 'HeadConfig'`). The schema checks keys only: every
leaf is `Any`, so values reach the dataclasses exactly as written and their
`__post_init__` keeps checking values with messages that name the field. A key the
YAML leaves out composes to the library's own default (taken from the dataclass),
so the typed config built from it is the one the library would have built.

`register_schemas()` is called by the three entry points before composing (it also
registers the `shipped` resolver, `register_resolvers`); nothing is stored at import.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any

from replaylab.config import dataclass_of

_CACHE: dict[type, type] = {}
_SCHEMAS: set[type] = set()  # every schema made here (already schema-shaped)


def _is_mapping_type(hint: Any) -> bool:
    origin = typing.get_origin(hint) or hint
    return isinstance(origin, type) and issubclass(origin, Mapping)


def _plain_default(value: Any) -> Any:
    """A library default as a schema value: dataclasses as their schema, tuples as lists."""
    if type(value) in _SCHEMAS:
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        schema = schema_of(type(value))
        return schema(**{f.name: _plain_default(getattr(value, f.name))
                         for f in dataclasses.fields(value) if f.init})
    if isinstance(value, tuple | list):
        return [_plain_default(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain_default(v) for k, v in value.items()}
    return value


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return dataclasses.MISSING


def schema_of(cls: type, *, name: str | None = None, exclude: tuple[str, ...] = (),
              extra: Mapping[str, tuple[Any, Any]] | None = None) -> type:
    """A schema dataclass with `cls`'s init fields: nested dataclasses as nested schemas,
    mappings as open `Dict[str, Any]`, every other leaf `Any`; defaults are the library's.
    `extra`: fields added or retyped, name -> (type, default)."""
    extra = dict(extra or {})
    if not exclude and not extra and name is None and cls in _CACHE:
        return _CACHE[cls]
    hints = typing.get_type_hints(cls)
    spec = []
    for f in dataclasses.fields(cls):
        if not f.init or f.name in exclude or f.name in extra:
            continue
        hint, default = hints.get(f.name, Any), _default(f)
        nested = dataclass_of(hint)
        if nested is not None:
            kind: Any = schema_of(nested)
            if default is None or type(None) in typing.get_args(hint):  # `X | None`: nullable
                kind = typing.Optional[kind]  # noqa: UP045 (OmegaConf reads typing.Optional)
        elif _is_mapping_type(hint):
            kind = typing.Optional[dict[str, Any]]  # noqa: UP045
        else:
            kind = Any
        spec.append(_field(f.name, kind, default))
    for key, (kind, default) in extra.items():
        spec.append(_field(key, kind, default))
    schema = dataclasses.make_dataclass(name or f"{cls.__name__}Schema", spec)
    _SCHEMAS.add(schema)
    if not exclude and not extra and name is None:
        _CACHE[cls] = schema
    return schema


def _field(name: str, kind: Any, default: Any) -> tuple[str, Any, Any]:
    if default is dataclasses.MISSING:
        return (name, kind, dataclasses.field(default="???"))  # OmegaConf's MISSING
    value = _plain_default(default)
    if isinstance(value, list | dict) or dataclasses.is_dataclass(value):
        return (name, kind, dataclasses.field(default_factory=lambda v=value: _copy(v)))
    return (name, kind, dataclasses.field(default=value))


def _copy(value: Any) -> Any:
    import copy

    return copy.deepcopy(value)


def _open(schema_name: str, /, **fields: Any) -> type:
    """A small schema of `Any` leaves with the given defaults (the app-side groups)."""
    schema = dataclasses.make_dataclass(schema_name, [_field(k, Any, v) for k, v in fields.items()])
    _SCHEMAS.add(schema)
    return schema


def group_schemas() -> dict[str, type]:
    """group -> schema of every `conf/<group>/` the apps compose (fleet experiments apart)."""
    from replaylab.compute.config import ComputeConfig
    from replaylab.demand import DemandConfig
    from replaylab.demand.hpo import HPOConfig
    from replaylab.forecast import ForecastConfig
    from replaylab.projection import ProjectionConfig, SplitConfig
    from replaylab.router.pipeline_config import RouterPipelineConfig
    from replaylab.sources.synthetic.config import SyntheticLedgerConfig

    encoder = _open("EncoderSchema", cache_dir="???", int8=True, threads=1, variant="fp32",
                    tier="minilm")
    router = schema_of(RouterPipelineConfig, name="RouterSchema",
                       extra={"encoder": (encoder, encoder())})
    synthetic = schema_of(SyntheticLedgerConfig, name="SyntheticSchema",
                          extra={"defect_rate": (Any, 0.0)})
    data = dataclasses.make_dataclass("DataSchema", [
        _field("ledger", Any, None), _field("aggregates", Any, None),
        ("synthetic", synthetic, dataclasses.field(default_factory=synthetic)),
        _field("write_ledger", Any, True), _field("outcomes", Any, None),
        _field("outcomes_source", Any, None), _field("replays", Any, None)])
    _SCHEMAS.add(data)
    return {
        "router": router,
        "demand": schema_of(DemandConfig, name="DemandSchema",
                            extra={"hpo": (schema_of(HPOConfig), HPOConfig())}),
        "projection": schema_of(ProjectionConfig),
        "split": schema_of(SplitConfig),
        "forecast": schema_of(ForecastConfig),
        "data": data,
        "compute": schema_of(ComputeConfig),  # the engine's typed config (compute/config.py)
        "tracking": _open("TrackingSchema", enabled=True, uri="sqlite:///mlflow.db", experiment="replaylab",
                          run_name=None, preflight_timeout_s=5, http_retries=2, http_timeout_s=10),
        "export": _open("ExportSchema", enabled=True, version="1.0.0", valid_days=30,
                        hmac_key_env="REPLAYLAB_HMAC_KEY",
                        register=True, allow_ungated=False, allow_unsigned=False,
                        allow_duplicate=False, allow_truncated=False,
                        aliases=["champion", "challenger"], new_alias=False,
                        registry={"names": {"demand": "replaylab-demand",
                                                           "router": "replaylab-router"},
                                                 "coverage_band": 0.05, "coverage_z": 1.96,
                                                 "rescore_alias": "champion",
                                                 "blob_min_bytes": 1048576,
                                                 "blob_experiment": "replaylab-artifact-store",
                                                 "experiment": "replaylab-registry"}),
        "source": _open("SourceSchema", name="???", path=None, uri=None, table=None,
                        keep_prompt=None, options={}),
    }


def experiment_schemas() -> dict[str, type]:
    """experiment name -> schema of `conf/experiment/<name>.yaml`."""
    from replaylab.fleet.experiments.autoscaling.experiment import AutoscalingConfig
    from replaylab.fleet.experiments.autoscaling.scenarios import ScenarioConfig
    from replaylab.fleet.experiments.energy import EnergyConfig
    from replaylab.fleet.experiments.harness import PoolSpec, SimSpec
    from replaylab.fleet.experiments.hint_admission import HintConfig
    from replaylab.fleet.experiments.overload import OverloadConfig
    from replaylab.fleet.experiments.rollout import RolloutConfig
    from replaylab.fleet.experiments.stale_telemetry import StaleConfig

    # Sections the library reads as plain mappings and types later (harness.sim_config,
    # build_pools, slo_targets): typed here so their keys are checked at composition too.
    # `workload` is not the experiment's: it is the shared fleet.workload group.
    # An SLO measure left out is None, which slo_targets reads as no target (inf).
    slo_class = _open("SloClassSchema", ttft_s=None, tpot_s=None, e2e_s=None)
    sections = {"sim": (schema_of(SimSpec), SimSpec()),
                "pools": (dict[str, schema_of(PoolSpec)], {}),
                "slo": (dict[str, slo_class], {})}
    out = {}
    for key, cls in (
        ("energy", EnergyConfig), ("hint_admission", HintConfig), ("rollout", RolloutConfig),
        ("overload", OverloadConfig), ("stale_telemetry", StaleConfig)):
        names = {f.name for f in dataclasses.fields(cls)}
        typed = {k: v for k, v in sections.items() if k in names}
        out[key] = schema_of(cls, name=f"{cls.__name__}Schema", exclude=("workload",),
                             extra={"name": (Any, "???"), **typed})
    # scenarios: a mapping of typed scenarios, empty by default, so the YAML names them all
    # (a schema default would be merged in and could not be removed)
    out["autoscaling"] = schema_of(
        AutoscalingConfig, name="AutoscalingSchema", exclude=("workload",),
        extra={"name": (Any, "???"), "slo": sections["slo"],
               "scenarios": (dict[str, schema_of(ScenarioConfig)], {})})
    out["residuals"] = _open("ResidualsSchema", name="residuals", group_columns=[], time_bucket_s=None,
                             min_group_rows=30, artifact=None, online={},
                             online_from="test", coverage_window=500,
                             coverage_band=[0.77, 0.83])
    return out


def fleet_workload_schema() -> type:
    """Schema of `conf/fleet/workload/` (every fleet experiment's workload): WorkloadSpec."""
    from replaylab.fleet.experiments.workloads import WorkloadSpec

    return schema_of(WorkloadSpec)


def register_schemas() -> None:
    """Store every schema in Hydra's ConfigStore: `<group>/schema` (fleet/workload/schema
    included) and `experiment/<name>_schema` (the names the YAML files' defaults lists use)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    for group, schema in group_schemas().items():
        cs.store(group=group, name="schema", node=schema)
    cs.store(group="fleet/workload", name="schema", node=fleet_workload_schema())
    for exp, schema in experiment_schemas().items():
        cs.store(group="experiment", name=f"{exp}_schema", node=schema)
    register_resolvers()


def register_resolvers() -> None:
    """`${shipped:walkthrough,receipts.parquet}` in a YAML value: the path of a file shipped
    in `replaylab.data` (conf/data/walkthrough_*.yaml), found the way the package finds it,
    so a preset names shipped data in a checkout and in an installed wheel alike."""
    from omegaconf import OmegaConf

    from replaylab.data import shipped

    OmegaConf.register_new_resolver("shipped", lambda *parts: str(shipped(*map(str, parts))),
                                    replace=True)


def unknown_schema_key(schema: type, path: list[str]) -> tuple[str, list[str]] | None:
    """(the first part of `path` that `schema` (a schema dataclass) has no field for, the
    fields it has there); None when every part is a field, or the path enters an open
    mapping (an `Any` leaf)."""
    cls: Any = schema
    for part in path:
        if not (dataclasses.is_dataclass(cls) and isinstance(cls, type)):
            return None  # an open mapping (e.g. source.options): any key may be added
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if part not in fields:
            return part, list(fields)
        cls = dataclass_of(typing.get_type_hints(cls).get(part, Any)) or \
            dataclass_of(fields[part].type) or Any
    return None


def refuse_added_keys(overrides: list[str]) -> None:
    """ConfigError for a `+key=value` / `++key=value` override that adds a key a typed
    group's schema does not have: Hydra's own hint for a misspelt key (`+data.ledgr=x`)
    would otherwise be accepted and the run would silently use the default. Adding a group
    (`+experiment=overload`) and keys of open mappings stay allowed."""
    import difflib

    from replaylab.config import ConfigError

    schemas = group_schemas()
    for o in overrides:
        if not o.startswith("+") or "=" not in o:
            continue
        key = o.lstrip("+").split("=", 1)[0].strip()
        group, _, rest = key.partition(".")
        if not rest or group not in schemas:
            continue
        found = unknown_schema_key(schemas[group], rest.split("."))
        if found is None:
            continue
        bad, names = found
        near = difflib.get_close_matches(bad, names, n=1)
        raise ConfigError(f"{o}: the {group!r} group has no key {bad!r}"
                          + (f" (did you mean {near[0]!r}?)" if near else "")
                          + "; a '+' adds keys, so a misspelt one would be silently ignored")
