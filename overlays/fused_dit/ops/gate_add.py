"""The gated residual add, fused: Wan's `addcmul(x, y, gate)` and Flux's `x + gate * y`, one launch each.

They differ only in rounding: addcmul rounds once; `x + gate * y` rounds the product to its dtype and then the
sum, and the kernel keeps both roundings so bf16 results match the eager chain bit for bit in the common case.
The gate is `[B|1, rows, C]` (per sample, per token, or grouped rows as Wan's repeat_e expands them).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..dispatch import choose
from ..launch import launch_args
from ..library import compiling, register
from . import (KERNEL_DTYPES, TuningRecord, as_batch_rows_channels, batch_stride, cdiv, check_out, eager_because,
               into_out, modulation_group, next_power_of_2, repeat_rows_like_comfy)

try:
    import triton
    import triton.language as tl
except Exception:  # the eager path must keep working without triton; dispatch says why
    triton = None



@dataclass(frozen=True)
class GateAddLaunch:
    """The kernel's launch setting: a program covers about elements_per_program elements, channel blocks of at
    most max_block_c. Pass another to `gate_add` to sweep one."""
    elements_per_program: int = 2048
    max_block_c: int = 1024
    num_warps: int = 8


LAUNCH = GateAddLaunch()
TUNING = TuningRecord(
    chosen="2048 elements per program, channel blocks of <= 1024, 8 warps (one setting for every length: the "
           "sweep found none clearly faster)",
    runner_up="4096 elements x 2 or 8 warps (L=4096); 1024 elements x 4 warps (L=16384)",
    date="2026-11-30", results="kernels-sweep.json: ops.gate_add_wan")

WAN = "addcmul"        # torch.addcmul(x, y, gate)
FLUX = "mul_then_add"  # x + gate * y (or x += gate * y)


def reference_comfy(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor, rounding: str = WAN,
                    inplace: bool = False) -> torch.Tensor:
    """Tier 2: the eager expression ComfyUI runs for `rounding` (WAN or FLUX); `inplace` is Flux's `x += ...`."""
    gate = repeat_rows_like_comfy(as_batch_rows_channels(gate, x.size(0), x.size(-1), "gate"), x.size(1))
    if rounding == WAN:
        return torch.addcmul(x, y, gate)
    if rounding != FLUX:
        raise ValueError(f"rounding must be {WAN!r} or {FLUX!r}, got {rounding!r}")
    return x.add_(gate * y) if inplace else x + gate * y


def reference_fp32(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor, rounding: str = WAN) -> torch.Tensor:
    """Tier 1: x + gate * y in fp64, rounded once to the dtype the eager expression returns."""
    gate = repeat_rows_like_comfy(as_batch_rows_channels(gate, x.size(0), x.size(-1), "gate"), x.size(1))
    return (x.double() + gate.double() * y.double()).to(_out_dtype(x, y, gate))


def _out_dtype(x, y, gate) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.promote_types(y.dtype, gate.dtype))


if triton is not None:
    _TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}

    @triton.jit
    def _gate_add_kernel(x_ptr, y_ptr, gate_ptr, out_ptr, rows, L, C, group,
                         sxb, sxl, sxc, syb, syl, syc, sgb, sgr, sgc, sob, sol, soc,
                         ROWS: tl.constexpr, BLOCK_C: tl.constexpr,
                         ROUND_PRODUCT: tl.constexpr, PRODUCT_DTYPE: tl.constexpr):
        r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        row_mask = r < rows
        l_idx = r % L
        b = r // L
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        mask = row_mask[:, None] & (c < C)[None, :]
        x = tl.load(x_ptr + b[:, None] * sxb + l_idx[:, None] * sxl + c[None, :] * sxc, mask=mask, other=0.0)
        y = tl.load(y_ptr + b[:, None] * syb + l_idx[:, None] * syl + c[None, :] * syc, mask=mask, other=0.0)
        gate = tl.load(gate_ptr + b[:, None] * sgb + (l_idx // group)[:, None] * sgr + c[None, :] * sgc,
                       mask=mask, other=0.0)
        if ROUND_PRODUCT:
            # `gate * y` is a tensor of its own in the eager chain
            product = (gate.to(tl.float32) * y.to(tl.float32)).to(PRODUCT_DTYPE).to(tl.float32)
            out = x.to(tl.float32) + product
        else:
            # torch's CUDA addcmul computes `a + b * c` as one fma (nvcc contracts it); for 16-bit operands the
            # product is exact in fp32 so it makes no difference, for fp32 it does
            out = tl.fma(gate.to(tl.float32), y.to(tl.float32), x.to(tl.float32))
        tl.store(out_ptr + b[:, None] * sob + l_idx[:, None] * sol + c[None, :] * soc,
                 out.to(out_ptr.dtype.element_ty), mask=mask)


def gate_add(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor, rounding: str = WAN,
             inplace: bool = False, out: torch.Tensor | None = None, launch: GateAddLaunch = LAUNCH) -> torch.Tensor:
    """x + gate * y for x, y `[B, L, C]` and gate `[B|1, rows, C]` or `[B, C]`.

    rounding=WAN is `torch.addcmul(x, y, gate)`; rounding=FLUX is `x + gate * y`, and with inplace=True
    `x += gate * y` (x is written and returned, keeping its dtype). Under torch.compile: one custom op
    (`torch.ops.fused_dit.gate_add`, or `gate_add_inplace` that mutates x; the default launch setting).
    """
    if rounding not in (WAN, FLUX):
        raise ValueError(f"rounding must be {WAN!r} or {FLUX!r}, got {rounding!r}")
    if inplace and rounding != FLUX:
        raise ValueError("inplace is Flux's `x += gate * y`; Wan's addcmul is out of place")
    if inplace and out is not None:
        raise ValueError("inplace writes x; out cannot be given too")
    if compiling() and launch is LAUNCH:
        if inplace:
            _GATE_ADD_INPLACE(x, y, gate)
            return x
        return into_out(_GATE_ADD(x, y, gate, rounding), out)
    op = f"gate_add_{'wan' if rounding == WAN else 'flux'}"
    if choose(op, x, y, gate).triton:
        reason = None
        if x.dim() != 3 or y.shape != x.shape:
            reason = f"x {tuple(x.shape)} and y {tuple(y.shape)} are not one [B, L, C] shape"
        elif not {x.dtype, y.dtype, gate.dtype} <= set(KERNEL_DTYPES):
            reason = f"dtypes {x.dtype}/{y.dtype}/{gate.dtype} not supported by the kernel"
        else:
            try:
                gate3 = as_batch_rows_channels(gate, x.size(0), x.size(-1), "gate")
                group = modulation_group(gate3.size(1), x.size(1))
            except ValueError as exc:
                reason = str(exc)
        if reason is None:
            return _launch(x, y, gate3, group, rounding, inplace, out, launch)
        eager_because(op, reason)
    return into_out(reference_comfy(x, y, gate, rounding, inplace), out)


def _gate_add_op(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor, rounding: str) -> torch.Tensor:
    # the op's output is contiguous, as the kernel allocates it and as the fake says; the eager fallback's addcmul
    # follows x's layout instead (ComfyUI's Wan x is `flatten(2).transpose(1, 2)` of the patch embedding), and a
    # fake that disagrees with the real strides breaks the compiled graph (a later `.view` fails)
    return gate_add(x, y, gate, rounding).contiguous()


def _gate_add_fake(x, y, gate, rounding):
    return torch.empty(x.shape, dtype=_out_dtype(x, y, gate), device=x.device)


def _gate_add_inplace_op(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor) -> None:
    gate_add(x, y, gate, FLUX, inplace=True)


def _gate_add_inplace_fake(x, y, gate):
    return None


_GATE_ADD = register("gate_add", _gate_add_op, _gate_add_fake)
_GATE_ADD_INPLACE = register("gate_add_inplace", _gate_add_inplace_op, _gate_add_inplace_fake, mutates_args=("x",))


def _launch(x, y, gate, group, rounding, inplace, out, launch: GateAddLaunch):
    B, L, C = x.shape
    product_dtype = torch.promote_types(y.dtype, gate.dtype)
    out_dtype = torch.promote_types(x.dtype, product_dtype)
    if inplace:
        out = x
    elif out is None:
        out = torch.empty((B, L, C), dtype=out_dtype, device=x.device)
    else:
        check_out(out, (B, L, C), out_dtype, x.device)
    block_c = min(next_power_of_2(C), launch.max_block_c)
    rows_per_program = max(1, launch.elements_per_program // block_c)
    rows = B * L
    grid = (cdiv(rows, rows_per_program), cdiv(C, block_c))
    launch_args(_gate_add_kernel, grid,
                (x, y, gate, out, rows, L, C, group, *x.stride(), *y.stride(), batch_stride(gate), gate.stride(1),
                 gate.stride(2), *out.stride()),
                {"ROWS": rows_per_program, "BLOCK_C": block_c, "ROUND_PRODUCT": rounding == FLUX,
                 "PRODUCT_DTYPE": _TL_DTYPES[product_dtype]},
                num_warps=launch.num_warps,
                enable_fp_fusion=False)  # only the fma eager has: Flux rounds the product before the add
    return out
