"""A Dask scheduler and workers as separate processes, as on a cluster."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

# the repository root on the processes' path: a test module's own functions (pickled by
# reference, `tests.<pkg>.<module>.<fn>`) import there as in the test process
REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1",
       "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH"))
                                     if p)}


@contextlib.contextmanager
def dask_processes(tmp: Path, n_workers: int = 2):
    """A `dask scheduler` and `n_workers` `dask worker` processes started apart (as on a
    cluster), on loopback; yields (address, the worker processes); all stopped after."""
    from distributed import Client

    dask_bin = str(Path(sys.executable).parent / "dask")
    sched_file = tmp / "scheduler.json"
    # each process's log beside the scheduler file (`tmp`): what a failure is read from
    logs = [open(tmp / name, "ab") for name in  # noqa: SIM115 - closed in finally
            ("scheduler.log", *(f"worker-{i}.log" for i in range(n_workers)))]
    procs = [subprocess.Popen([dask_bin, "scheduler", "--host", "127.0.0.1", "--port", "0",
                               "--no-dashboard", "--scheduler-file", str(sched_file)],
                              stdout=subprocess.DEVNULL, stderr=logs[0], env=ENV,
                              start_new_session=True)]
    try:
        deadline = time.time() + 60
        while not sched_file.is_file() and time.time() < deadline:
            time.sleep(0.2)
        address = json.loads(sched_file.read_text())["address"]
        workers = [subprocess.Popen([dask_bin, "worker", address, "--nworkers", "1",
                                     "--nthreads", "1", "--no-dashboard"],
                                    stdout=subprocess.DEVNULL, stderr=logs[1 + i],
                                    env=ENV, start_new_session=True) for i in range(n_workers)]
        procs += workers
        with Client(address) as c:
            c.wait_for_workers(n_workers, timeout=60)
        yield address, workers
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        for f in logs:
            f.close()
