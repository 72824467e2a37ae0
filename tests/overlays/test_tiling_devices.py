"""Tiled sampling over several devices (fused_dit/tiling/devices.py and its wiring), on the CPU with fake devices:
each fake device is a distinct torch.device ("cpu:1", "cpu:2", ...; tensors moved there stay on the CPU) whose call
runs one deterministic model, some slowly (time.sleep per tile), one raising torch.OutOfMemoryError. The canvas is
bit-identical to the single-device loop's; shares follow measured speed; a failing device's tiles are redone by the
others; every device failing raises; one device is today's loop, with no thread."""
from __future__ import annotations

import logging
import threading
import time

import pytest
import torch

from fused_dit import state
from fused_dit.tiling import devices, models, plan, sampling, wrappers

WEIGHT = torch.randn(4, 4, 3, 3, generator=torch.Generator().manual_seed(3))


class Held:
    """comfy.conds' shape: a tensor in `.cond`, `_copy_with`."""

    def __init__(self, cond):
        self.cond = cond

    def _copy_with(self, cond):
        return Held(cond)


def model(x: torch.Tensor, entry: dict) -> torch.Tensor:
    """Deterministic, nonlinear, and reading a conditioning that is cut to the tile."""
    concat = entry["model_conds"]["concat"].cond
    return torch.tanh(torch.nn.functional.conv2d(x, WEIGHT, padding=1)) * 1.7 + x * x + concat


def executor_for(log: list | None = None, name: str = "main", per_tile: float = 0.0, fail: BaseException | None = None,
                 fail_after: int = 0):
    """An executor-like call: runs `model` on the tiles, after `per_tile` seconds a tile; raises `fail` from its
    (fail_after + 1)-th call on."""
    calls = [0]

    def call(model_, conds, x, timestep, model_options):
        calls[0] += 1
        if fail is not None and calls[0] > fail_after:
            raise fail
        tiles = x.shape[0]
        time.sleep(per_tile * tiles)
        if log is not None:
            log.append((name, tiles, threading.get_ident()))
        assert timestep.shape[0] == tiles
        return [torch.zeros_like(x) if c is None else model(x, c[0]) for c in conds]
    return call


def canvas(height=40, width=56, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(1, 4, height, width, generator=generator)
    concat = torch.randn(1, 4, height, width, generator=generator)
    return x, [[{"model_conds": {"concat": Held(concat)}}], None]


def run(x, conds, layout, batch, executor=None, **kwargs):
    return sampling.tiled_calc_cond_batch(executor or executor_for(), None, conds, x, torch.full((1,), 0.5), {},
                                          plan_for=lambda _: (layout, batch), **kwargs)


def fake(n: int) -> torch.device:
    return torch.device("cpu", n)


# ------------------------------------------------------------------------------------------------- the canvas
def test_several_devices_give_the_single_device_canvas_bit_for_bit():
    x, conds = canvas()
    layout = plan.plan(40, 56, 16, 6)
    alone = run(x, conds, layout, 3)
    log: list = []
    # the first device is slow, so later batches finish first: the blend still adds them in plan order
    pairs = [(fake(1), executor_for(log, "slow", 0.004)), (fake(2), executor_for(log, "fast")),
             (fake(3), executor_for(log, "middling", 0.001))]
    spread = run(x, conds, layout, 3, devices=pairs)
    assert all(torch.equal(a, b) for a, b in zip(alone, spread))
    assert sum(tiles for _, tiles, _ in log) == layout.count
    assert len({name for name, _, _ in log}) >= 2
    assert threading.get_ident() not in {ident for _, _, ident in log}        # the devices ran on threads


def test_progress_counts_tiles_in_plan_order_over_devices():
    x, conds = canvas()
    layout = plan.plan(40, 56, 16, 6)
    seen = []
    pairs = [(fake(1), executor_for(per_tile=0.002)), (fake(2), executor_for())]
    run(x, conds, layout, 2, devices=pairs, progress=sampling.Progress(advance=lambda d, n: seen.append((d, n))))
    assert [d for d, _ in seen] == sorted(d for d, _ in seen) and seen[-1] == (layout.count, layout.count)


# ------------------------------------------------------------------------------------------------- the shares
def test_unequal_devices_get_shares_that_follow_their_measured_speed():
    batches = [(k,) * 2 for k in range(24)]                 # 24 batches of 2 "tiles" (anything with a len)
    speeds = {fake(1): 0.005, fake(2): 0.02}                 # seconds a tile: one card four times the other

    def worker(device):
        def go(boxes):
            time.sleep(speeds[device] * len(boxes))
            return [device]
        return go

    order = []
    crew = devices.spread(batches, [(d, worker(d)) for d in speeds], lambda boxes, out: order.append(boxes))
    assert order == batches                                  # blended in plan order
    fast, slow = crew
    assert fast.batches + slow.batches == 24 and slow.batches >= 1
    assert fast.batches >= 2 * slow.batches                  # about 4x in theory; 2x leaves room for a busy machine
    assert fast.rate < slow.rate


def test_a_slow_device_leaves_the_last_batches_to_a_faster_one():
    """The tail rule, with a fake clock: the measured slow device (4 s a tile) does not take the last batch that
    the fast one (1 s a tile, free in 1 s) would finish sooner; it does take one when many wait."""
    slow = devices.Worker(fake(1), None, seconds=8.0, tiles=2)
    fast = devices.Worker(fake(2), None, seconds=2.0, tiles=2, batch=0, running_tiles=1, started=9.0)
    crew = [slow, fast]
    assert not devices.takes_next(slow, crew, [1], now=10.0)
    assert not devices.takes_next(slow, crew, [1, 1, 1], now=10.0)
    assert devices.takes_next(slow, crew, [1] * 4, now=10.0)
    unmeasured = devices.Worker(fake(3), None)
    assert devices.takes_next(unmeasured, crew + [unmeasured], [1], now=10.0)   # measured by its first batch
    fast.alive = False
    assert devices.takes_next(slow, crew, [1], now=10.0)                         # nobody else left


# ------------------------------------------------------------------------------------------------- failures
def test_a_device_out_of_memory_hands_its_tiles_to_the_others_and_is_said_once(caplog):
    state.forget_said()
    x, conds = canvas()
    layout = plan.plan(40, 56, 16, 6)
    alone = run(x, conds, layout, 2)
    log: list = []
    broken = executor_for(log, "broken", fail=torch.OutOfMemoryError("CUDA out of memory"), fail_after=1)
    pairs = [(fake(1), broken), (fake(2), executor_for(log, "a", 0.001)), (fake(3), executor_for(log, "b", 0.002))]
    with caplog.at_level(logging.INFO, logger="fused_dit"):
        first = run(x, conds, layout, 2, devices=pairs)
        second = run(x, conds, layout, 2, devices=pairs)
    for out in (first, second):
        assert all(torch.equal(a, b) for a, b in zip(alone, out))
    assert sum(tiles for name, tiles, _ in log if name != "broken") >= 2 * layout.count - 2
    said = [r.getMessage() for r in caplog.records if "failed on a batch of tiles" in r.getMessage()]
    assert len(said) == 1 and "cpu:1" in said[0] and "OutOfMemoryError" in said[0]


def test_every_device_failing_fails_the_call():
    x, conds = canvas()
    layout = plan.plan(40, 56, 16, 6)
    pairs = [(fake(1), executor_for(fail=torch.OutOfMemoryError("out of memory"))),
             (fake(2), executor_for(fail=RuntimeError("device lost"), fail_after=2))]
    with pytest.raises((torch.OutOfMemoryError, RuntimeError)):
        run(x, conds, layout, 2, devices=pairs)


def test_an_interrupt_inside_a_device_stops_the_call_and_cancel_waits_for_running_batches():
    class Interrupt(BaseException):                          # ComfyUI's InterruptProcessingException is one
        pass

    x, conds = canvas()
    layout = plan.plan(40, 56, 16, 6)
    pairs = [(fake(1), executor_for(fail=Interrupt())), (fake(2), executor_for(per_tile=0.002))]
    with pytest.raises(Interrupt):
        run(x, conds, layout, 2, devices=pairs)

    class Cancelled(Exception):
        pass

    running = [0]
    asked = [0]
    lock = threading.Lock()

    def slow_counted(model_, conds_, x_, t, o):
        with lock:
            running[0] += 1
        time.sleep(0.01)
        with lock:
            running[0] -= 1
        return [torch.zeros_like(x_) if c is None else x_ for c in conds_]

    def cancel():
        asked[0] += 1
        if asked[0] > 3:
            raise Cancelled

    with pytest.raises(Cancelled):
        run(x, conds, layout, 2, devices=[(fake(1), slow_counted), (fake(2), slow_counted)],
            progress=sampling.Progress(check_cancel=cancel))
    assert running[0] == 0                                   # nothing of the call still runs after it raised


# ------------------------------------------------------------------------------------------------- one device
def test_one_device_or_none_is_the_single_device_loop_without_threads():
    x, conds = canvas()
    layout = plan.plan(40, 56, 16, 6)
    main_log: list = []
    other_log: list = []
    before = threading.active_count()
    outs = [run(x, conds, layout, 3, executor=executor_for(main_log, "main"), devices=d)
            for d in (None, [], [(fake(1), executor_for(other_log, "one"))])]
    assert all(torch.equal(a, b) for out in outs[1:] for a, b in zip(outs[0], out))
    assert other_log == []                                   # today's loop: the wrapper's own executor
    assert {ident for _, _, ident in main_log} == {threading.get_ident()}
    assert threading.active_count() == before
    order = []
    devices.spread([(1,), (2,)], [(fake(1), lambda boxes: [threading.get_ident()])],
                   lambda boxes, out: order.append(out[0]))
    assert order == [threading.get_ident()] * 2


def test_comfyuis_thread_pool_runs_the_batches_where_it_covers_the_devices():
    class Pool(devices._Threads):                            # MultiGPUThreadPool's interface
        def __init__(self, devices_):
            super().__init__(devices_)
            self.devices = list(devices_)
            self.submitted = 0

        def submit(self, device, fn, *args):
            self.submitted += 1
            super().submit(device, fn, *args)

    x, conds = canvas()
    layout = plan.plan(40, 56, 16, 6)
    pool = Pool([fake(1), fake(2)])
    try:
        out = run(x, conds, layout, 2, devices=[(fake(1), executor_for()), (fake(2), executor_for())], pool=pool)
        assert pool.submitted == len(layout.batches(2))
        assert all(torch.equal(a, b) for a, b in zip(run(x, conds, layout, 2), out))
        assert all(t.is_alive() for t in pool._threads)     # the pool is ComfyUI's to stop
    finally:
        pool.shutdown()


# ------------------------------------------------------------------------------------------------- the wiring
class Patcher:
    def __init__(self, name):
        self.model = name


def test_the_node_builds_its_devices_from_comfyuis_multigpu_clones():
    seen = []

    def executor(model_, conds, x, timestep, model_options):
        seen.append((model_, model_options))
        return [x * 2 for _ in conds]

    sigmas = torch.tensor([1.0, 0.0])
    options = {"multigpu_clones": {fake(0): Patcher("main"), fake(1): Patcher("clone")},
               "multigpu_thread_pool": object(), "transformer_options": {"sample_sigmas": sigmas}, "other": 1}
    pairs = wrappers.multigpu_devices(executor, options)
    assert [d for d, _ in pairs] == [fake(0), fake(1)]
    x = torch.ones(1, 1, 2, 2)
    for (device, call), name in zip(pairs, ("main", "clone")):
        assert torch.equal(call("ignored", [[{}]], x, torch.ones(1), options)[0], x * 2)
        model_, used = seen[-1]
        assert model_ == name and used["other"] == 1
        assert "multigpu_clones" not in used and "multigpu_thread_pool" not in used
    assert "multigpu_clones" in options                      # ComfyUI's own dict is left as it was
    assert wrappers.multigpu_devices(executor, {}) is None
    assert wrappers.multigpu_devices(executor, {"multigpu_clones": {fake(0): Patcher("main")}}) is None


def test_a_sampling_call_with_clones_spreads_its_tiles_and_matches_one_device():
    hooks = wrappers.TiledSampling(models.MODELS["flux-dev"], wrappers.Request(256, 64, 2), torch.device("cpu"))
    noise = torch.randn(1, 16, 64, 80, generator=torch.Generator().manual_seed(5))
    used = []

    def executor(model_, conds, x, timestep, model_options):
        used.append(model_)
        return [torch.sin(x) * 3 + x for _ in conds]

    t = torch.full((1,), 0.5)
    alone = hooks.calc_cond_batch(executor, "main", [[{}]], noise, t, {})
    assert set(used) == {"main"}
    used.clear()
    options = {"multigpu_clones": {torch.device("cpu"): Patcher("main"), fake(1): Patcher("clone")}}
    spread = hooks.calc_cond_batch(executor, "main", [[{}]], noise, t, options)
    assert torch.equal(alone[0], spread[0])
    assert set(used) == {"main", "clone"}
