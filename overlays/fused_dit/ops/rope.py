"""Interleaved RoPE alone, in the place of comfy-kitchen's `apply_rope` / `apply_rope1` (ComfyUI 0.24 and later).

The math of ComfyUI's own eager chain and of comfy-kitchen's eager backend (`_apply_rope1`): x upcast to the
table's dtype (fp32), `out = f[..., 0] * x0`, then `out.addcmul_(f[..., 1], x1)` - one fma on CUDA - and one
rounding back to x's dtype. The kernel does exactly these steps, so on a GPU its bits are those of the eager chain;
comfy-kitchen's CUDA kernel (cu13 torch) is another implementation, measured against it separately.

x is `[A, B, C, D]` with a unit last stride (Flux's q, k `[B, H, L, D]`, Wan's `[B, L, H, D]`); the table
broadcasts over x's first three dims: `[A|1, B|1, C|1, D/2, 2, 2]`, longer along dim 2 than x allowed (trimmed as
comfy-kitchen trims it). Anything else runs `reference_comfy`. The output is contiguous, in x's dtype.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..dispatch import choose
from ..launch import launch_args
from ..library import compiling, register
from . import KERNEL_DTYPES, cdiv, eager_because, next_power_of_2

try:
    import triton
    import triton.language as tl
except Exception:  # the eager path must keep working without triton; dispatch says why
    triton = None

OP = "rope"


@dataclass(frozen=True)
class RopeLaunch:
    """Elements (pairs x rows) one program handles, and its warps."""
    pairs_per_program: int = 2048
    num_warps: int = 4


LAUNCH = RopeLaunch()


def trimmed(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """The table as comfy-kitchen's trim_rope_freqs (and ComfyUI's _apply_rope1) leaves it for x."""
    if x.ndim > 2 and freqs.ndim > 2 and x.shape[2] != 1 and freqs.shape[2] > x.shape[2]:
        return freqs[:, :, :x.shape[2]]
    return freqs


def reference_comfy(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """ComfyUI's eager apply_rope1 (and comfy-kitchen's eager backend): multiply, addcmul_, cast back."""
    freqs = trimmed(x, freqs)
    pairs = x.to(dtype=freqs.dtype).reshape(*x.shape[:-1], -1, 1, 2)
    out = freqs[..., 0] * pairs[..., 0]
    out.addcmul_(freqs[..., 1], pairs[..., 1])
    return out.reshape(*x.shape).type_as(x)


def reference_fp64(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    freqs = trimmed(x, freqs).double()
    pairs = x.double().reshape(*x.shape[:-1], -1, 1, 2)
    return (freqs[..., 0] * pairs[..., 0] + freqs[..., 1] * pairs[..., 1]).reshape(*x.shape).to(x.dtype)


if triton is not None:

    @triton.jit
    def _rope_kernel(x_ptr, f_ptr, out_ptr, rows, B, C, HALF, sx0, sx1, sx2, sf0, sf1, sf2, sfp, sfr, sfc,
                     ROWS: tl.constexpr, BLOCK_HALF: tl.constexpr):
        r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        i2 = r % C
        i1 = (r // C) % B
        i0 = r // (B * C)
        p = tl.arange(0, BLOCK_HALF)
        mask = (r < rows)[:, None] & (p < HALF)[None, :]
        x_at = x_ptr + (i0 * sx0 + i1 * sx1 + i2 * sx2)[:, None] + 2 * p[None, :]
        x0 = tl.load(x_at, mask=mask, other=0.0).to(tl.float32)
        x1 = tl.load(x_at + 1, mask=mask, other=0.0).to(tl.float32)
        f_at = f_ptr + (i0 * sf0 + i1 * sf1 + i2 * sf2)[:, None] + p[None, :] * sfp
        f00 = tl.load(f_at, mask=mask, other=0.0)
        f01 = tl.load(f_at + sfc, mask=mask, other=0.0)
        f10 = tl.load(f_at + sfr, mask=mask, other=0.0)
        f11 = tl.load(f_at + sfr + sfc, mask=mask, other=0.0)
        # `out = f0 * x0; out.addcmul_(f1, x1)`: the product rounded, then one fma as torch's CUDA addcmul
        out0 = tl.fma(f01, x1, f00 * x0)
        out1 = tl.fma(f11, x1, f10 * x0)
        o_at = out_ptr + r[:, None] * (2 * HALF) + 2 * p[None, :]
        tl.store(o_at, out0.to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(o_at + 1, out1.to(out_ptr.dtype.element_ty), mask=mask)


def _kernel_refusal(x: torch.Tensor, freqs: torch.Tensor) -> str | None:
    if x.dim() != 4 or x.dtype not in KERNEL_DTYPES or x.size(-1) % 2 or x.stride(-1) != 1:
        return f"x {tuple(x.shape)} {x.dtype} strides {x.stride()} is not a [A, B, C, D] tensor with unit last stride"
    if freqs.dtype != torch.float32 or freqs.dim() != 6 or tuple(freqs.shape[3:]) != (x.size(-1) // 2, 2, 2):
        return f"table {tuple(freqs.shape)} {freqs.dtype} is not fp32 [A|1, B|1, C|1, D/2, 2, 2]"
    if any(f not in (1, n) for f, n in zip(freqs.shape[:3], x.shape[:3])):
        return f"table {tuple(freqs.shape)} does not broadcast over x {tuple(x.shape)}"
    if freqs.device != x.device:
        return f"table on {freqs.device}, x on {x.device}"
    return None


def _launch(x: torch.Tensor, freqs: torch.Tensor, launch: RopeLaunch) -> torch.Tensor:
    A, B, C, D = x.shape
    out = torch.empty((A, B, C, D), dtype=x.dtype, device=x.device)
    half = D // 2
    block_half = next_power_of_2(half)
    rows_per_program = max(1, launch.pairs_per_program // block_half)
    rows = A * B * C
    strides = [0 if freqs.size(i) == 1 else freqs.stride(i) for i in range(3)]
    launch_args(_rope_kernel, (cdiv(rows, rows_per_program),),
                (x, freqs, out, rows, B, C, half, *x.stride()[:3], *strides, *freqs.stride()[3:]),
                {"ROWS": rows_per_program, "BLOCK_HALF": block_half},
                num_warps=launch.num_warps, enable_fp_fusion=False)  # only the fma eager has
    return out


def kernel_runs(x: torch.Tensor, freqs: torch.Tensor) -> bool:
    """Whether apply_rope1 would run the kernel for these tensors (the dispatcher's choice and the layout)."""
    if not choose(OP, x, freqs).triton:
        return False
    reason = _kernel_refusal(x, trimmed(x, freqs))
    if reason:
        eager_because(OP, reason)
    return reason is None


def apply_rope1(x: torch.Tensor, freqs: torch.Tensor, fallback=reference_comfy,
                launch: RopeLaunch = LAUNCH) -> torch.Tensor:
    """Interleaved RoPE of x by the table `freqs` (see the module docstring); `fallback(x, freqs)` where the kernel
    cannot run (the op seam passes the function it replaced). Under torch.compile: one custom op
    (`torch.ops.fused_dit.rope`)."""
    if compiling() and launch is LAUNCH:
        return _ROPE(x, freqs)
    if kernel_runs(x, freqs):
        return _launch(x, trimmed(x, freqs), launch)
    return fallback(x, freqs)


def apply_rope(xq: torch.Tensor, xk: torch.Tensor, freqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return apply_rope1(xq, freqs), apply_rope1(xk, freqs)


def _rope_op(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    return apply_rope1(x, freqs).contiguous()


def _rope_fake(x, freqs):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


_ROPE = register("rope", _rope_op, _rope_fake)
