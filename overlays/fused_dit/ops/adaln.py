"""AdaLN modulation, fused: `torch.addcmul(shift, LayerNorm(x), 1 + scale)` in one pass over x.

Rounding points follow ComfyUI's eager chain: LayerNorm (no affine) rounds to x's dtype, `1 + scale` rounds to
scale's dtype, and addcmul rounds once to the promoted dtype. Modulation rows broadcast per sample (`[B|1, 1, C]`),
per token (`[B, L, C]`) or per group of tokens as Wan's `repeat_e` expands them (row = token // group).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..dispatch import choose
from . import (KERNEL_DTYPES, as_batch_rows_channels, batch_stride, check_out, eager_because, into_out,
               modulation_group, repeat_rows_like_comfy)

try:
    import triton
    import triton.language as tl
except Exception:  # the eager path must keep working without triton; dispatch says why
    triton = None

ELEMENTS_PER_PROGRAM = 4096
NUM_WARPS_LARGE = 4         # rows of >= 4096 channels, one row per program
NUM_WARPS_SMALL = 4


def _modulation_rows(x, shift, scale):
    B, _, C = x.shape
    return (as_batch_rows_channels(shift, B, C, "shift"), as_batch_rows_channels(scale, B, C, "scale"))


def reference_comfy(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Tier 2: the eager chain of ComfyUI's Flux/Wan blocks (LayerNorm without affine, repeat_e, addcmul)."""
    shift, scale = _modulation_rows(x, shift, scale)
    tokens = x.size(1)
    normed = F.layer_norm(x, (x.size(-1),), eps=eps)
    return torch.addcmul(repeat_rows_like_comfy(shift, tokens), normed, 1 + repeat_rows_like_comfy(scale, tokens))


def reference_fp32(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Tier 1: the same math in fp64 without intermediate rounding, returned in the promoted dtype."""
    shift, scale = _modulation_rows(x, shift, scale)
    tokens = x.size(1)
    x64 = x.double()
    mean = x64.mean(dim=-1, keepdim=True)
    normed = (x64 - mean) * torch.rsqrt((x64 - mean).square().mean(dim=-1, keepdim=True) + eps)
    out = repeat_rows_like_comfy(shift, tokens).double() + normed * (1 + repeat_rows_like_comfy(scale, tokens).double())
    return out.to(torch.promote_types(torch.promote_types(x.dtype, shift.dtype), scale.dtype))


if triton is not None:

    @triton.jit
    def _adaln_kernel(x_ptr, shift_ptr, scale_ptr, out_ptr, rows, L, C, shift_group, scale_group,
                      sxb, sxl, sxc, shb, shr, shc, scb, scr, scc, eps,
                      ROWS: tl.constexpr, BLOCK_C: tl.constexpr):
        r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        row_mask = r < rows
        l_idx = r % L
        b = r // L
        c = tl.arange(0, BLOCK_C)
        c_mask = c < C
        mask = row_mask[:, None] & c_mask[None, :]
        x = tl.load(x_ptr + b[:, None] * sxb + l_idx[:, None] * sxl + c[None, :] * sxc,
                    mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=1) / C
        centred = tl.where(mask, x - mean[:, None], 0.0)
        rstd = tl.rsqrt(tl.sum(centred * centred, axis=1) / C + eps)
        # LayerNorm's output is a tensor of x's dtype in the eager chain
        normed = (centred * rstd[:, None]).to(x_ptr.dtype.element_ty).to(tl.float32)
        shift_offsets = b[:, None] * shb + (l_idx // shift_group)[:, None] * shr + c[None, :] * shc
        scale_offsets = b[:, None] * scb + (l_idx // scale_group)[:, None] * scr + c[None, :] * scc
        shift = tl.load(shift_ptr + shift_offsets, mask=mask, other=0.0).to(tl.float32)
        scale = tl.load(scale_ptr + scale_offsets, mask=mask, other=0.0).to(tl.float32)
        # `1 + scale` is a tensor of scale's dtype in the eager chain
        scale_plus_one = (scale + 1.0).to(scale_ptr.dtype.element_ty).to(tl.float32)
        out = shift + normed * scale_plus_one
        tl.store(out_ptr + r[:, None] * C + c[None, :], out.to(out_ptr.dtype.element_ty), mask=mask)


def adaln(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float = 1e-6,
          out: torch.Tensor | None = None) -> torch.Tensor:
    """`addcmul(shift, LayerNorm(x), 1 + scale)` for x `[B, L, C]`; shift/scale `[B|1, rows, C]` or `[B, C]`.

    Returns a contiguous `[B, L, C]` tensor of the promoted dtype (x's dtype when the modulation shares it).
    """
    op = "adaln"
    if choose(op, x, shift, scale).triton:
        reason = None
        if x.dim() != 3:
            reason = f"x {tuple(x.shape)} is not [B, L, C]"
        elif not {x.dtype, shift.dtype, scale.dtype} <= set(KERNEL_DTYPES):
            reason = f"dtypes {x.dtype}/{shift.dtype}/{scale.dtype} not supported by the kernel"
        else:
            try:
                shift3, scale3 = _modulation_rows(x, shift, scale)
                groups = [modulation_group(m.size(1), x.size(1)) for m in (shift3, scale3)]
            except ValueError as exc:
                reason = str(exc)
        if reason is None:
            return _launch(x, shift3, scale3, groups, eps, out)
        eager_because(op, reason)
    return into_out(reference_comfy(x, shift, scale, eps), out)


def _launch(x, shift, scale, groups, eps, out):
    B, L, C = x.shape
    out_dtype = torch.promote_types(torch.promote_types(x.dtype, shift.dtype), scale.dtype)
    if out is None:
        out = torch.empty((B, L, C), dtype=out_dtype, device=x.device)
    else:
        check_out(out, (B, L, C), out_dtype, x.device)
    block_c = triton.next_power_of_2(C)
    rows_per_program = max(1, ELEMENTS_PER_PROGRAM // block_c)
    rows = B * L
    grid = (triton.cdiv(rows, rows_per_program),)
    _adaln_kernel[grid](
        x, shift, scale, out, rows, L, C, groups[0], groups[1], *x.stride(),
        batch_stride(shift), shift.stride(1), shift.stride(2), batch_stride(scale), scale.stride(1), scale.stride(2),
        eps, ROWS=rows_per_program, BLOCK_C=block_c,
        num_warps=NUM_WARPS_LARGE if block_c >= 4096 else NUM_WARPS_SMALL,
        enable_fp_fusion=False)  # addcmul rounds the product before the add: no fma contraction
    return out
