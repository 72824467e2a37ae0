"""Op 5: quantise activations to float8 e4m3 (e4m3fn, max 448), two flavours.

Dynamic per-tensor (what the overlay's own FP8 linears use for bf16/fp16 weights):
    scale = max(absmax(x), 1e-12) / 448          (fp32, IEEE division)
    codes = (x.float() / scale).clamp(-448, 448).to(float8_e4m3fn)
The scale never leaves the GPU: one kernel reduces |x| with atomic_max into a one-element fp32 buffer, the second
kernel reads it, derives the scale, quantises, and stores the scale for torch._scaled_mm. No host sync.

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

import torch

from .. import dispatch

E4M3_MAX = 448.0
FP8_DTYPE = torch.float8_e4m3fn
# the smallest absmax that still gives a finite scale; an all-zero tensor quantises to zero codes
ABSMAX_FLOOR = 1e-12
# FP8 kernels need Ada (sm_89) or Hopper (sm_90) for the hardware e4m3 conversion
FP8_MIN_CAPABILITY = (8, 9)
_BLOCK = 2048


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

def quantize_fp8_dynamic(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes float8_e4m3fn with x's shape, contiguous; scale fp32 0-dim on x's device)."""
    choice = dispatch.choose("quantize_fp8_dynamic", x, min_capability=FP8_MIN_CAPABILITY)
    if not choice.triton:
        return quantize_fp8_dynamic_reference(x)
    return quantize_dynamic_triton(x)


def quantize_fp8_comfy(x: torch.Tensor, scale_input: torch.Tensor | None = None,
                       clamp_input_in_place: bool = True) -> torch.Tensor:
    """ComfyUI fp8_linear's input quantisation; codes with x's shape."""
    choice = dispatch.choose("quantize_fp8_comfy", x, min_capability=FP8_MIN_CAPABILITY)
    if not choice.triton:
        return quantize_fp8_comfy_reference(x, scale_input, clamp_input_in_place)
    return quantize_comfy_triton(x, scale_input, clamp_input_in_place)


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
    def _absmax_kernel(x_ptr, absmax_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
        tl.atomic_max(absmax_ptr, tl.max(tl.abs(x), axis=0))

    @triton.jit
    def _quantize_dynamic_kernel(x_ptr, out_ptr, absmax_ptr, scale_ptr, n, floor, fmax,
                                 OUT_FP8: tl.constexpr, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        scale = tl.div_rn(tl.maximum(tl.load(absmax_ptr), floor), fmax)
        if pid == 0:
            tl.store(scale_ptr, scale)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        q = tl.minimum(tl.maximum(tl.div_rn(x, scale), -fmax), fmax)
        if OUT_FP8:
            tl.store(out_ptr + offs, q.to(tl.float8e4nv).to(tl.uint8, bitcast=True), mask=mask)
        else:
            tl.store(out_ptr + offs, q, mask=mask)

    @triton.jit
    def _quantize_comfy_kernel(x_ptr, out_ptr, reciprocal_ptr, n, fmax,
                               HAS_SCALE: tl.constexpr, WRITE_BACK: tl.constexpr, SATURATE: tl.constexpr,
                               OUT_FP8: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
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


def _new_output(n: int, like: torch.Tensor, out_fp32: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(tensor handed back, tensor the kernel writes): fp8 codes are written through a uint8 view."""
    if out_fp32:
        out = torch.empty(n, device=like.device, dtype=torch.float32)
        return out, out
    out = torch.empty(n, device=like.device, dtype=FP8_DTYPE)
    return out, out.view(torch.uint8)


def quantize_dynamic_triton(x: torch.Tensor, out_fp32: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    flat = x.detach().contiguous().view(-1)
    n = flat.numel()
    absmax = torch.zeros(1, device=x.device, dtype=torch.float32)
    scale = torch.empty((), device=x.device, dtype=torch.float32)
    out, written = _new_output(n, x, out_fp32)
    blocks = max(triton.cdiv(n, _BLOCK), 1)
    _absmax_kernel[(blocks,)](flat, absmax, n, BLOCK=_BLOCK)
    _quantize_dynamic_kernel[(blocks,)](flat, written, absmax, scale, n, ABSMAX_FLOOR, E4M3_MAX,
                                        OUT_FP8=not out_fp32, BLOCK=_BLOCK)
    return out.view(x.shape), scale


def quantize_comfy_triton(x: torch.Tensor, scale_input: torch.Tensor | None = None,
                          clamp_input_in_place: bool = True, out_fp32: bool = False) -> torch.Tensor:
    write_back = clamp_input_in_place and scale_input is None
    if write_back and not x.is_contiguous():
        # the in-place clamp must write into x itself; a strided x takes the eager reference
        return quantize_fp8_comfy_reference(x, scale_input, clamp_input_in_place)
    flat = x.detach().contiguous().view(-1)
    n = flat.numel()
    out, written = _new_output(n, x, out_fp32)
    if scale_input is None:
        reciprocal = torch.ones(1, device=x.device, dtype=x.dtype)   # not read by the kernel
    else:
        # the same two torch ops ComfyUI runs: the reciprocal in fp32, rounded to x's dtype
        reciprocal = (1.0 / scale_input.to(x.device)).to(x.dtype).reshape(1)
    saturate = x.device.type != "cuda" or torch_fp8_cast_saturates(str(x.device))
    if n:
        _quantize_comfy_kernel[(triton.cdiv(n, _BLOCK),)](
            flat, written, reciprocal, n, E4M3_MAX,
            HAS_SCALE=scale_input is not None, WRITE_BACK=write_back, SATURATE=saturate,
            OUT_FP8=not out_fp32, BLOCK=_BLOCK)
    return out.view(x.shape)
