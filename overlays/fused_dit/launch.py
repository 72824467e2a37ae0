"""Launching the overlays' Triton kernels with less host time per call.

`kernel[grid](*args)` binds the arguments, computes Triton's specialisation key and looks the compiled kernel up
on every call: 13.5 us of host time on the H200 machine's host, against 5.8 us for calling the compiled kernel's
launcher directly (same bits; benchmarks/launch_overhead.py, launch-overhead.json). An FP8 linear launches two
such kernels, and on that host the FP8 block stack at 4608 tokens often takes as long to issue as the GPU takes to
run it (benchmarks/blocks.py's issue times, blocks.json).

`launch(kernel, grid, key, *args, **options)` keeps the compiled kernel under a key the CALLER gives, and calls
its launcher directly when the key repeats. The key must determine everything Triton specialises the launch on
(each tensor's dtype and 16-byte alignment; each int's equality to 1, divisibility by 16 and width; the
constexprs and options): callers pass e.g. (dtype, source aligned, n) where every int is derived from n and the
other tensors are fresh allocations (always aligned). `args` are all kernel parameters in order, constexprs
included; the first call of a key goes through `kernel[grid](*args, **options)`, which compiles.

`launch_args(kernel, grid, args, constexprs, **options)` is the same for kernels with many arguments (strides,
sizes): it orders `args` (the runtime parameters, in order) and `constexprs` (by name) as the kernel declares
them and keys the launch on `specialisation_key(args)`, which keeps every distinction Triton's specialisation
makes for those values (and a few more), plus the constexprs.

The launcher's calling convention is Triton-internal, so the direct path is taken only on Triton releases it was
checked on (DIRECT_LAUNCH_TRITON, bits compared on an H200), never under the interpreter or with
FUSED_DIT_DIRECT_LAUNCH=0, and it passes the launch hooks (profilers) exactly as the JIT does; everything else
takes `kernel[grid]`.
"""
from __future__ import annotations

import functools
import os

import torch

from .state import STATE

# Triton (major, minor) releases whose CompiledKernel.run(gridX, gridY, gridZ, stream, function, packed_metadata,
# launch_metadata, enter_hook, exit_hook, *all_arguments) the direct path was checked against on a GPU
DIRECT_LAUNCH_TRITON = frozenset({(3, 6)})


@functools.lru_cache(maxsize=1)
def _runtime():
    """triton.knobs.runtime (the launch hooks the JIT passes), or None where this Triton is not one
    DIRECT_LAUNCH_TRITON lists."""
    import triton
    try:
        version = tuple(int(part) for part in triton.__version__.split(".")[:2])
        from triton import knobs
    except (ValueError, ImportError):
        return None
    return getattr(knobs, "runtime", None) if version in DIRECT_LAUNCH_TRITON else None


def direct_enabled() -> bool:
    """Whether launch() may call compiled kernels directly in this process, now."""
    if os.environ.get("TRITON_INTERPRET") == "1" or os.environ.get("FUSED_DIT_DIRECT_LAUNCH") == "0":
        return False
    return not STATE.launch_given_up and _runtime() is not None


def _raw_stream(device: int) -> int:
    get = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return get(device) if get is not None else torch.cuda.current_stream(device).cuda_stream


# (kernel, caller's key, options, device) -> compiled kernel
_compiled: dict = {}
_CACHE_CAP = 4096


def launch(kernel, grid: tuple[int, ...], key, *args, **options):
    """`kernel[grid](*args, **options)`, through the compiled kernel's own launcher once `key` was seen."""
    if not direct_enabled():
        return kernel[grid](*args, **options)
    device = torch.cuda.current_device()
    full_key = (kernel, key, tuple(options.items()), device)
    compiled = _compiled.get(full_key)
    if compiled is None:
        compiled = kernel[grid](*args, **options)
        if len(_compiled) >= _CACHE_CAP:
            _compiled.clear()
        _compiled[full_key] = compiled
        return compiled
    # what JITFunction.run does once it has found the kernel: launch metadata for the hooks, then the launcher
    runtime = _runtime()
    stream = _raw_stream(device)
    try:
        metadata = compiled.launch_metadata(grid, stream, *args)
        compiled.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, stream,
                     compiled.function, compiled.packed_metadata, metadata, runtime.launch_enter_hook,
                     runtime.launch_exit_hook, *args)
    except TypeError as exc:       # a launcher with another calling convention refuses before launching
        STATE.launch_given_up.append(f"{type(exc).__name__}: {exc}")
        return kernel[grid](*args, **options)
    return compiled


_I32_MIN, _I32_MAX = -2 ** 31, 2 ** 31 - 1


def specialisation_key(args) -> tuple:
    """What Triton's JIT may specialise a launch on, for runtime arguments `args`: each tensor's dtype and 16-byte
    alignment; each int's width (32 or 64 bits), equality to 1 and divisibility by 16; bools and None as themselves;
    floats by type only (never specialised). Finer than Triton's own key, never coarser: equal keys mean one
    compiled kernel serves both launches. (Built on every call: kept to plain type checks.)"""
    key = []
    append = key.append
    for arg in args:
        kind = type(arg)
        if kind is int:
            wide = 0 if _I32_MIN <= arg <= _I32_MAX else 3
            append(wide + (0 if arg == 1 else 1 if arg % 16 == 0 else 2))
        elif kind is float:
            append(float)
        elif kind is bool or arg is None:
            append(arg)
        elif isinstance(arg, torch.Tensor):
            append((arg.dtype, arg.data_ptr() % 16 == 0))
        else:
            raise TypeError(f"no specialisation key for a {kind.__name__} argument")
    return tuple(key)


_parameter_orders: dict = {}


def launch_args(kernel, grid: tuple[int, ...], args, constexprs: dict, **options):
    """launch() with the runtime parameters `args` (in order) and `constexprs` (by name), keyed on
    specialisation_key(args) and the constexprs' values."""
    order = _parameter_orders.get(kernel)
    if order is None:
        names = kernel.arg_names
        order = _parameter_orders[kernel] = tuple((i, name) for i, name in enumerate(names) if name in constexprs)
    full = list(args)
    for index, name in order:
        full.insert(index, constexprs[name])
    if len(full) != len(kernel.arg_names):
        raise TypeError(f"{len(args)} arguments and constexprs {sorted(constexprs)} do not fill "
                        f"{len(kernel.arg_names)} parameters")
    return launch(kernel, grid, (specialisation_key(args), tuple(constexprs.items())), *full, **options)

