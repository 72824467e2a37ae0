"""The attention family (issue 21): ComfyUI's own attention call, run by the fastest exact SDPA backend per shape.

It goes through ComfyUI's attention seam: the node puts `FastestSdpa` into the model's
`transformer_options["optimized_attention_override"]`, which ComfyUI's `wrap_attn` calls as `override(func, *args,
**kwargs)` for every attention of that model (0.3.64 and later). Where `func` is ComfyUI's `attention_pytorch` on
CUDA tensors and the release orders SDPA backends through `comfy.ops.SDPA_BACKEND_PRIORITY`, the call runs with that
list reordered so the backend measured fastest for this shape comes first: flash, cuDNN and memory-efficient are
all exact attention (they differ from one another at the output dtype's rounding), and a backend whose output
differs from the release's own order by more than `TOLERANCE` (relative to the output's scale) is never chosen.
Each shape (q, k, v shapes, dtype, device, mask or not) is measured once, on its first call, and the choice cached;
a backend that is first in the release's order already, or beats that order by less than MIN_GAIN, leaves the
call as ComfyUI makes it (stock bits, no reorder per call).

Where the user's environment imports FlashAttention-4 (`flash_attn.cute`, integration/attention_optional.py; never
required), it is one more exact candidate for the calls it takes (no mask, bf16 / fp16, its head dims), timed on the
same first call and kept only where its output is within `TOLERANCE` of the release's order; chosen, it runs the call
in ComfyUI's function's place. Where it is absent, that is said once.

Everything else is ComfyUI's call as it was: another attention function (sage, flash-attn, split, sub-quadratic),
CPU tensors, a release without the priority list, or another node's override already in place (then this one
steps aside, so that node's choice stands). With the toggle off nothing is installed: stock bits.

Under torch.compile (ComfyUI's TorchCompileModel) the override steps aside as well: measuring needs eager calls
(CUDA events, a host read of the output's scale), and tracing the per-call reorder would break the graph at
every attention call, which costs more than any backend saves. The compiled graph keeps the release's order.
"""
from __future__ import annotations

import contextlib
import logging
import sys

import torch

from . import attention_optional as optional
from . import model_compiler

log = logging.getLogger("fused_dit")
PRIORITY = "SDPA_BACKEND_PRIORITY"
TOLERANCE = 2 ** -7          # bf16's ulp at 1: rounding-level differences only
REPEATS = 3
# a backend must beat the release's own order by this much to be put first: below it the gain is within the
# timer's noise and the reorder's host work per call (ComfyUI 0.3.64 on the H200: cuDNN first already, a
# "faster" cuDNN at 0.4% made Flux-dev 1024 0.98x stock, generation-0.3.64.json)
MIN_GAIN = 0.03


def _ops_module(func):
    """comfy.ops as `func` (ComfyUI's attention_pytorch) reaches it, or None."""
    comfy = getattr(func, "__globals__", {}).get("comfy")
    return getattr(comfy, "ops", None)


@contextlib.contextmanager
def first_in_priority(ops_module, backend):
    """comfy.ops.SDPA_BACKEND_PRIORITY with `backend` moved first, for the span of one call (the function that reads
    it looks the list up at call time); the very list object is put back."""
    saved = getattr(ops_module, PRIORITY)
    setattr(ops_module, PRIORITY, [backend, *(b for b in saved if b != backend)])
    try:
        yield
    finally:
        setattr(ops_module, PRIORITY, saved)


def cuda_timer(fn, repeats: int = REPEATS, warmup: int = 1) -> float:
    """Median milliseconds of fn() over `repeats` runs after `warmup` runs, by CUDA events."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


class FastestSdpa:
    """An `optimized_attention_override` that picks the fastest exact SDPA backend per shape (see the module)."""

    def __init__(self, timer=cuda_timer, devices=("cuda",)):
        self.timer = timer
        self.devices = devices
        self.choices: dict[tuple, object] = {}      # shape key -> backend moved first (None: the release's order;
        self.fa4 = None                             # optional.FA4: FlashAttention-4 in the function's place)

    def _applies(self, func, args) -> object | None:
        ops_module = _ops_module(func)
        q = args[0] if args else None
        if (getattr(func, "__name__", "") != "attention_pytorch" or ops_module is None
                or not isinstance(getattr(ops_module, PRIORITY, None), list) or not isinstance(q, torch.Tensor)
                or q.device.type not in self.devices):
            return None
        return ops_module

    def __call__(self, func, *args, **kwargs):
        if torch.compiler.is_compiling():
            return func(*args, **kwargs)
        ops_module = self._applies(func, args)
        if ops_module is None:
            return func(*args, **kwargs)
        key = (tuple(tuple(t.shape) for t in args[:3] if isinstance(t, torch.Tensor)), args[0].dtype,
               args[0].device, kwargs.get("mask") is None, kwargs.get("skip_reshape", False))
        if key not in self.choices:
            if model_compiler.capturing(args[0]):     # no timing inside a graph: the release's order this once
                return func(*args, **kwargs)
            with model_compiler.outside_recorded_allocations():
                self.choices[key] = self._measure(ops_module, func, args, kwargs, key)
        backend = self.choices[key]
        if backend is None:
            return func(*args, **kwargs)
        if backend == optional.FA4:
            return optional.fa4_call(self.fa4, *_qkv_heads(args, kwargs))
        with first_in_priority(ops_module, backend):
            return func(*args, **kwargs)

    def _measure(self, ops_module, func, args, kwargs, key):
        """The backend to put first for this shape: the fastest whose output stays within TOLERANCE of the
        release's own order (None where the release's order is the fastest)."""
        stock = func(*args, **kwargs)
        scale = float(stock.abs().max()) or 1.0
        best, best_ms = None, self.timer(lambda: func(*args, **kwargs))
        timings = {"release order": best_ms}
        for backend in list(getattr(ops_module, PRIORITY)):
            try:
                with first_in_priority(ops_module, backend):
                    out = func(*args, **kwargs)
                    if float((out - stock).abs().max()) > TOLERANCE * scale:
                        timings[str(backend)] = "not exact"
                        continue
                    ms = self.timer(lambda: func(*args, **kwargs))
            except RuntimeError as exc:           # a backend that cannot take this shape
                timings[str(backend)] = f"unavailable ({exc})"[:80]
                continue
            timings[str(backend)] = ms
            if ms < best_ms:
                best, best_ms = backend, ms
        ms = self._measure_fa4(args, kwargs, stock, scale, timings)
        if ms is not None and ms < best_ms:
            best, best_ms = optional.FA4, ms
        release = timings["release order"]
        if best is not None and (best_ms > (1 - MIN_GAIN) * release or getattr(ops_module, PRIORITY)[:1] == [best]):
            best = None                      # within noise of the release's order, or first there already
        log.debug("fused_dit: attention %s -> %s first (%s)", key[0], best or "the release's order", timings)
        return best


    def _measure_fa4(self, args, kwargs, stock, scale, timings) -> float | None:
        """FlashAttention-4's milliseconds on this call where it imports, takes the call and is exact (else None,
        the reason in `timings`)."""
        attend = optional.fa4()
        if attend is None:
            return None
        call = _qkv_heads(args, kwargs)
        why = optional.fa4_refusal(*call) if None not in call[:4] else "a call without q, k, v and heads"
        if why is not None:
            timings[optional.FA4] = f"refuses {why}"
            return None
        try:
            with optional.quiet_compile():
                out = optional.fa4_call(attend, *call)
                if out.shape != stock.shape or float((out.float() - stock.float()).abs().max()) > TOLERANCE * scale:
                    timings[optional.FA4] = "not exact"
                    return None
                ms = self.timer(lambda: optional.fa4_call(attend, *call))
        except Exception as exc:              # a shape or GPU it does not build for
            timings[optional.FA4] = f"unavailable ({type(exc).__name__})"
            return None
        self.fa4 = attend
        timings[optional.FA4] = ms
        return ms


def _qkv_heads(args: tuple, kwargs: dict) -> tuple:
    """(q, k, v, heads, kwargs) of an attention_pytorch call (None for what it lacks): Flux passes heads by position,
    Wan and most others as `heads=`."""
    q, k, v = (*args[:3], None, None, None)[:3]
    return q, k, v, args[3] if len(args) > 3 else kwargs.get("heads"), kwargs


def release_order() -> list[str] | None:
    """The names of the SDPA backends in the loaded release's order (comfy.ops.SDPA_BACKEND_PRIORITY, as the
    override reorders it), or None where there is none: no ComfyUI loaded, no CUDA, or a release before the list."""
    order = getattr(sys.modules.get("comfy.ops"), PRIORITY, None)
    if not isinstance(order, list):
        return None
    return [getattr(backend, "name", str(backend)) for backend in order]


OVERRIDE_KEY = "optimized_attention_override"
RUNS = "fastest exact SDPA backend per shape, measured once"


def stays_stock(model_options: dict) -> str | None:
    """Why the override would not go into these model_options (another node's is there and keeps its choice)."""
    if OVERRIDE_KEY in model_options.get("transformer_options", {}):
        return "another node's attention override is in place and keeps its choice"
    return None


def install(model_options: dict, override: FastestSdpa | None = None) -> str:
    """Put the override into a (cloned) ModelPatcher's model_options; returns what it did, in words."""
    why = stays_stock(model_options)
    if why:
        return f"stock: {why}"
    model_options.setdefault("transformer_options", {})[OVERRIDE_KEY] = override or FastestSdpa()
    return RUNS
