"""Batches of tiles over several devices (ComfyUI's multi-GPU clones), blended where the canvas is, in plan order.

`spread(batches, workers, blend, ...)` runs each batch of tiles on one of the workers - (device, run) pairs, where
`run(boxes)` returns the batch's predictions - and hands every batch's predictions to `blend(boxes, outputs)` on the
calling thread, in the order of `batches`, whatever order they finish in. The blender's fp32 sums then see the same
additions in the same order as the single-device loop, so for a deterministic model the canvas is bit-identical to
it (the batches themselves are the plan's, unchanged: a batch is never split or merged across devices).

- Shares follow measured speed. A worker's seconds per tile are measured from the batches it finished in this call
  (wall time around the batch, the device synchronised). An idle worker takes the next batch at once until it has
  been measured; after that it takes it when, handing the waiting batches in order to whichever worker would finish
  each first (its measured rate from when it is free), it would get one of them. In the bulk of the call every idle
  worker takes work, so faster devices take more batches; near the end a slow device leaves the last batches to the
  faster ones rather than hold the canvas up.
- A worker whose batch raises (out of memory, or any other Exception) hands the batch back - it goes first to the
  next free worker - and is dropped for the rest of the call, said once. The call fails only when every worker has
  failed; it then raises the last error. A BaseException that is not an Exception (ComfyUI's interrupt) stops the
  call at once.
- Cancel (`check_cancel`, which raises) is asked before each batch is handed out; the batches already running finish
  before the exception goes on, so no device is still working on this call after it returns or raises.
- Threads: one per device. ComfyUI's own pool (`multigpu_thread_pool`, one worker per device, each on its device
  from the start) where it is given and covers every device; otherwise threads of this call's own, stopped before
  it returns. One worker, or none: no thread at all, each batch in turn on the caller's thread (the caller uses its
  single-device loop then; see sampling.py).
"""
from __future__ import annotations

import queue
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from .. import state


@dataclass
class Worker:
    """One device, its batch runner, and what this call measured of it."""
    device: torch.device
    run: Callable
    alive: bool = True
    batch: int | None = None         # the batch it is running, its tiles, when it started
    running_tiles: int = 0
    started: float = 0.0
    seconds: float = 0.0             # over the batches it finished
    tiles: int = 0
    batches: int = 0

    @property
    def rate(self) -> float | None:
        """Seconds per tile, None until a batch has finished."""
        return self.seconds / self.tiles if self.tiles else None


class _Threads:
    """One thread per device with the shape of ComfyUI's MultiGPUThreadPool (submit, get_result, shutdown)."""

    def __init__(self, devices):
        self._work = {device: queue.Queue() for device in devices}
        self._results = {device: queue.Queue() for device in devices}
        self._threads = [threading.Thread(target=self._loop, args=(d,), daemon=True, name=f"tiles-{d}")
                         for d in self._work]
        for thread in self._threads:
            thread.start()

    def _loop(self, device) -> None:
        while (item := self._work[device].get()) is not None:
            fn, args = item
            try:
                self._results[device].put((fn(*args), None))
            except Exception as error:                    # noqa: BLE001 - handed to the caller, as ComfyUI's pool
                self._results[device].put((None, error))

    def submit(self, device, fn, *args) -> None:
        self._work[device].put((fn, args))

    def get_result(self, device):
        return self._results[device].get()

    def shutdown(self) -> None:
        for work in self._work.values():
            work.put(None)
        for thread in self._threads:
            thread.join()


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _pool_covers(pool, devices) -> bool:
    have = getattr(pool, "devices", None)
    return (pool is not None and hasattr(pool, "submit") and hasattr(pool, "get_result") and have is not None
            and all(d in list(have) for d in devices))


def takes_next(worker: Worker, workers: Sequence[Worker], waiting: Sequence[int], now: float) -> bool:
    """Whether idle `worker` should take the first waiting batch now (`waiting`: tiles of each waiting batch, in
    order): yes until it is measured; then yes when the earliest-finish hand-out of the waiting batches over the
    measured live workers gives it one."""
    if worker.rate is None or not waiting:
        return bool(waiting)
    free = {}                                             # when each other measured live worker is free
    for other in workers:
        if other is worker or not other.alive or other.rate is None:
            continue
        if other.batch is None:
            free[id(other)] = (now, other.rate)
        else:
            free[id(other)] = (max(now, other.started + other.rate * other.running_tiles), other.rate)
    for tiles in waiting:
        mine = now + worker.rate * tiles
        if not free:
            return True
        key, (at, rate) = min(free.items(), key=lambda item: item[1][0] + item[1][1] * tiles)
        if at + rate * tiles >= mine:
            return True
        free[key] = (at + rate * tiles, rate)
    return False


def spread(batches: Sequence[tuple], workers: Sequence[tuple[torch.device, Callable]],
           blend: Callable[[tuple, list], None], *, advance: Callable[[int], None] = lambda tiles: None,
           check_cancel: Callable[[], None] = lambda: None, pool=None,
           clock: Callable[[], float] = time.perf_counter) -> list[Worker]:
    """Run `batches` (each a tuple of boxes) over `workers` ((device, run) pairs; `run(boxes)` -> predictions) and
    blend each batch's predictions in order (see the module docstring); `advance(tiles)` after each blended batch.
    Returns the workers with what was measured of them (batches and tiles each ran, its seconds, whether it lived)."""
    crew = [Worker(torch.device(device), run) for device, run in workers]
    if len(crew) <= 1:
        for boxes in batches:
            check_cancel()
            if not crew:
                raise RuntimeError("Tiled Sampling: no device to run the tiles on")
            blend(boxes, crew[0].run(boxes))
            advance(len(boxes))
        return crew
    devices = [w.device for w in crew]
    threads = pool if _pool_covers(pool, devices) else _Threads(devices)
    finished: queue.Queue = queue.Queue()
    waiting = deque(range(len(batches)))
    ready: dict[int, list] = {}
    next_blend = 0
    last_error: BaseException | None = None

    def job(worker: Worker, index: int):
        started = clock()
        try:
            outputs = worker.run(batches[index])
            _synchronize(worker.device)
            finished.put((worker, index, outputs, None, clock() - started))
        except BaseException as error:                    # noqa: BLE001 - judged on the calling thread
            finished.put((worker, index, None, error, clock() - started))

    def running() -> list[Worker]:
        return [w for w in crew if w.batch is not None]

    def collect() -> tuple:
        item = finished.get()
        worker = item[0]
        threads.get_result(worker.device)                 # the pool's own answer for this job (it never raises)
        worker.batch = None
        return item

    try:
        while next_blend < len(batches):
            idle = [w for w in crew if w.alive and w.batch is None]
            idle.sort(key=lambda w: (w.rate is None, w.rate or 0.0))
            for worker in idle:
                if waiting and takes_next(worker, crew, [len(batches[i]) for i in waiting], clock()):
                    check_cancel()
                    index = waiting.popleft()
                    worker.batch, worker.started, worker.running_tiles = index, clock(), len(batches[index])
                    threads.submit(worker.device, job, worker, index)
            if not running():
                raise last_error or RuntimeError("Tiled Sampling: no device took the waiting tiles")
            worker, index, outputs, error, seconds = collect()
            if error is not None:
                if not isinstance(error, Exception):
                    raise error
                last_error = error
                worker.alive = False
                waiting.appendleft(index)
                state.say_once("Tiled Sampling: %s failed on a batch of tiles (%s): the other devices take its "
                               "tiles for the rest of this model call", str(worker.device), type(error).__name__)
                if not any(w.alive for w in crew):
                    state.say_once("Tiled Sampling: every device failed on its tiles; the last error: %s",
                                   type(error).__name__)
                    raise error
                continue
            worker.seconds += seconds
            worker.tiles += len(batches[index])
            worker.batches += 1
            ready[index] = outputs
            while next_blend in ready:
                boxes = batches[next_blend]
                blend(boxes, ready.pop(next_blend))
                advance(len(boxes))
                next_blend += 1
    finally:
        while running():                                  # nothing of this call still runs after it returns
            collect()
        if threads is not pool:
            threads.shutdown()
    return crew
