"""Numbered stages of a pipeline. Locally (`LocalStages`): one log line as each starts and
one with its seconds when it ends. On Dask (`DaskStages`): one log line as each starts, a progress bar of
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
  stage, what the worker process died of and what to do (`python -m training` prints it
  as `error: ...`, exit code 2); a pipeline that judges a loss itself (the demand
  boosters) raises `stage.failure(name, exc, library)`, the same line. What it died of
  comes from the nannies' own record: a nanny logs "Worker process PID was killed by
  signal N" / "exited with status N" when its worker process ends, and
  `Client.get_worker_logs(nanny=True)` returns those logs (`worker_exits`; the scheduler
  asks the nannies of its registered workers, so a failure waits up to `EXIT_WAIT_S` for
  a restarted worker to register again); the exits seen when the stage started are left
  out. A signal is named (`describe_exit`):
  SIGSEGV/SIGBUS/SIGILL/SIGFPE/SIGABRT are a crash in native code, SIGKILL what kills
  for memory (the kernel's OOM killer, the nanny's memory limit) or a person.
  Any other exception passes unchanged.

Nothing is imported from Dask until a stage runs (no I/O at import).
"""

from __future__ import annotations

import logging
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from replaylab.contracts.errors import InputError

POLL_S = 0.5  # seconds between two polls of the scheduler's task counts (the bar only)
EXIT_WAIT_S = 5.0  # seconds a failure waits for a lost worker's nanny to be asked again
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


# a nanny's line when its worker process ends (distributed.nanny.WorkerProcess._death_message)
_EXIT = re.compile(r"Worker process (\d+) (?:was killed by signal (\d+)|exited with status "
                   r"(-?\d+)|was killed by (unknown) signal)")
_NATIVE = {"SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT"}


def worker_exits(client: Any) -> dict[int, tuple[str, int | None]]:
    """{pid: ("signal" | "status" | "unknown", number)} of every worker process exit the
    cluster's nannies logged (their log deques, `Client.get_worker_logs(nanny=True)`);
    {} when the nannies cannot be asked (no nanny, a scheduler gone)."""
    try:
        logs = client.get_worker_logs(nanny=True)
    except Exception:  # no nanny or no scheduler: nothing to say
        return {}
    out: dict[int, tuple[str, int | None]] = {}
    for records in logs.values():
        for record in records if isinstance(records, list | tuple) else ():
            text = record[1] if isinstance(record, list | tuple) and len(record) > 1 else record
            m = _EXIT.search(str(text))
            if m:
                kind = "signal" if m.group(2) else "status" if m.group(3) else "unknown"
                number = m.group(2) or m.group(3)
                out[int(m.group(1))] = (kind, int(number) if number is not None else None)
    return out


def describe_exit(kind: str, number: int | None) -> str:
    """One worker exit in words: `killed by signal 11 (SIGSEGV: a crash in native code)`."""
    if kind == "status":
        return f"exited with status {number}"
    if kind == "unknown" or number is None:
        return "killed by an unknown signal"
    try:
        name = signal.Signals(number).name
    except ValueError:
        return f"killed by signal {number}"
    if name in _NATIVE:
        why = "a crash in native code, not memory"
    elif name == "SIGKILL":
        why = "the kernel's OOM killer, the nanny's memory limit, or a person"
    else:
        why = "sent by the system or a person"
    return f"killed by signal {number} ({name}: {why})"


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


class LocalStages:
    """The stages of one pipeline run in this process: `stage i/N: <what it does>` as each
    starts, `stage i/N done in S s: <name>` when it ends; `timings[name]` holds S.
    `DaskStages` is the same with a task bar and lost workers turned into `StageFailed`
    (its hooks: `begin`, `end`, `translate`); an engine hands out either."""

    label = "stage"

    def __init__(self, stages: Mapping[str, str],
                 progress: Callable[[str], None] | None = None) -> None:
        self.stages = dict(stages)
        self.progress = progress or logging.getLogger("replaylab").info
        self.timings: dict[str, float] = {}

    def number(self, name: str) -> str:
        return f"{list(self.stages).index(name) + 1}/{len(self.stages)}"

    def __enter__(self) -> LocalStages:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def begin(self, name: str) -> Any:
        """What a stage holds while it runs (nothing here); handed back to `end`."""
        return None

    def end(self, held: Any) -> None:
        return None

    def translate(self, name: str, exc: Exception) -> BaseException | None:
        """The error a failed stage raises instead of `exc` (None: `exc` itself)."""
        return None

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        if name not in self.stages:
            raise KeyError(f"unknown stage {name!r}; stages: {list(self.stages)}")
        number = self.number(name)
        self.progress(f"{self.label} {number}: {self.stages[name]}")
        held = self.begin(name)
        t0 = time.perf_counter()
        try:
            yield
        except StageFailed:
            raise
        except Exception as e:
            failed = self.translate(name, e)
            if failed is not None:
                raise failed from e
            raise
        finally:
            self.end(held)
        self.timings[name] = time.perf_counter() - t0
        self.progress(f"{self.label} {number} done in {self.timings[name]:.1f} s: {name}")


class DaskStages(LocalStages):
    """The stages of one pipeline run on Dask (see the module docstring).

    stages: {name: what it does}, in run order (numbered 1..N by that order).
    progress: where the stage lines go (default: the `replaylab` logger's info).
    client: the `distributed.Client` (default: the current one when a stage starts).
    bar: draw the task bar (default: when stderr is a TTY).
    """

    label = "dask stage"

    def __init__(self, stages: Mapping[str, str], progress: Callable[[str], None] | None = None,
                 *, client: Any = None, bar: bool | None = None) -> None:
        super().__init__(stages, progress)
        self.client = client
        self.bar = sys.stderr.isatty() if bar is None else bool(bar)
        self.plugin = False
        self.exits_before: dict[int, tuple[str, int | None]] = {}

    def __enter__(self) -> DaskStages:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.plugin:
            try:
                self.client.unregister_scheduler_plugin(PLUGIN_NAME)
            except Exception:  # a scheduler already gone: nothing to clean
                pass
            self.plugin = False

    def get_client(self) -> Any:
        """The stages' client (the current one when none was given), or None."""
        if self.client is None:
            try:
                from distributed import default_client

                self.client = default_client()
            except (ImportError, ValueError):  # no client: no exits to read
                return None
        return self.client

    def failure(self, name: str, exc: BaseException, library: str | None = None,
                ) -> StageFailed:
        """The `StageFailed` of stage `name` stopped by a lost worker (`exc`): one line with
        the stage, the error (a pipeline's own judgement, given with its `library`, leads
        as it is), what the worker processes that ended during the stage died of
        (`worker_exits`, `describe_exit`), the library that was running (`library`, else
        the task Dask named) and what to do."""
        client = self.get_client()
        new: dict[int, tuple[str, int | None]] = {}
        deadline = time.monotonic() + EXIT_WAIT_S
        while client is not None:  # a restarted worker's nanny is asked once it is back
            now = worker_exits(client)
            new = {pid: e for pid, e in now.items() if self.exits_before.get(pid) != e}
            if new or time.monotonic() >= deadline:
                break
            time.sleep(0.5)
        by: dict[str, int] = {}
        for e in new.values():
            by[describe_exit(*e)] = by.get(describe_exit(*e), 0) + 1
        explicit = library is not None  # a loss the pipeline judged: its message leads
        if library is None:
            task = getattr(exc, "task", None)
            if task is not None:
                from dask.utils import key_split

                library = f"task {key_split(task)!r}"
        where = f" in {library}" if library else ""
        if by:
            died = "; ".join((f"{k} worker processes were {d}" if k > 1 else
                              f"a worker process was {d}") + where for d, k in by.items())
            native = any(e[0] == "signal" and describe_exit(*e).endswith("not memory)")
                         for e in new.values())
            todo = ("a native crash repeats on the same data: see the library's inputs and its "
                    "known bugs, then rerun" if native else
                    "check the workers' memory and restarts, and rerun")
        else:
            died = (f"no worker process ended during the stage{where} (the nannies' logs): the "
                    "data was lost otherwise (a worker without a nanny or killed with it, its "
                    "network, or the scheduler: see its log)")
            todo = "check the workers, the network and the scheduler's log, and rerun"
        lead = (one_line(exc, 300).split(": ", 1)[-1] if explicit else
                f"a worker was lost and Dask could not recover ({one_line(exc, 160)})")
        return StageFailed(f"dask stage {self.number(name)} ({name}) stopped: {lead}; {died}; "
                           f"no summary was written: {todo}")

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

    def begin(self, name: str) -> TaskBar | None:
        """The worker exits seen so far (a failure names only new ones) and the task bar."""
        client = self.get_client()
        self.exits_before = worker_exits(client) if client is not None else {}
        return self.start_bar(name)

    def end(self, held: TaskBar | None) -> None:
        if held is not None:
            held.close()

    def translate(self, name: str, exc: Exception) -> BaseException | None:
        return self.failure(name, exc) if is_lost_worker(exc) else None


__all__ = ["DaskStages", "LocalStages", "StageFailed", "describe_exit", "is_lost_worker", "one_line",
           "worker_exits"]
