"""The autoscaling experiment on the fleet simulator, end to end on a tiny synthetic day."""

from __future__ import annotations

import json

import pytest

from replaylab.config import ConfigError
from replaylab.fleet.control.controllers import ForecastPolicyConfig, HPAConfig
from replaylab.fleet.experiments.autoscaling.experiment import (
    AutoscalingConfig,
    OutageWindow,
    autoscaling_config,
    run_autoscaling_experiment,
)
from replaylab.fleet.experiments.autoscaling.report import compare, efficient, gpu_hours_at, winner


def tiny(**kw) -> AutoscalingConfig:
    values = {"trace": {"source": "synthetic", "hours": 0.5, "scale": 0.1},
              "seeds": [0, 1], "policies": ["static", "reactive", "forecast",
                                            "forecast_no_floor"],
              "sweep": {"scenario": "steady", "reactive_targets": [0.3, 0.6],
                        "forecast_targets": [0.6, 0.9]}}
    values.update(kw)
    return autoscaling_config(values)


def test_config_is_typed_and_names_bad_fields():
    c = autoscaling_config({"reactive": {"target_util": 0.5}, "seeds": [3],
                            "telemetry": {"outage": [{"start_s": 10, "end_s": 20}, [30, 40]]}})
    assert isinstance(c.reactive, HPAConfig) and c.reactive.target_util == 0.5
    assert c.seeds == (3,)
    assert c.telemetry.outage == (OutageWindow(10, 20), OutageWindow(30, 40))
    assert isinstance(c.forecast_policy, ForecastPolicyConfig)
    with pytest.raises(ConfigError, match="tick_sz"):
        autoscaling_config({"pool": {"tick_sz": 1}})
    with pytest.raises(ConfigError, match="policies"):
        autoscaling_config({"policies": ["proactive"]})
    with pytest.raises(ConfigError, match="sweep.scenario"):
        autoscaling_config({"sweep": {"scenario": "nope"}})
    with pytest.raises(ConfigError, match="target_util"):
        autoscaling_config({"reactive": {"target_util": 1.5}})
    # the ConfigStore schema is derived from AutoscalingConfig (its defaults, typed scenarios)
    from omegaconf import OmegaConf

    from replaylab.apps.schemas import experiment_schemas

    schema = OmegaConf.structured(experiment_schemas()["autoscaling"])
    assert schema.reactive.target_util == 0.4 and schema.forecast.table is None
    assert "workload" not in schema  # the shared fleet.workload section


def test_experiment_measures_every_policy_with_intervals_and_says_who_wins(
                                                                          tmp_path):
    s = run_autoscaling_experiment(tiny(), tmp_path)
    json.dumps(s, allow_nan=False)
    assert s["conserved"] is True
    assert set(s["scenarios"]) == {"steady", "burst", "mix_drift", "under_forecast"}
    for pols in s["scenarios"].values():
        assert set(pols) == {"static", "reactive", "forecast", "forecast_no_floor"}
        for m in pols.values():
            assert m["conserved"] and m["gpu_hours"]["n"] == 2
            for k in ("slo_attainment", "gpu_hours", "energy_kwh", "oscillations",
                      "scale_events"):
                assert {"mean", "ci95", "n"} <= set(m[k])
    assert set(s["winners"]) == set(s["scenarios"])
    assert {w["policy"] for w in s["winners"].values()} <= set(s["scenarios"]["steady"])
    assert len(s["comparisons"]) == 4 * 3
    assert all(c["verdict"] in ("beats", "trade_off", "loses", "buys_slo", "on_par")
               for c in s["comparisons"])
    assert [p["target_util"] for p in s["frontier"]["reactive"]] == [0.3, 0.6]
    ms = s["matched_slo"]
    assert ms["reactive_points"] and ms["forecast_points"] and "matched SLO" in ms["text"]
    assert any("wins" in v for v in s["verdicts"])
    for path in s["reports"].values():
        assert (tmp_path / path.split(str(tmp_path) + "/")[-1]).exists()
    assert s["speed"]["runs"] == 4 * 2 * 4 + 2 * 4
    ev = s["scenarios"]["steady"]["forecast"]["events"]
    assert ev["recommendation"] > 0 and ev["acknowledgement"] > 0


def test_workers_do_not_change_the_numbers(tmp_path):
    kw = {"scenarios": {"burst": {"kind": "burst", "factor": 3.0, "minutes": 5.0}},
          "sweep": None, "trace": {"source": "synthetic", "hours": 0.25, "scale": 0.1}}
    a = run_autoscaling_experiment(tiny(**kw), tmp_path / "a")
    b = run_autoscaling_experiment(tiny(workers=2, **kw), tmp_path / "b")
    assert a["scenarios"] == b["scenarios"] and a["verdicts"] == b["verdicts"]


def test_verdict_rules_are_computed_from_the_numbers():
    def stats(slo, gpu):
        return {"slo_attainment": {"mean": slo}, "gpu_hours": {"mean": gpu},
                "scale_events": {"mean": 1}, "oscillations": {"mean": 0}}

    def diff(m, lo, hi, n=3):
        return {"mean": m, "ci95": [lo, hi], "n": n}

    r = stats(0.999, 100.0)
    beats = compare("s", "forecast", diff(-10, -12, -8), diff(0.0, -0.001, 0.001),
                    stats(0.999, 90.0), r)
    assert beats["verdict"] == "beats"
    assert compare("s", "forecast", diff(-10, -25, 5), diff(0.0, -0.001, 0.001),
                   stats(0.999, 90.0), r)["verdict"] == "on_par"  # the interval holds 0
    assert compare("s", "forecast", diff(-10, -12, -8), diff(-0.01, -0.02, 0.0),
                   stats(0.989, 90.0), r)["verdict"] == "trade_off"
    assert compare("s", "forecast", diff(5, 3, 7), diff(0.0, -0.001, 0.001),
                   stats(0.999, 105.0), r)["verdict"] == "loses"
    w = winner({"a": stats(0.9995, 120.0), "b": stats(0.9990, 100.0), "c": stats(0.99, 50.0)})
    assert w["policy"] == "b"  # c is cheapest but misses the SLO by more than 0.1 point
    pts = [{"slo": 0.99, "gpu_hours": 100.0}, {"slo": 0.999, "gpu_hours": 150.0},
           {"slo": 0.98, "gpu_hours": 120.0}]
    assert efficient(pts) == pts[:2]
    assert gpu_hours_at(pts, 0.9945) == pytest.approx(125.0)  # the inefficient point ignored
    assert gpu_hours_at(pts, 0.95) == 100.0 and gpu_hours_at(pts, 0.9999) is None


def test_evaluation_entry_point_runs_the_simulator_experiment(tmp_path):
    """`python -m evaluation experiment=autoscaling`, composed from conf/, on a short synthetic
    day (in process, tests/helpers/entrypoints.py; the misspelt key: the CLI in a subprocess)."""
    import subprocess
    import sys
    from pathlib import Path

    from tests.helpers.entrypoints import evaluate

    repo = Path(__file__).resolve().parents[2]
    out = tmp_path / "run"
    args = ["experiment=autoscaling", "tracking.enabled=false",
            "experiment.trace.source=synthetic", "experiment.trace.day=1",
            "experiment.trace.hours=0.5", "experiment.trace.scale=0.1", "experiment.seeds=[0]",
            "experiment.workers=1", "experiment.sweep.reactive_targets=[0.4]",
            "experiment.sweep.forecast_targets=[0.85]"]
    s = evaluate(*args, run_dir=out).summary
    assert s["pipeline"] == "fleet" and s["experiment"] == "autoscaling"
    assert set(s["scenarios"]) == {"steady", "burst", "mix_drift", "under_forecast"}
    for pols in s["scenarios"].values():
        assert set(pols) == {"static", "reactive", "forecast"}
        assert all(m["conserved"] for m in pols.values())
    assert s["verdicts"] and (out / "report.html").is_file()
    # a misspelt key fails at composition, with Hydra's message and exit code 2... or 1
    cmd = [sys.executable, "-m", "evaluation", args[0], f"hydra.run.dir={out}"]
    bad = subprocess.run(cmd + ["experiment.pool.coldstart_s=1"], cwd=repo,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "coldstart_s" in bad.stderr


def test_the_doc_tables_are_written_between_their_markers(tmp_path):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "autoscaling_results.py"
    spec = importlib.util.spec_from_file_location("autoscaling_results", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    doc = f"# t\nbefore\n{mod.START}\nold | table\n{mod.END}\nafter\n"
    new = mod.replace_between_markers(doc, "| new |")
    assert new == f"# t\nbefore\n{mod.START}\n| new |\n{mod.END}\nafter\n"
    assert mod.replace_between_markers(new, "| new |") == new   # idempotent
    with pytest.raises(ValueError, match="exactly one"):
        mod.replace_between_markers("no markers", "x")
