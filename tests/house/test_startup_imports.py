"""Start-up: composing a config imports neither torch nor lightgbm (issue 44, item 4).

Every `python -m training|export|evaluation` registers the schemas (apps/schemas.py) and
composes its config before it does anything else; importing torch there cost ~1.2 s a
command (router/head.py was on the schema's import path). Checked in a fresh interpreter
(`sys.modules` of this test process holds whatever earlier tests imported): every
pipeline's and every experiment's config composed through Hydra's compose API, and the
`--cfg job` command a user types, once, under `-X importtime`.
"""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

HEAVY = ("torch", "lightgbm")
PIPELINES = sorted(p.stem for p in (REPO / "conf" / "pipeline").glob("*.yaml"))
EXPERIMENTS = sorted(p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml"))

# (config name, overrides) per entry point: training per pipeline, evaluation per
# experiment, export with its default action (re-export) and a registry action
COMPOSED = ([("train", [f"pipeline={p}"]) for p in PIPELINES]
            + [("evaluate", [f"experiment={e}"]) for e in EXPERIMENTS]
            + [("export", []), ("export", ["action=promote"])])


def _loaded_after(code: str) -> list[str]:
    """The HEAVY modules a fresh interpreter holds after running `code`."""
    probe = f"import sys\n{code}\nprint(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return eval(proc.stdout.strip().splitlines()[-1])  # noqa: S307 (our own printed list)


def test_composing_every_entry_points_config_imports_no_torch_nor_lightgbm():
    code = (
        "from hydra import compose, initialize_config_dir\n"
        "from replaylab.apps.schemas import register_schemas\n"
        "register_schemas()\n"
        f"with initialize_config_dir(config_dir={str(REPO / 'conf')!r}, version_base='1.3'):\n"
        f"    for name, overrides in {COMPOSED!r}:\n"
        "        cfg = compose(config_name=name, overrides=overrides)\n"
        "        assert cfg is not None\n")
    assert len(PIPELINES) >= 5 and len(EXPERIMENTS) >= 5  # the globs found the configs
    assert _loaded_after(code) == []


def test_the_probe_sees_torch_when_the_head_is_imported():
    # the check above can fail: importing the estimator's module does load torch
    assert _loaded_after("import replaylab.router.head") == ["torch"]


def test_cfg_job_of_the_router_pipeline_imports_no_torch_nor_lightgbm():
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "training", "pipeline=router", "--cfg", "job"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "router:" in proc.stdout  # the job's config was printed
    imported = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()
                if line.startswith("import time:")]
    assert len(imported) > 100  # -X importtime did report
    assert [m for m in imported if m.split(".")[0] in HEAVY] == []
