"""How an experiment's cells run: `LocalGrid` (compute=local) or `DaskGrid` (compute=dask),
with the same results. Part of the harness (`harness/__init__.py`).

The one home of a fleet experiment's fan-out: its grid of cells, run here or on Dask.

An experiment lists its cells (a (policy, window or load, seed) combination, in the
order it aggregates them) and a top-level, picklable `fn(shared, cell) -> result`
that runs one cell: one simulation (or a few that belong together) and its picklable
outcome: the SimResult (the pooled p99s and the per-window slices need its per-request
arrays) and the few facts the experiment aggregates. `shared` is what every cell reads
(pools, workloads, specs): it is handed to each call locally and sent to the Dask
workers once (scattered).

    runner.map(fn, cells, shared=..., desc="overload cells")   # results in cell order

`LocalGrid` (compute=local, the default) runs the cells in a plain loop, in order, in
this process (or, with `workers` > 1, in that many forked processes, as
`autoscaling.workers` asks); `DaskGrid` (compute=dask) submits one task per cell to a
`dask.distributed.Client` and gathers the results in cell order. No cell reads random
state another cell left behind: every simulation is seeded by its own cell's data (the
workload was drawn with its own seed; the simulator and the policies are
deterministic), so the results are identical however and wherever the cells run.

Both show a progress bar on stderr (tqdm, off when stderr is not a terminal): over the
cells locally, over completed tasks on Dask.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


class GridRunner(Protocol):
    """How a fleet experiment's cells run: `map(fn, cells, shared=, desc=, workers=)`."""

    kind: str

    def map(self, fn: Callable[[Any, Any], Any], cells: Sequence, *, shared: Any = None,
            desc: str = "cells", workers: int = 1) -> list:
        """[fn(shared, cell) for cell in cells], however they run; the order is the cells'."""
        ...


def progress_bar(total: int, desc: str):
    """tqdm on stderr (as the rest of replaylab); disabled when stderr is not a terminal."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="cell", disable=None)


def call_cell(fn: Callable[[Any, Any], Any], shared: Any, cell: Any) -> Any:
    """One cell: fn(shared, cell). Top level, so a process pool can pickle it."""
    return fn(shared, cell)


@dataclass(frozen=True)
class LocalGrid:
    """The cells in this process, in order (compute=local); `workers` > 1 (autoscaling's
    own option) runs them in that many forked processes, results still in cell order."""

    progress: bool = True
    kind: str = "local"

    def map(self, fn: Callable[[Any, Any], Any], cells: Sequence, *, shared: Any = None,
            desc: str = "cells", workers: int = 1) -> list:
        cells = list(cells)
        bar = progress_bar(len(cells), desc) if self.progress else None
        try:
            if workers <= 1 or len(cells) <= 1:
                out = []
                for cell in cells:
                    out.append(fn(shared, cell))
                    if bar is not None:
                        bar.update()
                return out
            from concurrent.futures import ProcessPoolExecutor
            from functools import partial
            from multiprocessing import get_context

            with ProcessPoolExecutor(min(workers, len(cells)),
                                     mp_context=get_context("fork")) as ex:
                out = []
                for r in ex.map(partial(call_cell, fn, shared), cells):
                    out.append(r)
                    if bar is not None:
                        bar.update()
                return out
        finally:
            if bar is not None:
                bar.close()


@dataclass(frozen=True)
class DaskGrid:
    """One Dask task per cell on `client` (compute=dask); `shared` is scattered to every
    worker once; the results are gathered in cell order (a failed cell raises its error)."""

    client: Any
    progress: bool = True
    kind: str = "dask"

    def map(self, fn: Callable[[Any, Any], Any], cells: Sequence, *, shared: Any = None,
            desc: str = "cells", workers: int = 1) -> list:
        from dask.distributed import as_completed

        cells = list(cells)
        if not cells:
            return []
        # a one-element list: scatter sends the object itself, not its items
        [shared_f] = self.client.scatter([shared], broadcast=True, hash=False)
        tag = f"{desc.split()[0]}-{uuid.uuid4().hex[:8]}"
        futures = [self.client.submit(call_cell, fn, shared_f, cell, key=f"{tag}-{i}",
                                      pure=False) for i, cell in enumerate(cells)]
        try:
            if self.progress:
                bar = progress_bar(len(futures), desc)
                try:
                    for _ in as_completed(futures):
                        bar.update()
                finally:
                    bar.close()
            return self.client.gather(futures)
        finally:
            for f in futures:
                f.release()
            shared_f.release()


def local_grid() -> LocalGrid:
    """The default runner: today's loop."""
    return LocalGrid()
