"""Per-tensor e4m3 codes of q, k and v for cuDNN's FP8 SDPA (ops/attention_cudnn_fp8.py), with q and k rotated by
the normalised Hadamard matrix inside the quantiser (issue 38, item 3: FlashAttention-3's incoherent processing).

Math, per call (q `[B, H, Sq, D]`, k and v `[B, H, Skv, D]`, D in {64, 128}, bf16 or fp16, any strides):
    m_k   = mean of k over its tokens, fp32 `[B, H, 1, D]`            (one torch op: `token_mean`)
    q'    = rot(q),  k' = rot(k - m_k)                               (fp32; without `rotate`: q' = q, k' = k - m_k)
    v'    = v - m_v with `v_mean` (m_v = `token_mean(v)`), else v    (never rotated)
    rot(x) = fwht(x) * (1 / sqrt(D))                                 (fp32 ops in a fixed order, see below)
    scale = max(amax |x'|, 1e-12) / 448                              (one fp32 scale per tensor, IEEE division)
    codes = e4m3(clamp(x' / scale, -448, 448))                       (round to nearest even, contiguous)
The rotation is H_D / sqrt(D) with H_D Sylvester's Hadamard matrix: symmetric and orthogonal, so q' k'^T =
q (k - m_k)^T (up to fp32 rounding), and softmax is invariant to K's mean (it shifts every logit of a query row
alike). The rotation spreads the few large channels of DiT queries and keys over all D channels, so the per-tensor
e4m3 scale no longer follows a handful of outliers. V's option: every output row of attention is a convex
combination of V's rows (P's rows sum to 1), so P (V - m_v) + m_v = P V exactly; cuDNN's P V then rounds
the smaller V - m_v, and the caller adds m_v back to its output (attention_cudnn_fp8.add_value_mean).

Rotation as a butterfly, not `tl.dot` with the matrix: log2(D) stages, each pairing neighbours (a, b) = (x[2i],
x[2i+1]) into y[i] = a + b and y[D/2 + i] = a - b (the constant-geometry fast Walsh-Hadamard transform; log2(D)
such stages give exactly Sylvester's H_D), then one multiply by the fp32 constant 1 / sqrt(D). Why:
- exact and reproducible: every rotated value is the same fp32 additions in the same order on any GPU, in the
  interpreter and in the eager reference (`fwht_reference`), so the codes and scales are compared byte for byte.
  `tl.dot` would take K's smoothed fp32 values either as TF32 (10 mantissa bits: a rounding of the rotation
  itself, the error this pass exists to cut) or through the FMA units at D^2 multiply-adds per row with
  input_precision="ieee", and the tensor cores' accumulation order is unspecified (no byte-exact reference);
  bf16 operands cannot hold k - m_k.
- cheap enough: D log2(D) additions per row (896 at D = 128) against D^2 multiply-adds; the pass is bound by
  memory traffic either way. Triton lowers each stage's reshape / permute / split / join to a layout conversion
  through shared memory (a few KiB); the H200 run (`attention-kernels`, row cudnn_fp8_rotated) says whether that
  keeps the pass within its budget.
- no contraction: the smoothing subtraction comes before the butterfly and the one multiply after it, so no
  multiply feeds an addition that a compiler could fuse into an FMA (fused and unfused would round differently).

Launches (all on the GPU, nothing read back to the host, allocations alike on every call of a shape: a block
replayed from a CUDA graph runs it unchanged): `token_mean` of k (and of v with v_mean: one torch reduction each),
then two Triton launches serving q, k and v together:
1. stats: each program walks its share of row tiles of one tensor (grid-stride, at most `max_programs` per tensor),
   computes the smoothed, rotated values and writes their max |.| into its own slot of a small fp32 buffer: no
   atomics, nothing zero-filled first, and the maximum is exact in any order, so the scale equals the reference's;
2. codes: each program reduces its tensor's partial maxima itself (no grid-wide sync), derives the scale,
   recomputes its tiles' values (walking them last to first: the tiles the stats pass read last are the likeliest
   still in L2) and writes their codes; the tensor's first program stores the scale.
Why not fewer: a per-tensor scale needs the maximum over the whole tensor before any code is written, and Triton
has no grid-wide barrier (a persistent kernel spinning on a counter hangs unless every program is resident), so at
least two launches; K's maximum is over the smoothed values, which need the mean first, so folding the mean into
the stats pass would take a third pass over K all the same; the torch mean keeps kernel and reference on the same
mean (a Triton sum's order is the compiler's). A bound in place of the maximum (amax |rot(k - m)| <= 2 amax
|rot(k)|, known without the mean) would save only the mean's read of K, at the cost of scales that are not
amax / 448 (codes short of 448, more of them subnormal): not taken. So q is read twice, k three times, v twice
(three times with v_mean), and the codes written once.

The scales of q, k and v live in slots 0, 4 and 8 of that buffer (16-byte aligned `[1, 1, 1, 1]` views, as cuDNN
takes its descale tensors), the partial maxima after slot SLOTS. Under TRITON_INTERPRET=1 the interpreter's fp32 ->
e4m3 cast loses round-ups in a few percent of codes (ops/attention_fp8.py), so there (only) the codes are rounded to
e4m3's grid in fp32 arithmetic first (`EXACT_GRID`), after which the cast is exact; compiled kernels use the
hardware conversion.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

from .. import dispatch
from ..launch import launch_args as run_kernel
from . import attention_fp8, cdiv, next_power_of_2
from .quantize_fp8 import ABSMAX_FLOOR, E4M3_MAX, FP8_DTYPE, fp8_choice

OP = "rotate_quantize_fp8"
HEAD_DIMS = (64, 128)
SCALE_STRIDE = 4          # fp32 slots between the scales of q, k and v (16 bytes)
SLOTS = 3 * SCALE_STRIDE  # the partial maxima start here


@dataclass(frozen=True)
class RotateQuantizeLaunch:
    """How the two kernels are launched: tiles of block_s rows of one (batch, head), at most max_programs programs
    per tensor (each walks its tiles grid-stride; the codes pass's programs each reduce that many partial maxima)."""
    block_s: int = 64
    num_warps: int = 4
    max_programs: int = 1024


LAUNCH = RotateQuantizeLaunch()


class RotatedCodes(NamedTuple):
    """What cuDNN's FP8 SDPA takes: contiguous e4m3 codes of q', k', v' and their fp32 scales (`[1, 1, 1, 1]`
    views, handed to cuDNN as descale tensors), and V's mean (fp32 `[B, H, 1, D]`) to add back to the output, or
    None."""
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    q_scale: torch.Tensor
    k_scale: torch.Tensor
    v_scale: torch.Tensor
    v_mean: torch.Tensor | None


def rotation_factor(d: int) -> float:
    """1 / sqrt(D), the normalisation of the butterfly (rounded to fp32 where it multiplies)."""
    return 1.0 / math.sqrt(d)


def hadamard(d: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The normalised Sylvester Hadamard matrix H_D / sqrt(D) (d a power of two): symmetric, orthogonal."""
    h = torch.ones(1, 1, dtype=dtype)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(d)


def token_mean(x: torch.Tensor) -> torch.Tensor:
    """The mean of `[B, H, S, D]` x over its tokens, fp32 `[B, H, 1, D]` (one torch op; kernel and reference use
    the same values)."""
    return x.mean(dim=2, keepdim=True, dtype=torch.float32)


# ---------------------------------------------------------------------------------------------------------------
# eager reference: the kernels' math in fp32 torch ops, in their order
# ---------------------------------------------------------------------------------------------------------------

def fwht_reference(x: torch.Tensor) -> torch.Tensor:
    """The unnormalised Walsh-Hadamard transform of the last dim (x @ H_D), as the kernels' butterfly computes it:
    log2(D) stages of y[i] = x[2i] + x[2i+1], y[D/2 + i] = x[2i] - x[2i+1]."""
    d = x.shape[-1]
    for _ in range(d.bit_length() - 1):
        pairs = x.unflatten(-1, (d // 2, 2))
        a, b = pairs[..., 0], pairs[..., 1]
        x = torch.cat([a + b, a - b], dim=-1)
    return x


def rotate_reference(x: torch.Tensor) -> torch.Tensor:
    """x (fp32) rotated by the normalised Hadamard matrix: the butterfly, then one fp32 multiply."""
    return fwht_reference(x) * rotation_factor(x.shape[-1])


def prepared_reference(x: torch.Tensor, mean: torch.Tensor | None, rotate: bool) -> torch.Tensor:
    """x' in fp32: x minus its mean (where given), rotated (where asked)."""
    xf = x.float()
    if mean is not None:
        xf = xf - mean
    return rotate_reference(xf) if rotate else xf


def codes_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(contiguous e4m3 codes, fp32 scale `[1, 1, 1, 1]`) of fp32 x: scale = max(amax, 1e-12) / 448, the divisor a
    tensor for IEEE division (see quantize_fp8.dynamic_scale_reference)."""
    absmax = x.abs().amax().clamp_min(ABSMAX_FLOOR)
    scale = absmax / torch.full((), E4M3_MAX, device=x.device, dtype=torch.float32)
    codes = (x / scale).clamp(-E4M3_MAX, E4M3_MAX).to(FP8_DTYPE).contiguous()
    return codes, scale.reshape(1, 1, 1, 1)


def rotate_quantize_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rotate: bool = True,
                              v_mean: bool = False) -> RotatedCodes:
    """The pass in eager torch (the kernels' math; also the eager-rotation variant where Triton does not run)."""
    m_v = token_mean(v) if v_mean else None
    q8, sq = codes_reference(prepared_reference(q, None, rotate))
    k8, sk = codes_reference(prepared_reference(k, token_mean(k), rotate))
    v8, sv = codes_reference(prepared_reference(v, m_v, False))
    return RotatedCodes(q8, k8, v8, sq, sk, sv, m_v)


# ---------------------------------------------------------------------------------------------------------------
# public entry point
# ---------------------------------------------------------------------------------------------------------------

def refusal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
    """Why the kernels cannot take (q, k, v) (the reference can take any `[B, H, S, D]` of a power-of-two D), or
    None."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return "not [B, H, S, D] tensors"
    if q.shape[-1] not in HEAD_DIMS or k.shape[-1] != q.shape[-1] or v.shape[-1] != q.shape[-1]:
        return f"head dim {q.shape[-1]} (only {HEAD_DIMS})"
    if k.shape != v.shape or k.shape[:2] != q.shape[:2]:
        return f"k and v unlike q: {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
    if 0 in q.shape or 0 in k.shape:
        return "an empty tensor"
    return None


def rotate_quantize(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rotate: bool = True, v_mean: bool = False,
                    launch: RotateQuantizeLaunch = LAUNCH) -> RotatedCodes:
    """The codes and scales cuDNN's FP8 SDPA takes: the Triton kernels where they run (an FP8 GPU), else the eager
    reference (same math)."""
    if not fp8_choice(OP, q).triton or refusal(q, k, v) is not None:
        return rotate_quantize_reference(q, k, v, rotate, v_mean)
    return rotate_quantize_triton(q, k, v, rotate, v_mean, launch=launch)


# ---------------------------------------------------------------------------------------------------------------
# Triton kernels and launcher
# ---------------------------------------------------------------------------------------------------------------

triton = attention_fp8.triton    # None where Triton does not import (dispatch says why); the reference still works
if triton is not None:
    import triton.language as tl

    from .attention_fp8 import e4m3_grid

    @triton.jit
    def fwht(x, BLOCK_S: tl.constexpr, D: tl.constexpr, LOG_D: tl.constexpr):
        """The butterfly of `fwht_reference` on each row of a [BLOCK_S, D] fp32 tile (unnormalised)."""
        for _ in tl.static_range(LOG_D):
            a, b = tl.split(tl.reshape(x, [BLOCK_S, D // 2, 2]))
            x = tl.reshape(tl.permute(tl.join(a + b, a - b), (0, 2, 1)), [BLOCK_S, D])
        return x

    @triton.jit
    def _prepared_tile(x_ptr, mean_ptr, tile, S, H, n_tiles, stride_b, stride_h, stride_s, stride_d, norm,
                       D: tl.constexpr, LOG_D: tl.constexpr, BLOCK_S: tl.constexpr, ROTATE: tl.constexpr,
                       HAS_MEAN: tl.constexpr):
        """(x' of one tile of BLOCK_S rows of one (batch, head), fp32, zero on rows past S or past the tensor; its
        rows' mask; the offsets of its codes in the contiguous codes buffer)."""
        tiles_per_head = tl.cdiv(S, BLOCK_S)
        bh = tile // tiles_per_head
        rows = (tile % tiles_per_head) * BLOCK_S + tl.arange(0, BLOCK_S)
        cols = tl.arange(0, D)
        # past the tensor (the grid's last tiles) no row is valid: a bound, not `& (tile < n_tiles)`, which the
        # interpreter's masks refuse (a scalar bool with a vector gives integers there)
        ok = rows < tl.where(tile < n_tiles, S, 0)
        base = x_ptr + (bh // H).to(tl.int64) * stride_b + (bh % H).to(tl.int64) * stride_h
        x = tl.load(base + rows.to(tl.int64)[:, None] * stride_s + cols[None, :] * stride_d, mask=ok[:, None],
                    other=0.0).to(tl.float32)
        if HAS_MEAN:
            mean = tl.load(mean_ptr + bh.to(tl.int64) * D + cols, mask=cols < tl.where(tile < n_tiles, D, 0),
                           other=0.0)
            x = tl.where(ok[:, None], x - mean[None, :], 0.0)
        if ROTATE:
            x = fwht(x, BLOCK_S, D, LOG_D) * norm
        offsets = (bh.to(tl.int64) * S + rows)[:, None] * D + cols[None, :]
        return x, ok, offsets

    @triton.jit
    def _partial_absmax(x_ptr, mean_ptr, slot_ptr, local, programs, iterations, S, H, n_tiles,
                        stride_b, stride_h, stride_s, stride_d, norm, D: tl.constexpr, LOG_D: tl.constexpr,
                        BLOCK_S: tl.constexpr, ROTATE: tl.constexpr, HAS_MEAN: tl.constexpr):
        """max |x'| over this program's tiles (grid-stride), into its own slot."""
        running = tl.zeros([BLOCK_S, D], dtype=tl.float32)
        for i in range(iterations):
            x, _, _ = _prepared_tile(x_ptr, mean_ptr, i * programs + local, S, H, n_tiles, stride_b, stride_h,
                                     stride_s, stride_d, norm, D, LOG_D, BLOCK_S, ROTATE, HAS_MEAN)
            running = tl.maximum(running, tl.abs(x))
        tl.store(slot_ptr, tl.max(tl.max(running, axis=1), axis=0))

    @triton.jit
    def _stats_kernel(q_ptr, k_ptr, v_ptr, k_mean_ptr, v_mean_ptr, stats_ptr, H, Sq, Skv, q_tiles, kv_tiles,
                      stride_qb, stride_qh, stride_qs, stride_qd, stride_kb, stride_kh, stride_ks, stride_kd,
                      stride_vb, stride_vh, stride_vs, stride_vd, q_programs, kv_programs, q_iterations,
                      kv_iterations, norm, D: tl.constexpr, LOG_D: tl.constexpr, BLOCK_S: tl.constexpr,
                      ROTATE: tl.constexpr, V_MEAN: tl.constexpr, FIRST_PARTIAL: tl.constexpr):
        """Programs [0, q_programs): q's partial maxima; the next kv_programs: k's; the last kv_programs: v's. Each
        writes slot FIRST_PARTIAL + its program id."""
        pid = tl.program_id(0)
        slot = stats_ptr + FIRST_PARTIAL + pid
        if pid < q_programs:
            _partial_absmax(q_ptr, k_mean_ptr, slot, pid, q_programs, q_iterations, Sq, H, q_tiles,
                            stride_qb, stride_qh, stride_qs, stride_qd, norm, D, LOG_D, BLOCK_S, ROTATE, False)
        elif pid < q_programs + kv_programs:
            _partial_absmax(k_ptr, k_mean_ptr, slot, pid - q_programs, kv_programs, kv_iterations, Skv, H,
                            kv_tiles, stride_kb, stride_kh, stride_ks, stride_kd, norm, D, LOG_D, BLOCK_S, ROTATE,
                            True)
        else:
            _partial_absmax(v_ptr, v_mean_ptr, slot, pid - q_programs - kv_programs, kv_programs, kv_iterations,
                            Skv, H, kv_tiles, stride_vb, stride_vh, stride_vs, stride_vd, norm, D, LOG_D, BLOCK_S,
                            False, V_MEAN)

    @triton.jit
    def _tensor_codes(x_ptr, mean_ptr, codes_ptr, stats_ptr, scale_slot, first_partial, local, programs,
                      iterations, S, H, n_tiles, stride_b, stride_h, stride_s, stride_d, norm, floor, fmax,
                      D: tl.constexpr, LOG_D: tl.constexpr, BLOCK_S: tl.constexpr, ROTATE: tl.constexpr,
                      HAS_MEAN: tl.constexpr, MAX_PARTIALS: tl.constexpr, EXACT_GRID: tl.constexpr):
        """The tensor's scale from its partial maxima (the first program stores it), then this program's codes."""
        slots = tl.arange(0, MAX_PARTIALS)
        partials = tl.load(stats_ptr + first_partial + slots, mask=slots < programs, other=0.0)
        scale = tl.div_rn(tl.maximum(tl.max(partials, axis=0), floor), fmax)
        if local == 0:
            tl.store(stats_ptr + scale_slot, scale)
        for j in range(iterations):
            x, ok, offsets = _prepared_tile(x_ptr, mean_ptr, (iterations - 1 - j) * programs + local, S, H,
                                            n_tiles, stride_b, stride_h, stride_s, stride_d, norm, D, LOG_D,
                                            BLOCK_S, ROTATE, HAS_MEAN)
            c = tl.minimum(tl.maximum(tl.div_rn(x, scale), -fmax), fmax)
            if EXACT_GRID:
                c = e4m3_grid(c)
            tl.store(codes_ptr + offsets, c.to(tl.float8e4nv).to(tl.uint8, bitcast=True), mask=ok[:, None])

    @triton.jit
    def _codes_kernel(q_ptr, k_ptr, v_ptr, k_mean_ptr, v_mean_ptr, q_codes_ptr, k_codes_ptr, v_codes_ptr,
                      stats_ptr, H, Sq, Skv, q_tiles, kv_tiles,
                      stride_qb, stride_qh, stride_qs, stride_qd, stride_kb, stride_kh, stride_ks, stride_kd,
                      stride_vb, stride_vh, stride_vs, stride_vd, q_programs, kv_programs, q_iterations,
                      kv_iterations, norm, floor, fmax, D: tl.constexpr, LOG_D: tl.constexpr,
                      BLOCK_S: tl.constexpr, ROTATE: tl.constexpr, V_MEAN: tl.constexpr,
                      FIRST_PARTIAL: tl.constexpr, SCALE_STRIDE: tl.constexpr, MAX_PARTIALS: tl.constexpr,
                      EXACT_GRID: tl.constexpr):
        """The stats kernel's grid again: each tensor's programs write its codes (and the first, its scale)."""
        pid = tl.program_id(0)
        if pid < q_programs:
            _tensor_codes(q_ptr, k_mean_ptr, q_codes_ptr, stats_ptr, 0, FIRST_PARTIAL, pid, q_programs,
                          q_iterations, Sq, H, q_tiles, stride_qb, stride_qh, stride_qs, stride_qd, norm, floor,
                          fmax, D, LOG_D, BLOCK_S, ROTATE, False, MAX_PARTIALS, EXACT_GRID)
        elif pid < q_programs + kv_programs:
            _tensor_codes(k_ptr, k_mean_ptr, k_codes_ptr, stats_ptr, SCALE_STRIDE, FIRST_PARTIAL + q_programs,
                          pid - q_programs, kv_programs, kv_iterations, Skv, H, kv_tiles, stride_kb, stride_kh,
                          stride_ks, stride_kd, norm, floor, fmax, D, LOG_D, BLOCK_S, ROTATE, True, MAX_PARTIALS,
                          EXACT_GRID)
        else:
            _tensor_codes(v_ptr, v_mean_ptr, v_codes_ptr, stats_ptr, 2 * SCALE_STRIDE,
                          FIRST_PARTIAL + q_programs + kv_programs, pid - q_programs - kv_programs, kv_programs,
                          kv_iterations, Skv, H, kv_tiles, stride_vb, stride_vh, stride_vs, stride_vd, norm, floor,
                          fmax, D, LOG_D, BLOCK_S, False, V_MEAN, MAX_PARTIALS, EXACT_GRID)


def grid_of(tiles: int, launch: RotateQuantizeLaunch) -> tuple[int, int]:
    """(programs, iterations per program) for a tensor of `tiles` row tiles."""
    iterations = cdiv(tiles, launch.max_programs)
    return cdiv(tiles, iterations), iterations


def _input(x: torch.Tensor) -> torch.Tensor:
    return x.detach() if x.requires_grad else x    # the interpreter hands tensors to numpy, which refuses grads


def rotate_quantize_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rotate: bool = True,
                           v_mean: bool = False, launch: RotateQuantizeLaunch = LAUNCH) -> RotatedCodes:
    """The two launches (after K's and, with v_mean, V's token mean): codes and scales as the reference gives."""
    q, k, v = _input(q), _input(k), _input(v)
    b, h, sq, d = q.shape
    skv = k.shape[2]
    device = q.device
    k_mean = token_mean(k)
    m_v = token_mean(v) if v_mean else None
    q_tiles, kv_tiles = b * h * cdiv(sq, launch.block_s), b * h * cdiv(skv, launch.block_s)
    (q_programs, q_iterations), (kv_programs, kv_iterations) = grid_of(q_tiles, launch), grid_of(kv_tiles, launch)
    grid = (q_programs + 2 * kv_programs,)
    stats = torch.empty(SLOTS + grid[0], device=device, dtype=torch.float32)
    codes = [torch.empty(x.shape, device=device, dtype=FP8_DTYPE) for x in (q, k, v)]
    shared = (h, sq, skv, q_tiles, kv_tiles, *q.stride(), *k.stride(), *v.stride(), q_programs, kv_programs,
              q_iterations, kv_iterations, rotation_factor(d))
    constexprs = {"D": d, "LOG_D": d.bit_length() - 1, "BLOCK_S": launch.block_s, "ROTATE": rotate,
                  "V_MEAN": v_mean, "FIRST_PARTIAL": SLOTS}
    means = (k_mean, k_mean if m_v is None else m_v)
    run_kernel(_stats_kernel, grid, (q, k, v, *means, stats, *shared), constexprs, num_warps=launch.num_warps)
    run_kernel(_codes_kernel, grid,
               (q, k, v, *means, *(c.view(torch.uint8) for c in codes), stats, *shared, ABSMAX_FLOOR, E4M3_MAX),
               {**constexprs, "SCALE_STRIDE": SCALE_STRIDE,
                "MAX_PARTIALS": next_power_of_2(max(q_programs, kv_programs)),
                "EXACT_GRID": dispatch.interpreting()},
               num_warps=launch.num_warps)
    scales = [stats[i * SCALE_STRIDE:i * SCALE_STRIDE + 1].view(1, 1, 1, 1) for i in range(3)]
    return RotatedCodes(*codes, *scales, m_v)


def compile_for(arch: int, head_dim: int = 128, dtype: str = "bf16", rotate: bool = True, v_mean: bool = False,
                launch: RotateQuantizeLaunch = LAUNCH) -> dict:
    """Compile both kernels for CUDA compute capability `arch` (89, 90) without a GPU, as a call specialises them
    (unit last-dim strides, 16-byte aligned pointers and strides): {kernel name: the compiled kernel's asm dict
    (ttir, ttgir, llir, ptx, cubin) and its `shared_bytes`}. Needs a Triton with triton.compile, GPUTarget and
    ASTSource, and TRITON_INTERPRET unset (interpreted kernels do not compile)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", arch, 32)
    pointers = {"q_ptr": f"*{dtype}", "k_ptr": f"*{dtype}", "v_ptr": f"*{dtype}", "k_mean_ptr": "*fp32",
                "v_mean_ptr": "*fp32", "stats_ptr": "*fp32", "q_codes_ptr": "*u8", "k_codes_ptr": "*u8",
                "v_codes_ptr": "*u8"}
    floats = {"norm": "fp32", "floor": "fp32", "fmax": "fp32"}
    constexprs = {"D": head_dim, "LOG_D": head_dim.bit_length() - 1, "BLOCK_S": launch.block_s,
                  "ROTATE": rotate, "V_MEAN": v_mean, "FIRST_PARTIAL": SLOTS, "SCALE_STRIDE": SCALE_STRIDE,
                  "MAX_PARTIALS": next_power_of_2(launch.max_programs), "EXACT_GRID": False}
    compiled = {}
    for name, kernel in (("stats", _stats_kernel), ("codes", _codes_kernel)):
        fixed = {arg: value for arg, value in constexprs.items() if arg in kernel.arg_names}
        fixed.update({arg: 1 for arg in kernel.arg_names if arg.startswith("stride_") and arg.endswith("d")})
        signature = {arg: "constexpr" if arg in fixed else pointers.get(arg) or floats.get(arg) or "i32"
                     for arg in kernel.arg_names}
        aligned = {(kernel.arg_names.index(arg),): [["tt.divisibility", 16]] for arg in kernel.arg_names
                   if signature[arg].startswith("*") or (arg.startswith("stride_") and arg not in fixed)}
        source = ASTSource(fn=kernel, signature=signature, constexprs=fixed, attrs=aligned)
        binary = triton.compile(source, target=target, options={"num_warps": launch.num_warps})
        compiled[name] = {**binary.asm, "shared_bytes": getattr(binary.metadata, "shared", None)}
    return compiled


def compile_report(archs=(89, 90), v_mean: bool = True) -> dict:
    """What the sm_89 / sm_90 builds hold, per "arch/head dim/kernel": the PTX target, cubin and shared-memory
    bytes, and whether the PTX converts with the hardware e4m3 instruction, divides with IEEE division, uses
    global atomics or contracts any fp32 multiply-add into an FMA; {"skip": why} where this Triton cannot compile
    for another target. (Run with TRITON_INTERPRET unset: tests run it in a subprocess.)"""
    import re
    try:
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.compiler import ASTSource  # noqa: F401
        triton.compile
    except (ImportError, AttributeError) as exc:
        return {"skip": f"this Triton cannot compile for another target ({exc})"}
    found = {}
    for arch in archs:
        for d in HEAD_DIMS:
            for name, asm in compile_for(arch, d, v_mean=v_mean).items():
                ptx = asm["ptx"]
                found[f"{arch}/{d}/{name}"] = {
                    "target": re.search(r"\.target\s+(\S+)", ptx).group(1), "cubin_bytes": len(asm["cubin"]),
                    "shared_bytes": asm["shared_bytes"], "e4m3": "cvt.rn.satfinite.e4m3x2.f32" in ptx,
                    "div_rn": "div.rn.f32" in ptx, "atomics": bool(re.search(r"\b(?:atom|red)\.global", ptx)),
                    "fma": bool(re.search(r"\bfma\.rn(?:\.ftz)?\.f32", ptx))}
    return found
