"""Op 7: GELU (tanh approximation) fused into the FFN's activation quantisation.

Replaces `GELU(tanh)(h)` followed by op 5 in `Linear -> GELU(tanh) -> Linear`. The GELU value is computed in fp32
with the formula torch's CUDA kernel uses (0.5*h*(1 + tanh(sqrt(2/pi)*(h + 0.044715*h^3)))), rounded to h's dtype
(the tensor eager would hand to the next Linear), then quantised exactly as op 5 does (same launch grid, same
partial-maxima stats buffer). Dynamic mode reads h twice (absmax pass, quantise pass, GELU recomputed) and writes
one byte per element; eager reads/writes ~9 bytes.

Parity: codes equal the eager chain `quantize(F.gelu(h, approximate="tanh"))` except where the kernel's tanh and
torch's tanhf round differently in the last bit and that flips the bf16 rounding: the GPU gate reports the
mismatching fraction (expected well below 0.1%, each off by one code). Under the CPU interpreter libdevice is not
available and tanh is computed from exp, so CPU tests compare through an fp32 tolerance.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import dispatch
from ..launch import launch as run_kernel
from ..library import compiling, register
from . import quantize_fp8 as op5
from .quantize_fp8 import (ABSMAX_FLOOR, E4M3_MAX, FP8_DTYPE, LAUNCH, QuantizeLaunch, fp8_choice, kernel_input,
                           launch_grid, new_output, quantize_fp8_comfy_reference, quantize_fp8_dynamic_reference)


def gelu_quantize_fp8_dynamic_reference(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return quantize_fp8_dynamic_reference(F.gelu(h, approximate="tanh"))


def gelu_quantize_fp8_comfy_reference(h: torch.Tensor, scale_input: torch.Tensor | None = None) -> torch.Tensor:
    # the GELU output is a temporary, so ComfyUI's in-place clamp has no observer here
    return quantize_fp8_comfy_reference(F.gelu(h, approximate="tanh"), scale_input, clamp_input_in_place=False)


def gelu_quantize_fp8_dynamic(h: torch.Tensor, launch: QuantizeLaunch = LAUNCH) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes of GELU_tanh(h) with h's shape, fp32 0-dim scale); per-tensor dynamic scale as op 5.

    Under torch.compile: one custom op (`torch.ops.fused_dit.gelu_quantize_fp8_dynamic`, the default launch)."""
    if compiling() and launch is LAUNCH:
        return _GELU_QUANTIZE_DYNAMIC(h)
    if not fp8_choice("gelu_quantize_fp8_dynamic", h).triton:
        return gelu_quantize_fp8_dynamic_reference(h)
    return gelu_quantize_dynamic_triton(h, launch=launch)


def gelu_quantize_fp8_comfy(h: torch.Tensor, scale_input: torch.Tensor | None = None,
                            launch: QuantizeLaunch = LAUNCH) -> torch.Tensor:
    """Codes of GELU_tanh(h) under ComfyUI's static input scale (unit scale when None)."""
    if compiling() and launch is LAUNCH:
        return _GELU_QUANTIZE_COMFY(h, scale_input)
    if not fp8_choice("gelu_quantize_fp8_comfy", h).triton:
        return gelu_quantize_fp8_comfy_reference(h, scale_input)
    return gelu_quantize_comfy_triton(h, scale_input, launch=launch)


# the ops' codes are contiguous, as the kernels allocate them and as the fakes say (the eager references follow
# h's layout)
def _gelu_quantize_dynamic_op(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    codes, scale = gelu_quantize_fp8_dynamic(h)
    return codes.contiguous(), scale


def _gelu_quantize_dynamic_fake(h):
    return h.new_empty(h.shape, dtype=FP8_DTYPE), h.new_empty((), dtype=torch.float32)


def _gelu_quantize_comfy_op(h: torch.Tensor, scale_input: torch.Tensor | None) -> torch.Tensor:
    return gelu_quantize_fp8_comfy(h, scale_input).contiguous()


def _gelu_quantize_comfy_fake(h, scale_input):
    return h.new_empty(h.shape, dtype=FP8_DTYPE)


_GELU_QUANTIZE_DYNAMIC = register("gelu_quantize_fp8_dynamic", _gelu_quantize_dynamic_op, _gelu_quantize_dynamic_fake)
_GELU_QUANTIZE_COMFY = register("gelu_quantize_fp8_comfy", _gelu_quantize_comfy_op, _gelu_quantize_comfy_fake)


try:
    import triton
    import triton.language as tl
except Exception:  # dispatch reports why; the references still work
    triton = None

if triton is not None:
    from .quantize_fp8 import chunk_offsets, scale_from_partials, store_partial_absmax

    try:
        from triton.language.extra import libdevice
    except Exception:  # older layouts; the exp-based tanh is used then
        libdevice = None

    @triton.jit
    def _gelu_tanh(h, LIBDEVICE_TANH: tl.constexpr):
        hf = h.to(tl.float32)
        inner = 0.7978845608028654 * (hf + 0.044715 * (hf * hf * hf))
        if LIBDEVICE_TANH:
            t = libdevice.tanh(inner)
        else:
            # tanh(z) = 1 - 2 / (exp(2z) + 1); exact enough for the interpreter's fp32 tolerance tests
            t = 1.0 - 2.0 / (tl.exp(2.0 * inner) + 1.0)
        # rounded to h's dtype, as eager hands the GELU output to the next Linear
        return (0.5 * hf * (1.0 + t)).to(h.dtype).to(tl.float32)

    @triton.jit
    def _gelu_absmax_kernel(h_ptr, stats_ptr, n, iterations, LIBDEVICE_TANH: tl.constexpr, BLOCK: tl.constexpr):
        running_max = tl.zeros([BLOCK], dtype=tl.float32)
        for i in range(iterations):
            offs = chunk_offsets(i, iterations, BLOCK, False)
            h = tl.load(h_ptr + offs, mask=offs < n, other=0.0)
            # masked lanes hold gelu(0) = 0, which cannot raise the maximum
            running_max = tl.maximum(running_max, tl.abs(_gelu_tanh(h, LIBDEVICE_TANH)))
        store_partial_absmax(stats_ptr, running_max)

    @triton.jit
    def _gelu_quantize_kernel(h_ptr, out_ptr, stats_ptr, reciprocal_ptr, n, iterations, floor, fmax,
                              DYNAMIC: tl.constexpr, HAS_SCALE: tl.constexpr, LIBDEVICE_TANH: tl.constexpr,
                              OUT_FP8: tl.constexpr, BLOCK: tl.constexpr, MAX_PARTIALS: tl.constexpr):
        if DYNAMIC:
            scale = scale_from_partials(stats_ptr, floor, fmax, MAX_PARTIALS)
        for i in range(iterations):
            offs = chunk_offsets(i, iterations, BLOCK, DYNAMIC)
            mask = offs < n
            h = tl.load(h_ptr + offs, mask=mask, other=0.0)
            g = _gelu_tanh(h, LIBDEVICE_TANH)
            if DYNAMIC:
                v = tl.minimum(tl.maximum(tl.div_rn(g, scale), -fmax), fmax)
            elif HAS_SCALE:
                v = (g * tl.load(reciprocal_ptr).to(tl.float32)).to(h.dtype).to(tl.float32)
            else:
                v = tl.minimum(tl.maximum(g, -fmax), fmax)
            if OUT_FP8:
                tl.store(out_ptr + offs, v.to(tl.float8e4nv).to(tl.uint8, bitcast=True), mask=mask)
            else:
                tl.store(out_ptr + offs, v, mask=mask)


def _libdevice_tanh(device: torch.device) -> bool:
    return device.type == "cuda" and not dispatch.interpreting() and libdevice is not None


# (n, the launch setting) -> (grid, iterations, MAX_PARTIALS): launch_grid and next_power_of_2 cost a few
# microseconds per FFN call in Python for values that depend only on the key; the cap only guards against
# unbounded growth.
_gelu_launches: dict[tuple, tuple] = {}


def _gelu_launch_cached(n: int, launch: QuantizeLaunch) -> tuple:
    key = n if launch is LAUNCH else (n, launch)      # the default setting unhashed (see op5's cache)
    cached = _gelu_launches.get(key)
    if cached is None:
        programs, iterations = launch_grid(n, launch)
        cached = ((programs,), iterations, triton.next_power_of_2(launch.max_programs))
        if len(_gelu_launches) >= op5._LAUNCH_CACHE_CAP:
            _gelu_launches.clear()
        _gelu_launches[key] = cached
    return cached


def gelu_quantize_dynamic_triton(h: torch.Tensor, out_fp32: bool = False, launch: QuantizeLaunch = LAUNCH,
                                 scratch: tuple[torch.Tensor, torch.Tensor] | None = None
                                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """scratch: as op5.quantize_dynamic_triton's (a reused stats buffer from op5.gemm_stats)."""
    n = h.numel()
    if n > op5.MAX_KERNEL_ELEMENTS:
        codes, scale = gelu_quantize_fp8_dynamic_reference(h)
        return (codes.float() if out_fp32 else codes), scale
    source = kernel_input(h)
    out, written = new_output(source, out_fp32)
    grid_setting = _gelu_launch_cached(n, launch)
    grid, iterations, max_partials = grid_setting
    if scratch is None or launch is not LAUNCH:
        stats, scale = torch.empty(grid[0] + 1, device=h.device, dtype=torch.float32), None
    else:
        stats, scale = scratch
    use_libdevice = _libdevice_tanh(h.device)
    block, num_warps = launch.elements_per_iteration, launch.num_warps
    # the launches' specialisation, as in op5.quantize_dynamic_triton (see fused_dit.launch): the grid tuple
    # (grid, iterations, MAX_PARTIALS) and the block size
    key = (source.dtype, source.data_ptr() % 16 == 0, n, out_fp32, use_libdevice, grid_setting, block)
    run_kernel(_gelu_absmax_kernel, grid, key, source, stats, n, iterations, use_libdevice, block, num_warps=num_warps)
    # arguments: h, out, stats, reciprocal (unread when DYNAMIC), n, iterations, floor, fmax, DYNAMIC, HAS_SCALE,
    # LIBDEVICE_TANH, OUT_FP8, BLOCK, MAX_PARTIALS
    run_kernel(_gelu_quantize_kernel, grid, key, source, written, stats, stats, n, iterations, ABSMAX_FLOOR, E4M3_MAX,
               True, False, use_libdevice, not out_fp32, block, max_partials, num_warps=num_warps)
    # slot 0 of the stats buffer: the scale (see op5.new_stats)
    return out, (stats[0] if scale is None else scale)


def gelu_quantize_comfy_triton(h: torch.Tensor, scale_input: torch.Tensor | None = None,
                               out_fp32: bool = False, launch: QuantizeLaunch = LAUNCH) -> torch.Tensor:
    n = h.numel()
    if n > op5.MAX_KERNEL_ELEMENTS:
        codes = gelu_quantize_fp8_comfy_reference(h, scale_input)
        return codes.float() if out_fp32 else codes
    source = kernel_input(h)
    out, written = new_output(h, out_fp32)
    reciprocal = op5.comfy_reciprocal(scale_input, source)
    if n:
        programs, iterations = launch_grid(n, launch)
        # stats_ptr is not read outside DYNAMIC mode; any pointer will do
        _gelu_quantize_kernel[(programs,)](
            source, written, reciprocal, reciprocal, n, iterations, ABSMAX_FLOOR, E4M3_MAX,
            DYNAMIC=False, HAS_SCALE=scale_input is not None, LIBDEVICE_TANH=_libdevice_tanh(h.device),
            OUT_FP8=not out_fp32, BLOCK=launch.elements_per_iteration, MAX_PARTIALS=1, num_warps=launch.num_warps)
    return out
