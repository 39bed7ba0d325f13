"""Shared fixtures: paths to the real public data and tiny seeded ledgers."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TEST_DATA = REPO / "tests" / "data"


SHARED_DATA_ENV = "REPLAYLAB_SHARED_DATA"
# The one reason a test may skip for want of data: it reads a FULL downloaded public file
# (an importer's counts on the whole file, a provenance fit); the summary below counts them.
FULL_FILES_REASON = f"need the full public files ({SHARED_DATA_ENV} unset)"


# Property tests draw the same examples on every run (HYPOTHESIS_PROFILE=explore draws new
# ones): a red CI then always reproduces, and a rare runaway draw cannot fail one run in N
# (a random draw of test_fleet_policies' scenario property once ran without end and grew the
# pytest process to 24 GB, killed by the OOM killer: make test, 2026-12-06; not yet found).
from hypothesis import settings as _hypothesis_settings  # noqa: E402

_hypothesis_settings.register_profile("ci", derandomize=True)
_hypothesis_settings.register_profile("explore", derandomize=False)
_hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

def pytest_configure(config):
    """Artifacts are signed by default with a per-project key file created on first use
    (`replaylab.apps.provenance.hmac_key`): the tests, and the entry points they start,
    use one key file in a temporary folder of this session, never the user's own.

    Under pytest-xdist this runs first in the controller, whose environment the workers
    inherit: every worker signs with the one key. The file is written here, before any
    worker starts, so no two processes race to create it (a reader could see it empty)."""
    import secrets
    import tempfile

    if not os.environ.get("REPLAYLAB_HMAC_KEY_FILE"):
        key = Path(tempfile.mkdtemp(prefix="replaylab-test-key-")) / "signing.key"
        key.write_text(secrets.token_hex(32) + "\n")
        key.chmod(0o600)
        os.environ["REPLAYLAB_HMAC_KEY_FILE"] = str(key)
    # OpenMP threads (LightGBM's, torch's) sleep instead of spinning while they wait, in
    # every worker and every entry point a test starts: with two workers on two cores a
    # spinning pool holds a core the other worker needs (the walkthrough saw a 2-minute
    # demand run take over 15 on a busy machine). Only the waiting changes, not results.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if _distributed(config):
        # our order (longest files first, below), not xdist's (most tests first)
        config.option.loadscopereorder = False
        config.pluginmanager.register(LongestFilesFirst(config), "replaylab-files-order")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The folder of full public files, $REPLAYLAB_SHARED_DATA (`make test` sets it to
    ../shared/data when that folder is beside the checkout). Only tests of importers on
    full files (and full-file variants of slice tests) ask for it; they skip when the
    variable is unset. Set to a path that is not a folder, the test errors."""
    env = os.environ.get(SHARED_DATA_ENV)
    if not env:
        pytest.skip(FULL_FILES_REASON)
    path = Path(env)
    if not path.is_dir():
        pytest.fail(f"{SHARED_DATA_ENV}={env} is not a folder", pytrace=False)
    return path


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter):
    """The run's last line before the counts: how many tests skipped for want of the full
    public files, by test module (after pytest's own short summary: the outer wrapper)."""
    result = yield
    per_file: dict[str, int] = {}
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = report.longrepr
        if isinstance(longrepr, tuple) and FULL_FILES_REASON in str(longrepr[2]):
            module = report.nodeid.split("::")[0].split("/")[-1]
            per_file[module] = per_file.get(module, 0) + 1
    if per_file:
        shown = ", ".join(f"{m} ({n})" for m, n in sorted(per_file.items()))
        terminalreporter.write_line(
            f"{sum(per_file.values())} tests skipped: {FULL_FILES_REASON}: {shown}", yellow=True)
    return result


@pytest.fixture(autouse=True)
def mlflow_starts_clean():
    """Each test starts as a new process would for MLflow: no run left open, and no
    tracking or registry URI left set by an earlier test's in-process run
    (`mlflow.set_tracking_uri` is process-global and beats MLFLOW_TRACKING_URI, so a later
    test would talk to a server an earlier one killed). The environment is left as it was."""
    yield
    mlflow = sys.modules.get("mlflow")
    if mlflow is None:
        return
    env = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")}
    while mlflow.active_run() is not None:
        mlflow.end_run("FAILED")
    mlflow.set_tracking_uri(None)
    mlflow.set_registry_uri(None)
    for k, v in env.items():
        if v is not None:
            os.environ[k] = v


@pytest.fixture(scope="session")
def dask_address(tmp_path_factory):
    """The scheduler address of ONE cluster for the whole test session (per xdist worker):
    a `dask scheduler` and 2 `dask worker` processes x 1 thread, no dashboard, started on
    first use and stopped at the end: pass it as `compute.address=...` /
    `ComputeConfig(address=...)`. Sharing it saves ~5 s per cluster start on 2 cores. The
    scheduler runs in its own process, as on a real cluster: a LocalCluster's scheduler
    runs in the test process, where dask-expr's graph deserialisation raced the client's
    garbage collection once in a full run (KeyError 'taskshuffle-...' from
    `_expr._reconstruct`'s weak instance cache, read as lost dependencies). A test that
    kills or restarts workers must start its own cluster
    (`tests/helpers/dask.dask_processes`), never this one."""
    from tests.helpers.dask import dask_processes

    with dask_processes(tmp_path_factory.mktemp("session-dask")) as (address, _):
        yield address


@pytest.fixture(scope="session")
def dask_client(dask_address):
    """A `distributed.Client` on the session's LocalCluster (`dask_address`), for tests that
    call Dask collections directly; the engine connects its own client to the address."""
    from distributed import Client

    with Client(dask_address) as client:
        yield client


@pytest.fixture(scope="session")
def test_data() -> Path:
    """Small slices of real files committed under tests/data (see tests/data/README_*.md)."""
    return TEST_DATA


def edit_golden(folder: Path, edit, name: str = "golden.json") -> Path:
    """Apply `edit(doc)` to `folder/name` and rebuild the manifests so every hash verifies
    again (the edit is then only visible to a golden-vector check). For a router folder
    whose encoder's golden file is edited, the encoder manifest is rebuilt and the router
    manifest re-pins its content hash."""
    import json

    from replaylab.contracts.manifest import build_manifest, write_manifest

    path = folder / name
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))

    def rebuild(f: Path, patch=None) -> dict:
        m = json.loads((f / "manifest.json").read_text())
        keep = {k: m[k] for k in ("contracts", "features", "outputs", "calibration", "training",
                                  "runtime", "fallback")}
        if patch:
            patch(keep)
        new = build_manifest(f, kind=m["kind"], version=m["version"], valid_days=30, **keep)
        write_manifest(f, new)
        return new

    if path.parent == folder / "encoder":  # a router's encoder: rebuild it, then re-pin it
        new = rebuild(path.parent)
        rebuild(folder, lambda k: k["features"][0].update(
            encoder_content_hash=new["content_hash"]))
    else:
        rebuild(folder)
    return folder


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """ONE real `mlflow server` for the whole test session: (url, artifact store folder).
    Tests that share it keep apart by their own experiment and registered-model names
    (the registry's version numbers count per name); a test that stops, restarts or
    breaks its server starts its own (`mlflow_server_process`)."""
    tmp = tmp_path_factory.mktemp("mlflow-session")
    with mlflow_server_process(tmp) as (url, _pid):
        yield url, tmp / "artifacts"


@contextlib.contextmanager
def mlflow_server_process(tmp: Path, port: int | None = None):
    """A real `mlflow server` on a free loopback port (sqlite store and artifacts under tmp).

    Yields (url, pid); the server (and its gunicorn/uvicorn child) is stopped by
    process group on exit. MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false and one
    worker: it starts in ~6 s on 2 cores.
    """
    import shutil
    import signal
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    mlflow_bin = Path(sys.executable).parent / "mlflow"
    if not mlflow_bin.exists():
        mlflow_bin = Path(shutil.which("mlflow") or "mlflow")
    if port is None:  # a free one (a given port: a restart on the same store and URL)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    log = open(tmp / "server.log", "a")
    proc = subprocess.Popen(
        [str(mlflow_bin), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{tmp}/server.db",
         "--artifacts-destination", str(tmp / "artifacts")],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("mlflow server did not start:\n"
                                   + (tmp / "server.log").read_text()[-2000:])
            time.sleep(0.5)
        yield url, proc.pid
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


# --- pytest-xdist: what runs where (docs/howto/testing.md) ----------------------------------
# `make test` runs `pytest -n 2 --dist loadfile`: a work unit (what one worker runs, start to
# end) is a whole test file, so a module-scoped fixture is computed once, on one worker, and
# the tests of a file never run beside each other. (Not `loadgroup`: xdist 3.8 names a
# group by rewriting `item._nodeid`, which pytest 9.2 no longer reads, so `xdist_group` marks
# are silently ignored.) Files are sent longest first, so the last minutes of a run hold many
# short files instead of one long one: the seconds each file took in the last distributed
# run of this checkout (pytest's cache, .pytest_cache), else ~60 s per `slow` test and ~1 s
# per other test (a fresh clone). Session fixtures are per worker.
FILE_SECONDS_CACHE = "replaylab/xdist_file_seconds"


def _distributed(config) -> bool:
    """True in a worker or the controller of an `-n N` (N >= 1) run with --dist loadfile."""
    if hasattr(config, "workerinput"):  # xdist sets a worker's own dist option to "no"
        return config.workerinput.get("replaylab_loadfile", False)
    return (config.getoption("dist", default="no") == "loadfile"
            and bool(getattr(config.option, "numprocesses", 0)))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """xdist (controller): tells each worker the run is distributed by file."""
    node.workerinput["replaylab_loadfile"] = _distributed(node.config)


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


class LongestFilesFirst:
    """Runs last among the collection hooks (after pytest's fixture-scope ordering): the
    files in descending expected seconds, each file's tests in pytest's order; the
    controller records each file's seconds for the next run."""

    def __init__(self, config):
        self.config = config
        self.seconds: dict[str, float] = {}

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        cache = getattr(config, "cache", None)  # None under -p no:cacheprovider
        known = cache.get(FILE_SECONDS_CACHE, {}) if cache is not None else {}
        files: dict[str, list] = {}
        for item in items:
            files.setdefault(_file_of(item.nodeid), []).append(item)

        def expected_s(name: str) -> float:
            if name in known:
                return float(known[name])
            return sum(60.0 if i.get_closest_marker("slow") else 1.0 for i in files[name])

        ordered = sorted(files, key=expected_s, reverse=True)  # stable: ties keep file order
        items[:] = [i for name in ordered for i in files[name]]

    def pytest_runtest_logreport(self, report):
        """The controller sees every phase's report from the workers."""
        name = _file_of(report.nodeid)
        self.seconds[name] = self.seconds.get(name, 0.0) + report.duration

    def pytest_sessionfinish(self, session, exitstatus):
        if hasattr(self.config, "workerinput") or not self.seconds \
                or getattr(self.config, "cache", None) is None:
            return
        known = self.config.cache.get(FILE_SECONDS_CACHE, {})
        known.update({name: round(s, 1) for name, s in self.seconds.items()})
        self.config.cache.set(FILE_SECONDS_CACHE, known)
