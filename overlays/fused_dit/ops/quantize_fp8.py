"""Op 5: quantise activations to float8 e4m3 (e4m3fn, max 448), two flavours.

Dynamic per-tensor (what the overlay's own FP8 linears use for bf16/fp16 weights):
    scale = max(absmax(x), 1e-12) / 448          (fp32, IEEE division)
    codes = (x.float() / scale).clamp(-448, 448).to(float8_e4m3fn)
The scale never leaves the GPU and nothing is zero-filled: the first kernel's programs each write the maximum of
|x| over their share into their own slot of a small fp32 "stats" buffer (no atomics, so no contention on one
address); the second kernel's programs each reduce those <= max_programs partial maxima themselves, derive the
scale, quantise their share, and program 0 stores the scale (slot 0 of the same buffer, handed to
torch._scaled_mm as a 0-dim view). The maximum is exact in any order, so the scale is bit-identical to the
reference. No host sync.

ComfyUI's static flavour (the drop-in tier; comfy/ops.py `fp8_linear`, read 2025-10):
    scale_input is None:  x.clamp_(-448, 448) IN PLACE, then x.to(float8_e4m3fn)
    scale_input given:    (x * (1.0 / scale_input).to(x.dtype)).to(float8_e4m3fn)    (no clamp)
The product is rounded to x's dtype before the fp8 cast (two roundings), as eager torch does; the kernel does the
same. Drop-in decision: the in-place clamp IS reproduced by default (`clamp_input_in_place=True`), because callers
can observe it (Wan's cross-attention feeds the same `context` tensor to every block, so ComfyUI's fp8 path clamps
it once for all later blocks). The kernel writes back only the elements that were out of range, so the side effect
costs no bandwidth when nothing exceeds 448.

Overflow in the scaled flavour follows the installed torch: torch 2.13 saturates out-of-range values to +-448 when
casting to float8_e4m3fn; older releases produced NaN (0x7F/0xFF) above 464. The kernel checks the installed
torch's behaviour once per device and reproduces it.

Codes are compared as raw bytes against the eager references below (`*_reference`). Division uses tl.div_rn
(Triton's `/` on fp32 is an approximate division on NVIDIA GPUs).
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch

from .. import dispatch
from ..launch import launch as run_kernel
from ..state import STATE
from ..library import compiling, register
from . import TuningRecord

E4M3_MAX = 448.0
FP8_DTYPE = torch.float8_e4m3fn
# the smallest absmax that still gives a finite scale; an all-zero tensor quantises to zero codes
ABSMAX_FLOOR = 1e-12
# FP8 kernels need Ada (sm_89) or Hopper (sm_90) for the hardware e4m3 conversion
FP8_MIN_CAPABILITY = (8, 9)

# offsets are int32 in the kernels; larger tensors take the eager reference (same results). The margin covers the
# grid's overshoot past n (under max_programs + 1 chunks) for chunks of up to 2**14 elements.
MAX_KERNEL_ELEMENTS = 2**31 - 2**25
MAX_ELEMENTS_PER_ITERATION = 2**14


@dataclass(frozen=True)
class QuantizeLaunch:
    """Launch setting of the FP8 quantisation kernels (op 5 and op 7's GELU kernels). Pass another to the
    quantisers to sweep one.

    Each program walks its chunks of elements_per_iteration elements grid-stride; at most max_programs programs,
    so the dynamic kernels' per-program partial maxima stay few enough for every program to reduce all of them.
    The dynamic quantiser has its own (None: the shared value; dynamic_programs_per_sm > 0: at most that many
    programs per SM instead of max_programs). dynamic_l2_keep_bytes: bytes of x's tail that the absmax pass asks
    L2 to keep (evict_last; the chunks before it evict_first) for the quantise pass, which walks the chunks last
    to first; 0: no cache hints.
    """
    elements_per_iteration: int = 4096
    num_warps: int = 8
    max_programs: int = 1024
    dynamic_elements_per_iteration: int | None = None
    dynamic_num_warps: int | None = None
    dynamic_programs_per_sm: int = 0
    dynamic_l2_keep_bytes: int = 32 * 1024 * 1024


LAUNCH = QuantizeLaunch()
TUNING = TuningRecord(
    chosen="4096 elements per iteration x 8 warps, at most 1024 programs; the dynamic pass keeps the tail of x in "
           "L2 (dynamic_l2_keep_bytes), which the sweep of L2 hints found faster than none",
    runner_up="at most 8 programs per SM with 16 warps, about as fast as the chosen grid",
    date="2026-11-30", results="kernels-sweep.json: ops.quantize_fp8_dynamic, quantize_fp8_dynamic_l2_hints")


def launch_grid(n: int, launch: QuantizeLaunch = LAUNCH, elements_per_iteration: int | None = None,
                max_programs: int | None = None) -> tuple[int, int]:
    """(programs, iterations per program) covering n elements, with the chunks spread evenly over the programs."""
    block = elements_per_iteration or launch.elements_per_iteration
    chunks = max(-(-n // block), 1)
    iterations = -(-chunks // (max_programs or launch.max_programs))
    # as many programs as keep every program's last iteration busy (e.g. 3456 chunks: 864 x 4, not 1024 x 4)
    programs = -(-chunks // iterations)
    return programs, iterations


def dynamic_launch(n: int, device: torch.device, element_size: int, launch: QuantizeLaunch = LAUNCH) -> dict:
    """The dynamic quantiser's grid and settings for n elements of element_size bytes on device."""
    block = min(launch.dynamic_elements_per_iteration or launch.elements_per_iteration, MAX_ELEMENTS_PER_ITERATION)
    max_programs = launch.max_programs
    if launch.dynamic_programs_per_sm:
        max_programs = min(launch.max_programs, launch.dynamic_programs_per_sm * _sm_count(device))
    programs, iterations = launch_grid(n, launch, block, max_programs)
    keep_iterations = -(-launch.dynamic_l2_keep_bytes // (programs * block * element_size))
    return {"programs": programs, "iterations": iterations, "block": block,
            "num_warps": launch.dynamic_num_warps or launch.num_warps, "hints": launch.dynamic_l2_keep_bytes > 0,
            "keep_from": max(iterations - keep_iterations, 0)}


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    """The device's SM count; 1 off CUDA, so the interpreter runs few programs."""
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


# ---------------------------------------------------------------------------------------------------------------
# eager references: the exact math the kernels must reproduce byte for byte
# ---------------------------------------------------------------------------------------------------------------

def dynamic_scale_reference(x: torch.Tensor) -> torch.Tensor:
    """fp32 0-dim scale = max(absmax, 1e-12) / 448, IEEE division.

    The divisor is a tensor on purpose: torch's CUDA division by a Python scalar multiplies by the rounded
    reciprocal, which differs from true division for some absmax values (seen on an H200, torch 2.11).
    """
    absmax = x.detach().abs().amax().float().clamp_min(ABSMAX_FLOOR)
    return absmax / torch.full((), E4M3_MAX, device=absmax.device, dtype=torch.float32)


def quantize_fp8_dynamic_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = dynamic_scale_reference(x)
    codes = (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(FP8_DTYPE)
    return codes, scale


def quantize_fp8_comfy_reference(x: torch.Tensor, scale_input: torch.Tensor | None = None,
                                 clamp_input_in_place: bool = True) -> torch.Tensor:
    """What ComfyUI's fp8_linear does to its input, element for element (including the in-place clamp)."""
    if scale_input is None:
        if clamp_input_in_place:
            clamped = torch.clamp(x, min=-E4M3_MAX, max=E4M3_MAX, out=x)
        else:
            clamped = torch.clamp(x, min=-E4M3_MAX, max=E4M3_MAX)
        return clamped.to(FP8_DTYPE)
    return (x * (1.0 / scale_input.to(x.device)).to(x.dtype)).to(FP8_DTYPE)


# ---------------------------------------------------------------------------------------------------------------
# public entry points (dispatching)
# ---------------------------------------------------------------------------------------------------------------

_fp8_choices = STATE.fp8_choices      # the same dict (scripts clear it by this name)


def fp8_choice(op: str, x: torch.Tensor) -> dispatch.Choice:
    """dispatch.choose for an FP8 op, remembered per (op, device, backend environment).

    dispatch.choose re-reads the environment and the device capability on every call; what it decides can only
    change with the device or those two variables, so they are the key. The log line still comes out once per
    reason (say_once), also after a test clears dispatch's memory of what it said.
    """
    key = (op, x.device, os.environ.get("FUSED_DIT_BACKEND"), os.environ.get("TRITON_INTERPRET"))
    choice = _fp8_choices.get(key)
    if choice is None:
        choice = _fp8_choices[key] = dispatch.choose(op, x, min_capability=FP8_MIN_CAPABILITY)
    else:
        dispatch.say_once(op, choice.backend, choice.reason)
    return choice


def quantize_fp8_dynamic(x: torch.Tensor, launch: QuantizeLaunch = LAUNCH) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes float8_e4m3fn with x's shape, contiguous; scale fp32 0-dim on x's device).

    Under torch.compile: one custom op (`torch.ops.fused_dit.quantize_fp8_dynamic`, the default launch setting).
    """
    if compiling() and launch is LAUNCH:
        return _QUANTIZE_DYNAMIC(x)
    if not fp8_choice("quantize_fp8_dynamic", x).triton:
        return quantize_fp8_dynamic_reference(x)
    return quantize_dynamic_triton(x, launch=launch)


def quantize_fp8_comfy(x: torch.Tensor, scale_input: torch.Tensor | None = None,
                       clamp_input_in_place: bool = True, launch: QuantizeLaunch = LAUNCH) -> torch.Tensor:
    """ComfyUI fp8_linear's input quantisation; codes with x's shape.

    Under torch.compile: one custom op (`quantize_fp8_comfy`, or `quantize_fp8_comfy_clamping`, which mutates x,
    where the unit scale clamps x in place).
    """
    if compiling() and launch is LAUNCH:
        if clamp_input_in_place and scale_input is None:
            return _QUANTIZE_COMFY_CLAMPING(x)
        return _QUANTIZE_COMFY(x, scale_input)
    if not fp8_choice("quantize_fp8_comfy", x).triton:
        return quantize_fp8_comfy_reference(x, scale_input, clamp_input_in_place)
    return quantize_comfy_triton(x, scale_input, clamp_input_in_place, launch=launch)


# the ops' codes are contiguous, as the kernels allocate them and as the fakes say; the eager references follow
# x's layout instead, and a fake that disagrees with the real strides breaks a compiled graph
def _quantize_dynamic_op(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    codes, scale = quantize_fp8_dynamic(x)
    return codes.contiguous(), scale


def _quantize_dynamic_fake(x):
    return x.new_empty(x.shape, dtype=FP8_DTYPE), x.new_empty((), dtype=torch.float32)


def _quantize_comfy_op(x: torch.Tensor, scale_input: torch.Tensor | None) -> torch.Tensor:
    return quantize_fp8_comfy(x, scale_input, clamp_input_in_place=False).contiguous()


def _quantize_comfy_fake(x, scale_input):
    return x.new_empty(x.shape, dtype=FP8_DTYPE)


def _quantize_comfy_clamping_op(x: torch.Tensor) -> torch.Tensor:
    return quantize_fp8_comfy(x, None, clamp_input_in_place=True).contiguous()


def _quantize_comfy_clamping_fake(x):
    return x.new_empty(x.shape, dtype=FP8_DTYPE)


_QUANTIZE_DYNAMIC = register("quantize_fp8_dynamic", _quantize_dynamic_op, _quantize_dynamic_fake)
_QUANTIZE_COMFY = register("quantize_fp8_comfy", _quantize_comfy_op, _quantize_comfy_fake)
_QUANTIZE_COMFY_CLAMPING = register("quantize_fp8_comfy_clamping", _quantize_comfy_clamping_op,
                                    _quantize_comfy_clamping_fake, mutates_args=("x",))


# ---------------------------------------------------------------------------------------------------------------
# Triton kernels and launchers. Tests call the launchers directly under TRITON_INTERPRET=1; `out_fp32=True` stores
# the value the kernel would cast, so the math is checked exactly even where the interpreter's fp8 cast deviates.
# ---------------------------------------------------------------------------------------------------------------

try:
    import triton
    import triton.language as tl
except Exception:  # dispatch.triton_import_error() reports the reason; eager references still work
    triton = None

if triton is not None:
    @triton.jit
    def chunk_offsets(i, iterations, BLOCK: tl.constexpr, REVERSED: tl.constexpr):
        """Element offsets of this program's i-th chunk (grid-stride: neighbouring programs, neighbouring chunks).

        REVERSED walks the chunks last to first: the quantise pass then starts on the chunks the absmax pass read
        last, the likeliest to still be in L2.
        """
        if REVERSED:
            row = iterations - 1 - i
        else:
            row = i
        return (row * tl.num_programs(0) + tl.program_id(0)) * BLOCK + tl.arange(0, BLOCK)

    @triton.jit
    def store_partial_absmax(stats_ptr, running_max):
        """Slot 1 + program id of the stats buffer: this program's max |x| (slot 0 is the scale)."""
        tl.store(stats_ptr + 1 + tl.program_id(0), tl.max(running_max, axis=0))

    @triton.jit
    def scale_from_partials(stats_ptr, floor, fmax, MAX_PARTIALS: tl.constexpr):
        """Every program reduces all partial maxima itself (no grid-wide sync); program 0 publishes the scale."""
        slots = tl.arange(0, MAX_PARTIALS)
        partials = tl.load(stats_ptr + 1 + slots, mask=slots < tl.num_programs(0), other=0.0)
        scale = tl.div_rn(tl.maximum(tl.max(partials, axis=0), floor), fmax)
        if tl.program_id(0) == 0:
            tl.store(stats_ptr, scale)
        return scale

    @triton.jit
    def _absmax_kernel(x_ptr, stats_ptr, n, iterations, keep_from, BLOCK: tl.constexpr, HINTS: tl.constexpr):
        """Partial max |x| per program; with HINTS, chunks from iteration keep_from on are kept in L2 (evict_last)
        for the quantise pass and the earlier ones are let go first."""
        running_max = tl.zeros([BLOCK], dtype=tl.float32)
        for i in range(keep_from):
            offs = chunk_offsets(i, iterations, BLOCK, False)
            x = tl.load(x_ptr + offs, mask=offs < n, other=0.0,
                        eviction_policy="evict_first" if HINTS else "").to(tl.float32)
            running_max = tl.maximum(running_max, tl.abs(x))
        for i in range(keep_from, iterations):
            offs = chunk_offsets(i, iterations, BLOCK, False)
            x = tl.load(x_ptr + offs, mask=offs < n, other=0.0,
                        eviction_policy="evict_last" if HINTS else "").to(tl.float32)
            running_max = tl.maximum(running_max, tl.abs(x))
        store_partial_absmax(stats_ptr, running_max)

    @triton.jit
    def store_scaled_codes(out_ptr, offs, mask, x, scale, fmax, OUT_FP8: tl.constexpr):
        """clamp(x / scale) as e4m3 bits (or the fp32 value the cast would take, OUT_FP8 off) at out_ptr + offs."""
        q = tl.minimum(tl.maximum(tl.div_rn(x, scale), -fmax), fmax)
        if OUT_FP8:
            tl.store(out_ptr + offs, q.to(tl.float8e4nv).to(tl.uint8, bitcast=True), mask=mask)
        else:
            tl.store(out_ptr + offs, q, mask=mask)

    @triton.jit
    def _quantize_dynamic_kernel(x_ptr, out_ptr, stats_ptr, n, iterations, floor, fmax,
                                 OUT_FP8: tl.constexpr, BLOCK: tl.constexpr, MAX_PARTIALS: tl.constexpr,
                                 HINTS: tl.constexpr):
        scale = scale_from_partials(stats_ptr, floor, fmax, MAX_PARTIALS)
        for i in range(iterations):
            offs = chunk_offsets(i, iterations, BLOCK, True)
            mask = offs < n
            # x is read for the last time here: with HINTS its lines leave L2 first
            x = tl.load(x_ptr + offs, mask=mask, other=0.0,
                        eviction_policy="evict_first" if HINTS else "").to(tl.float32)
            store_scaled_codes(out_ptr, offs, mask, x, scale, fmax, OUT_FP8)

    @triton.jit
    def _quantize_comfy_kernel(x_ptr, out_ptr, reciprocal_ptr, n, iterations, fmax,
                               HAS_SCALE: tl.constexpr, WRITE_BACK: tl.constexpr, SATURATE: tl.constexpr,
                               OUT_FP8: tl.constexpr, BLOCK: tl.constexpr):
        for i in range(iterations):
            offs = chunk_offsets(i, iterations, BLOCK, False)
            mask = offs < n
            x = tl.load(x_ptr + offs, mask=mask, other=0.0)
            xf = x.to(tl.float32)
            if HAS_SCALE:
                reciprocal = tl.load(reciprocal_ptr).to(tl.float32)
                # eager multiplies in x's dtype: the product is rounded to it before the fp8 cast
                v = (xf * reciprocal).to(x.dtype).to(tl.float32)
            else:
                v = tl.minimum(tl.maximum(xf, -fmax), fmax)
                if WRITE_BACK:
                    tl.store(x_ptr + offs, v.to(x.dtype), mask=mask & (tl.abs(xf) > fmax))
            if OUT_FP8:
                bits = v.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
                if not SATURATE:
                    # torch releases that do not saturate give NaN above 464 (the tie between 448 and 480)
                    nan_bits = tl.where(v < 0, 0xFF, 0x7F).to(tl.uint8)
                    bits = tl.where(tl.abs(v) > 464.0, nan_bits, bits)
                tl.store(out_ptr + offs, bits, mask=mask)
            else:
                tl.store(out_ptr + offs, v, mask=mask)


@functools.lru_cache(maxsize=None)
def torch_fp8_cast_saturates(device: str) -> bool:
    """Whether this torch casts 500.0 to 448 (saturating) rather than NaN; asked once per device."""
    probe = torch.tensor([500.0], device=device).to(FP8_DTYPE).view(torch.uint8)
    return int(probe.item()) == 0x7E


_saturates_by_device: dict[torch.device, bool] = {}


def _cast_saturates(device: torch.device) -> bool:
    """torch_fp8_cast_saturates for a device object, without formatting the device as a string on every call."""
    saturates = _saturates_by_device.get(device)
    if saturates is None:
        saturates = _saturates_by_device[device] = device.type != "cuda" or torch_fp8_cast_saturates(str(device))
    return saturates


def new_output(like: torch.Tensor, out_fp32: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(tensor handed back, shaped like `like`; tensor the kernel writes): fp8 codes go through a uint8 view."""
    if out_fp32:
        out = torch.empty(like.shape, device=like.device, dtype=torch.float32)
        return out, out
    out = torch.empty(like.shape, device=like.device, dtype=FP8_DTYPE)
    return out, out.view(torch.uint8)


def new_stats(programs: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(stats buffer: slot 0 the scale, slots 1.. the partial maxima; the scale as a 0-dim view of slot 0).

    Every slot is written by the kernels, so nothing is filled; one allocation serves both.
    """
    stats = torch.empty(programs + 1, device=device, dtype=torch.float32)
    return stats, stats[0]


def kernel_input(x: torch.Tensor) -> torch.Tensor:
    """x as the kernels read it: its own storage when contiguous (the kernels index it flat), else a copy."""
    if x.requires_grad:      # the interpreter hands tensors to numpy, which refuses ones that require grad
        x = x.detach()
    return x if x.is_contiguous() else x.contiguous()


# (n, device, element size, the launch setting) -> (grid, iterations, keep_from, block, hints, num_warps,
# MAX_PARTIALS) of the dynamic quantiser. dynamic_launch builds a dict and next_power_of_2 loops in Python: a few
# microseconds per FP8 linear call, for values that depend only on the key. Few distinct sizes occur in a run (one
# per Linear input shape); the cap only guards against unbounded growth.
_dynamic_launches: dict[tuple, tuple] = {}
_LAUNCH_CACHE_CAP = 4096


def _dynamic_launch_cached(n: int, device: torch.device, element_size: int, launch: QuantizeLaunch = LAUNCH) -> tuple:
    # the default setting is left out of the key: hashing the frozen dataclass costs a microsecond per call
    key = (n, device, element_size) if launch is LAUNCH else (n, device, element_size, launch)
    cached = _dynamic_launches.get(key)
    if cached is None:
        grid = dynamic_launch(n, device, element_size, launch)
        cached = ((grid["programs"],), grid["iterations"], grid["keep_from"], grid["block"], grid["hints"],
                  grid["num_warps"], triton.next_power_of_2(grid["programs"]))
        if len(_dynamic_launches) >= _LAUNCH_CACHE_CAP:
            _dynamic_launches.clear()
        _dynamic_launches[key] = cached
    return cached


_gemm_stats: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
    lambda index: torch.cuda.current_stream(index).cuda_stream)


def gemm_stats(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(stats buffer for any grid of the default launch setting, its slot 0 as the 0-dim scale) for the FP8 GEMM
    path on the current stream of `device`: allocated once per (device, stream) instead of per call.

    The scale a quantiser leaves in slot 0 is read only by the torch._scaled_mm queued right after it on the same
    stream, and the next quantisation on that stream runs after that GEMM, so one buffer per stream serves every
    call without a race; it saves an allocation and a select per FP8 Linear call. The public quantisers keep
    returning a fresh scale (their callers may keep it).
    """
    stream = _raw_stream(device.index) if device.type == "cuda" else None
    key = (device, stream)
    scratch = _gemm_stats.get(key)
    if scratch is None:
        scratch = _gemm_stats[key] = new_stats(LAUNCH.max_programs, device)
    return scratch


def quantize_dynamic_triton(x: torch.Tensor, out_fp32: bool = False, launch: QuantizeLaunch = LAUNCH,
                            scratch: tuple[torch.Tensor, torch.Tensor] | None = None
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Op 5's dynamic kernels. scratch: a (stats, scale) pair from gemm_stats (default launch only) to reuse
    instead of a fresh stats buffer; the returned scale is then that pair's scale."""
    n = x.numel()
    if n > MAX_KERNEL_ELEMENTS:
        codes, scale = quantize_fp8_dynamic_reference(x)
        return (codes.float() if out_fp32 else codes), scale
    source = kernel_input(x)
    device = x.device
    grid_setting = _dynamic_launch_cached(n, device, x.element_size(), launch)
    grid, iterations, keep_from, block, hints, num_warps, max_partials = grid_setting
    out, written = new_output(source, out_fp32)
    if scratch is None or launch is not LAUNCH:
        stats = torch.empty(grid[0] + 1, device=device, dtype=torch.float32)
        scale = None
    else:
        stats, scale = scratch
    # what the two launches specialise on: source's dtype and alignment, n and the grid derived from it (every
    # other int argument and constexpr); out and stats are fresh allocations, always aligned. See fused_dit.launch
    key = (source.dtype, source.data_ptr() % 16 == 0, n, out_fp32, grid_setting)
    run_kernel(_absmax_kernel, grid, key, source, stats, n, iterations, keep_from, block, hints, num_warps=num_warps)
    run_kernel(_quantize_dynamic_kernel, grid, key, source, written, stats, n, iterations, ABSMAX_FLOOR, E4M3_MAX,
               not out_fp32, block, max_partials, hints, num_warps=num_warps)
    # slot 0 of the stats buffer: the scale (see new_stats)
    return out, (stats[0] if scale is None else scale)


def comfy_reciprocal(scale_input: torch.Tensor | None, source: torch.Tensor) -> torch.Tensor:
    """The kernels' reciprocal operand: the same two torch ops ComfyUI runs (the reciprocal in fp32, rounded to the
    input's dtype); without a scale, `source` itself as a placeholder the kernel never reads (HAS_SCALE is off)."""
    if scale_input is None:
        return source
    return (1.0 / scale_input.to(source.device)).to(source.dtype).reshape(1)


def quantize_comfy_triton(x: torch.Tensor, scale_input: torch.Tensor | None = None,
                          clamp_input_in_place: bool = True, out_fp32: bool = False,
                          launch: QuantizeLaunch = LAUNCH) -> torch.Tensor:
    write_back = clamp_input_in_place and scale_input is None
    n = x.numel()
    if (write_back and not x.is_contiguous()) or n > MAX_KERNEL_ELEMENTS:
        # the in-place clamp must write into x itself; a strided x takes the eager reference
        codes = quantize_fp8_comfy_reference(x, scale_input, clamp_input_in_place)
        return codes.float() if out_fp32 else codes
    source = kernel_input(x)
    out, written = new_output(x, out_fp32)
    reciprocal = comfy_reciprocal(scale_input, source)
    saturate = _cast_saturates(x.device)
    if n:
        programs, iterations = launch_grid(n, launch)
        _quantize_comfy_kernel[(programs,)](
            source, written, reciprocal, n, iterations, E4M3_MAX,
            HAS_SCALE=scale_input is not None, WRITE_BACK=write_back, SATURATE=saturate,
            OUT_FP8=not out_fp32, BLOCK=launch.elements_per_iteration, num_warps=launch.num_warps)
    return out
