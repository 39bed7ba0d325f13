"""Numbered stages of a pipeline on Dask: one log line as each starts, a progress bar of
the cluster's tasks while it runs, one line with its seconds when it ends, and a lost
worker turned into one line naming the stage.

    with DaskStages(STAGES, progress) as stage:   # STAGES: {name: what it does}, in order
        with stage("read"):
            ...                                     # any Dask work (compute, persist, ...)

- start: `progress("dask stage i/N: <what it does>")` (`progress` defaults to the
  `replaylab` logger's info);
- while it runs, on a terminal (stderr a TTY): a tqdm bar of the tasks the scheduler
  finished since the stage began, against those finished plus those still waiting or
  processing (every compute of the stage, the library's inner ones too; recomputed
  tasks after a lost worker count again). The counts come from a small scheduler
  plugin (`TaskCounter`, shipped by value: the scheduler needs no replaylab) polled
  every `POLL_S`; a scheduler that refuses the plugin means no bar, never a failure;
- end: `progress("dask stage i/N done in S s: <name>")`; `timings[name]` holds S;
- a lost worker Dask could not recover from inside the stage (`KilledWorker`, a closed
  comm, cancelled futures; `is_lost_worker`) raises `StageFailed`, one line naming the
  stage and what to do (`python -m training` prints it as `error: ...`, exit code 2).
  Any other exception passes unchanged.

Nothing is imported from Dask until a stage runs (no I/O at import).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from replaylab.contracts.errors import InputError

POLL_S = 0.5  # seconds between two polls of the scheduler's task counts (the bar only)
PLUGIN_NAME = "replaylab-task-counter"


class StageFailed(InputError, RuntimeError):
    """A stage of a Dask pipeline stopped for a reason outside the data (a lost worker):
    its message is one line that names the stage and what to do."""


def is_lost_worker(exc: BaseException) -> bool:
    """Whether `exc` says a Dask worker (or the scheduler's link to it) went away."""
    try:
        from distributed import KilledWorker
        from distributed.client import FutureCancelledError
        from distributed.comm import CommClosedError
    except ImportError:
        return False
    if isinstance(exc, KilledWorker | CommClosedError | FutureCancelledError):
        return True
    text = f"{type(exc).__name__}: {exc}".lower()
    # lightgbm.dask: a peer's socket closed under a surviving worker's training
    return type(exc).__name__ == "LightGBMError" and "socket" in text


def one_line(exc: BaseException, limit: int = 200) -> str:
    """`Type: first line of the message`, cut at `limit` characters."""
    text = str(exc).strip().splitlines()
    first = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
    return first if len(first) <= limit else first[: limit - 3] + "..."


def task_counter() -> Any:
    """A scheduler plugin counting tasks that reached memory or erred (cumulative); its
    class is built here so that cloudpickle ships it by value."""
    from distributed.diagnostics.plugin import SchedulerPlugin

    plugin_name = PLUGIN_NAME

    class TaskCounter(SchedulerPlugin):
        name = plugin_name

        def __init__(self) -> None:
            self.finished = 0

        def transition(self, key, start, finish, *args, **kwargs) -> None:  # noqa: ARG002
            if finish in ("memory", "erred"):
                self.finished += 1

    return TaskCounter()


def scheduler_counts() -> Callable[[Any], tuple[int, int]]:
    """fn(dask_scheduler) -> (tasks finished so far, tasks waiting, queued or processing),
    for `Client.run_on_scheduler`; nested so that cloudpickle ships it by value."""
    name = PLUGIN_NAME

    def counts(dask_scheduler: Any) -> tuple[int, int]:
        plugin = dask_scheduler.plugins.get(name)
        pending = 0
        for group in list(dask_scheduler.task_groups.values()):
            states = group.states
            pending += sum(states.get(s, 0) for s in ("waiting", "queued", "processing",
                                                      "no-worker"))
        return (plugin.finished if plugin is not None else 0), pending

    return counts


class TaskBar:
    """A tqdm bar of the scheduler's tasks, polled from a daemon thread until `close`."""

    def __init__(self, client: Any, label: str) -> None:
        from tqdm.auto import tqdm

        self.client = client
        self.counts = scheduler_counts()
        self.base, _ = client.run_on_scheduler(self.counts)
        self.bar = tqdm(total=0, desc=label, unit="task", file=sys.stderr, leave=False,
                        dynamic_ncols=True)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.poll, name="replaylab-task-bar", daemon=True)
        self.thread.start()

    def update(self) -> None:
        done, pending = self.client.run_on_scheduler(self.counts)
        done = max(done - self.base, 0)
        self.bar.total = done + pending
        self.bar.n = done
        self.bar.refresh()

    def poll(self) -> None:
        while not self.stop.wait(POLL_S):
            try:
                self.update()
            except Exception:  # the bar is a view: it never stops a run
                return

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.bar.close()


class DaskStages:
    """The stages of one pipeline run on Dask (see the module docstring).

    stages: {name: what it does}, in run order (numbered 1..N by that order).
    progress: where the stage lines go (default: the `replaylab` logger's info).
    client: the `distributed.Client` (default: the current one when a stage starts).
    bar: draw the task bar (default: when stderr is a TTY).
    """

    def __init__(self, stages: Mapping[str, str], progress: Callable[[str], None] | None = None,
                 *, client: Any = None, bar: bool | None = None) -> None:
        self.stages = dict(stages)
        self.progress = progress or logging.getLogger("replaylab").info
        self.client = client
        self.bar = sys.stderr.isatty() if bar is None else bool(bar)
        self.timings: dict[str, float] = {}
        self.plugin = False

    def number(self, name: str) -> str:
        return f"{list(self.stages).index(name) + 1}/{len(self.stages)}"

    def __enter__(self) -> DaskStages:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.plugin:
            try:
                self.client.unregister_scheduler_plugin(PLUGIN_NAME)
            except Exception:  # a scheduler already gone: nothing to clean
                pass
            self.plugin = False

    def start_bar(self, name: str) -> TaskBar | None:
        if not self.bar:
            return None
        try:
            if self.client is None:
                from distributed import default_client

                self.client = default_client()
            if not self.plugin:
                self.client.register_plugin(task_counter(), name=PLUGIN_NAME)
                self.plugin = True
            return TaskBar(self.client, f"stage {self.number(name)} {name}")
        except Exception as e:  # a scheduler refusing the plugin: lines only
            self.progress(f"dask: no progress bar ({one_line(e, 120)})")
            self.bar = False
            return None

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        if name not in self.stages:
            raise KeyError(f"unknown stage {name!r}; stages: {list(self.stages)}")
        number = self.number(name)
        self.progress(f"dask stage {number}: {self.stages[name]}")
        bar = self.start_bar(name)
        t0 = time.perf_counter()
        try:
            yield
        except StageFailed:
            raise
        except Exception as e:
            if is_lost_worker(e):
                raise StageFailed(
                    f"dask stage {number} ({name}) stopped: a worker was lost and Dask could "
                    f"not recover ({one_line(e, 160)}); no summary was written: check the "
                    "workers (memory, restarts) and rerun") from e
            raise
        finally:
            if bar is not None:
                bar.close()
        self.timings[name] = time.perf_counter() - t0
        self.progress(f"dask stage {number} done in {self.timings[name]:.1f} s: {name}")


__all__ = ["DaskStages", "StageFailed", "is_lost_worker", "one_line"]
