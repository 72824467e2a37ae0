"""Op 5, row-wise: float8 e4m3 codes with one fp32 scale per row, for torch._scaled_mm's row-wise scaling.

For a 2-D tensor [R, K], per row r:
    scale[r] = max(absmax(x[r, :]), 1e-12) / 448          (fp32, IEEE division)
    codes[r] = (x[r].float() / scale[r]).clamp(-448, 448).to(float8_e4m3fn)
the per-tensor dynamic quantiser's math (quantize_fp8.py), row by row.

Why: the per-tensor quantiser needs two launches per tensor (absmax, then quantise: the scale depends on all of x),
so an FP8 Linear whose weight is quantised for its call (DynamicVRAM's per-call codes) costs five launches: two for
the weight, two for the activation, the GEMM. Here one program owns one row: it reads the row, reduces its
absmax, and writes its codes and scale in the same launch (rows up to SINGLE_PASS_MAX_K elements are read once,
held in registers; longer rows are read twice by the same program, still one launch). And one launch serves both
operands of a GEMM: programs [0, rows_a) quantise the activation's rows, the next rows_w programs the weight's
(output channels), so the Linear costs two launches: this kernel and torch._scaled_mm with scale_a [M, 1] and
scale_b [1, N] (row-wise scaling: bf16 output only, sm_89 and sm_90, CUTLASS's f8f8bf16_rowwise in torch).

The scales of both operands live in one fp32 buffer: the activation's from slot 0, the weight's from the next
multiple of SCALE_ALIGN, so each view handed to the GEMM starts 64-byte aligned.
"""
from __future__ import annotations

import torch

from ..launch import launch_args as run_kernel
from .quantize_fp8 import ABSMAX_FLOOR, E4M3_MAX, FP8_DTYPE, fp8_choice

# rows up to this many elements are read once and held in registers; longer ones are read twice (same launch)
SINGLE_PASS_MAX_K = 16384
CHUNK_K = 4096                 # the chunk of a longer row per step
SCALE_ALIGN = 16               # the weight's scales start at a multiple of this many fp32 slots (64 bytes)


def quantize_rows_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes [R, K] e4m3, scales [R, 1] fp32) of a 2-D tensor; the divisor is a tensor for IEEE division (see
    quantize_fp8.dynamic_scale_reference)."""
    absmax = x.detach().abs().amax(dim=-1, keepdim=True).float().clamp_min(ABSMAX_FLOOR)
    scale = absmax / torch.full((), E4M3_MAX, device=absmax.device, dtype=torch.float32)
    codes = (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(FP8_DTYPE)
    return codes, scale


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise codes [R, K] and scales [R, 1] of a 2-D tensor (Triton where it runs, else the reference)."""
    if not fp8_choice("quantize_fp8_rows", x).triton:
        return quantize_rows_reference(x)
    codes, scales, _, _ = quantize_pair_triton(x, None)
    return codes, scales


def scale_slots(rows_a: int, rows_w: int) -> tuple[int, int]:
    """(slots of the shared scale buffer, the weight's first slot) for rows_a activation and rows_w weight rows."""
    offset = -(-rows_a // SCALE_ALIGN) * SCALE_ALIGN
    return offset + rows_w, offset


def _row_input(x: torch.Tensor) -> torch.Tensor:
    """x as the kernel reads it: rows of unit element stride (a row stride of its own is fine)."""
    if x.requires_grad:          # the interpreter hands tensors to numpy, which refuses ones that require grad
        x = x.detach()
    return x if x.stride(-1) == 1 else x.contiguous()


def quantize_pair_triton(a: torch.Tensor, w: torch.Tensor | None, out_fp32: bool = False
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """One launch: row-wise codes and scales of a [M, K] and, when given, w [N, K] (same K).

    Returns (a_codes [M, K], a_scales [M, 1], w_codes [N, K] or None, w_scales [1, N] or None): the scale views
    torch._scaled_mm's row-wise mode takes. out_fp32 stores the values the kernel would cast (tests: exact math
    where the interpreter's fp8 cast deviates).
    """
    a = _row_input(a)
    rows_a, k = a.shape
    rows_w = 0
    if w is not None:
        w = _row_input(w)
        rows_w = w.shape[0]
        if w.shape[1] != k:
            raise ValueError(f"row-wise pair: K of {tuple(a.shape)} and {tuple(w.shape)} differ")
    device = a.device
    code_dtype = torch.float32 if out_fp32 else FP8_DTYPE
    a_codes = torch.empty((rows_a, k), device=device, dtype=code_dtype)
    w_codes = None if w is None else torch.empty((rows_w, k), device=device, dtype=code_dtype)
    slots, w_offset = scale_slots(rows_a, rows_w)
    scales = torch.empty(slots, device=device, dtype=torch.float32)
    a_scales = scales[:rows_a].view(rows_a, 1)
    w_scales = None if w is None else scales[w_offset:w_offset + rows_w].view(1, rows_w)
    programs = rows_a + rows_w
    if programs and k:
        one_pass = k <= SINGLE_PASS_MAX_K
        block = triton.next_power_of_2(k) if one_pass else CHUNK_K
        a_written = a_codes if out_fp32 else a_codes.view(torch.uint8)
        w_source = a if w is None else w
        w_written = a_written if w_codes is None else (w_codes if out_fp32 else w_codes.view(torch.uint8))
        run_kernel(_rows_kernel, (programs,),
                    (a, w_source, a_written, w_written, scales, rows_a, k, a.stride(0), w_source.stride(0),
                     w_offset, ABSMAX_FLOOR, E4M3_MAX),
                    {"BLOCK_K": block, "ONE_PASS": one_pass, "OUT_FP8": not out_fp32},
                    num_warps=min(max(block // 512, 1), 8))
    return a_codes, a_scales, w_codes, w_scales


try:
    import triton
    import triton.language as tl
except Exception:  # dispatch.triton_import_error() reports the reason; the reference still works
    triton = None
else:
    from .quantize_fp8 import store_scaled_codes

if triton is not None:
    @triton.jit
    def _quantize_row(src, dst, scale_ptr, k, floor, fmax, BLOCK_K: tl.constexpr, ONE_PASS: tl.constexpr,
                      OUT_FP8: tl.constexpr):
        """One row: absmax, scale, codes; the row held in registers (ONE_PASS) or read a second time."""
        offs = tl.arange(0, BLOCK_K)
        if ONE_PASS:
            mask = offs < k
            x = tl.load(src + offs, mask=mask, other=0.0).to(tl.float32)
            scale = tl.div_rn(tl.maximum(tl.max(tl.abs(x), axis=0), floor), fmax)
            store_scaled_codes(dst, offs, mask, x, scale, fmax, OUT_FP8)
        else:
            running = tl.zeros([BLOCK_K], dtype=tl.float32)
            for start in range(0, k, BLOCK_K):
                mask = start + offs < k
                x = tl.load(src + start + offs, mask=mask, other=0.0, eviction_policy="evict_last")
                running = tl.maximum(running, tl.abs(x.to(tl.float32)))
            scale = tl.div_rn(tl.maximum(tl.max(running, axis=0), floor), fmax)
            for start in range(0, k, BLOCK_K):
                mask = start + offs < k
                x = tl.load(src + start + offs, mask=mask, other=0.0, eviction_policy="evict_first")
                store_scaled_codes(dst + start, offs, mask, x.to(tl.float32), scale, fmax, OUT_FP8)
        tl.store(scale_ptr, scale)

    @triton.jit
    def _rows_kernel(a_ptr, w_ptr, a_out, w_out, scales_ptr, rows_a, k, a_stride, w_stride, w_offset, floor, fmax,
                     BLOCK_K: tl.constexpr, ONE_PASS: tl.constexpr, OUT_FP8: tl.constexpr):
        """Program p < rows_a: row p of a; else row p - rows_a of w (its scale at w_offset + that row)."""
        row = tl.program_id(0).to(tl.int64)
        if row < rows_a:
            _quantize_row(a_ptr + row * a_stride, a_out + row * k, scales_ptr + row, k, floor, fmax,
                          BLOCK_K, ONE_PASS, OUT_FP8)
        else:
            row = row - rows_a
            _quantize_row(w_ptr + row * w_stride, w_out + row * k, scales_ptr + w_offset + row, k, floor, fmax,
                          BLOCK_K, ONE_PASS, OUT_FP8)
