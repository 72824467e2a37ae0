"""QK RMSNorm + interleaved RoPE, fused: Flux (per-head norm, BHND) and Wan (full-C norm, BNHD; norm-only too).

Rounding points follow ComfyUI's eager chain (the drop-in tier): `F.rms_norm` (fused since torch 2.11: fp32
math, one rounding to the input dtype), then `apply_rope`/`apply_rope1` upcast the rounded result to fp32,
rotate and round again. The kernels keep both roundings, so bf16 results match eager to the ulp instead of
being "more exact" than the code they replace. q and k go through one launch (program axis 1 picks which).

pe / freqs hold rows `[[cos, -sin], [sin, cos]]` per pair: out[2i + r] = f[i, r, 0] * x[2i] + f[i, r, 1] * x[2i + 1].
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..dispatch import choose
from ..launch import launch_args
from ..library import compiling, register
from . import KERNEL_DTYPES, TuningRecord, batch_stride, cdiv, check_out, eager_because, into_out, next_power_of_2
from . import norm_order

try:
    import triton
    import triton.language as tl
except Exception:  # the eager path must keep working without triton; dispatch says why
    triton = None

# Both kernels give a program a block of tokens, load those tokens' rotation matrices once, and then walk over the
# heads (Flux: every head of q and of k; Wan: the head-aligned chunks of C) with a [heads, tokens, D] tile, so the
# table is read once per token and no lane is spent on padding C up to a power of two.

@dataclass(frozen=True)
class FluxLaunch:
    """The Flux kernel's launch setting. Pass another to `flux_rms_rope` to sweep one."""
    tokens_per_program: int = 2
    heads_per_step: int = 8
    num_warps: int = 2
    # True: q and k of a token block go to two programs (twice the programs, the block's rotations loaded twice)
    split_qk: bool = False
    # True: each tensor's next head step is loaded before the current one is stored
    prefetch: bool = True


@dataclass(frozen=True)
class WanLaunch:
    """The Wan kernel's launch setting (rms_rope and the norm-only path). Pass another to `wan_rms_rope` to sweep."""
    tokens_per_program: int = 1
    heads_per_step: int = 8      # channels per step = heads * D
    num_warps: int = 4
    norm_chunk: int = 128        # norm only (no heads): C is walked in chunks of this many channels
    # the loops over C unrolled (loads of later steps issued earlier): the sum of squares' 512-channel steps and
    # the normalising pass's head steps
    stats_unroll: int = 5
    loop_unroll: int = 5
    prefetch: bool = False       # True: the normalising loop loads each chunk one step ahead of its stores
    # rows of at most this many 512-channel steps (a multiple of 512 channels, with head_dim a power of two dividing
    # 512) are held in registers between the two passes instead of being read again (0: never): Wan's 5120
    # channels are 10 steps, 40 fp32 values per thread at 1 token x 4 warps
    held_max_steps: int = 16


FLUX_LAUNCH = FluxLaunch()
WAN_LAUNCH = WanLaunch()
FLUX_TUNING = TuningRecord(
    chosen="2 tokens x 8 heads per step x 2 warps, next head step prefetched",
    runner_up="1 token per step, prefetched (L=4096) or not (L=16384)",
    date="2026-11-30", results="kernels-sweep.json: ops.rms_rope_flux")
WAN_TUNING = TuningRecord(
    chosen="1 token x 8 heads per step x 4 warps, loops unrolled by 5, rows of <= 16 steps held in registers",
    runner_up="rows read twice (L=4096); 2 warps (L=8192, 16384)",
    date="2026-11-30", results="kernels-sweep.json: ops.rms_rope_wan")


# ---------------------------------------------------------------------------------------------------------------
# Eager references
# ---------------------------------------------------------------------------------------------------------------

def _comfy_rope(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """ComfyUI's interleaved RoPE: fp32 math on the (already rounded) input, result cast back to x's dtype."""
    pairs = x.float().reshape(*x.shape[:-1], -1, 1, 2)
    out = freqs[..., 0] * pairs[..., 0] + freqs[..., 1] * pairs[..., 1]
    return out.reshape(*x.shape).type_as(x)


def _comfy_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """comfy.rmsnorm.rms_norm with a weight: F.rms_norm with the weight cast to x's dtype."""
    return F.rms_norm(x, weight.shape, weight=weight.to(dtype=x.dtype, device=x.device), eps=eps)


def _rms_norm_fp64(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x64 = x.double()
    return x64 * torch.rsqrt(x64.square().mean(dim=-1, keepdim=True) + eps) * weight.double()


def _rope_fp64(x64: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    pairs = x64.reshape(*x64.shape[:-1], -1, 1, 2)
    f = freqs.double()
    return (f[..., 0] * pairs[..., 0] + f[..., 1] * pairs[..., 1]).reshape(*x64.shape)


def flux_reference_comfy(q, k, q_scale, k_scale, pe, eps: float = 1e-6):
    """Tier 2: what ComfyUI's Flux runs (QKNorm -> attention's apply_rope), rounding twice."""
    return (_comfy_rope(_comfy_rms_norm(q, q_scale, eps), pe),
            _comfy_rope(_comfy_rms_norm(k, k_scale, eps), pe))


def flux_reference_fp32(q, k, q_scale, k_scale, pe, eps: float = 1e-6):
    """Tier 1: the same math in fp64 with no intermediate rounding, returned in the input dtype."""
    return tuple(_rope_fp64(_rms_norm_fp64(x, w, eps), pe).to(x.dtype) for x, w in ((q, q_scale), (k, k_scale)))


def _rope1_comfy(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """ComfyUI's apply_rope1 (Wan): multiply, then addcmul_ in fp32, cast back."""
    pairs = x.to(dtype=freqs.dtype).reshape(*x.shape[:-1], -1, 1, 2)
    out = freqs[..., 0] * pairs[..., 0]
    out.addcmul_(freqs[..., 1], pairs[..., 1])
    return out.reshape(*x.shape).type_as(x)


def wan_reference_comfy(q, k, q_weight, k_weight, freqs, num_heads: int, eps: float = 1e-6):
    """Tier 2: Wan self-attention's norm_q/norm_k over the full C, `.view(b, s, n, d)`, then apply_rope1."""
    out = []
    for x, w in ((q, q_weight), (k, k_weight)):
        b, s, c = x.shape
        out.append(_rope1_comfy(_comfy_rms_norm(x, w, eps).view(b, s, num_heads, c // num_heads), freqs))
    return tuple(out)


def wan_reference_fp32(q, k, q_weight, k_weight, freqs, num_heads: int, eps: float = 1e-6):
    out = []
    for x, w in ((q, q_weight), (k, k_weight)):
        b, s, c = x.shape
        normed = _rms_norm_fp64(x, w, eps).view(b, s, num_heads, c // num_heads)
        out.append(_rope_fp64(normed, freqs).to(x.dtype))
    return tuple(out)


def wan_norm_reference_comfy(x, weight, eps: float = 1e-6):
    """Tier 2 of the norm-only path (Wan cross-attention's norm_q / norm_k / norm_k_img)."""
    return _comfy_rms_norm(x, weight, eps)


def wan_norm_reference_fp32(x, weight, eps: float = 1e-6):
    return _rms_norm_fp64(x, weight, eps).to(x.dtype)


# ---------------------------------------------------------------------------------------------------------------
# Triton kernels
# ---------------------------------------------------------------------------------------------------------------

if triton is not None:

    @triton.jit
    def _load_rotations(pe_ptr, token_offsets, token_mask, spi, spr, spc, HALF_D, BLOCK_HALF: tl.constexpr):
        """The 2x2 rotation matrices of a block of tokens: four [tokens, BLOCK_HALF] fp32 tensors f<row><col>.

        Loaded once per program and reused for every head it processes (the table is the same for all heads).
        """
        i = tl.arange(0, BLOCK_HALF)
        mask = token_mask[:, None] & (i < HALF_D)[None, :]
        base = pe_ptr + token_offsets[:, None] + i[None, :] * spi
        f00 = tl.load(base, mask=mask, other=0.0).to(tl.float32)
        f01 = tl.load(base + spc, mask=mask, other=0.0).to(tl.float32)
        f10 = tl.load(base + spr, mask=mask, other=0.0).to(tl.float32)
        f11 = tl.load(base + spr + spc, mask=mask, other=0.0).to(tl.float32)
        return f00, f01, f10, f11

    @triton.jit
    def _rotate(y, f00, f01, f10, f11, A: tl.constexpr, B: tl.constexpr, BLOCK_D: tl.constexpr,
                FMA: tl.constexpr):
        """Rotate the pairs of y ([A, B, BLOCK_D], fp32, rounded already); f.. broadcast to [A, B, BLOCK_D // 2].

        FMA: Wan's apply_rope1 adds the second product with `addcmul_`, one fma on CUDA; Flux's apply_rope rounds
        both products and adds them.
        """
        y0, y1 = tl.split(tl.reshape(y, [A, B, BLOCK_D // 2, 2]))
        if FMA:
            out0 = tl.fma(f01, y1, f00 * y0)
            out1 = tl.fma(f11, y1, f10 * y0)
        else:
            out0 = f00 * y0 + f01 * y1
            out1 = f10 * y0 + f11 * y1
        return tl.reshape(tl.join(out0, out1), [A, B, BLOCK_D])

    @triton.jit
    def _flux_load_heads(x_ptr, b, n, n_mask, d, d_mask, h0, H, sxb, sxh, sxn, sxd, HEADS: tl.constexpr):
        """Heads [h0, h0 + HEADS) of the program's tokens: (x as stored, h, mask), x `[HEADS, TOKENS, BLOCK_D]`."""
        h = h0 + tl.arange(0, HEADS)
        mask = (h < H)[:, None, None] & n_mask[None, :, None] & d_mask[None, None, :]
        x_offsets = b * sxb + h[:, None, None] * sxh + n[None, :, None] * sxn + d[None, None, :] * sxd
        return tl.load(x_ptr + x_offsets, mask=mask, other=0.0), h, mask

    @triton.jit
    def _flux_norm_rotate_store(x, h, mask, w, out_ptr, b, n, d, f00, f01, f10, f11, H, N, D, eps,
                                TOKENS: tl.constexpr, HEADS: tl.constexpr, BLOCK_D: tl.constexpr,
                                LANES: tl.constexpr, WARPS: tl.constexpr):
        x = x.to(tl.float32)
        # the sum of squares in torch's order (norm_order): a thread per 4 channels, then its tree
        rows = tl.reshape(x, [HEADS * TOKENS, BLOCK_D])
        x0, x1, x2, x3 = norm_order.elements_of_vectors(rows, HEADS * TOKENS, BLOCK_D // 4)
        acc = norm_order.square_into(tl.zeros([HEADS * TOKENS, BLOCK_D // 4], tl.float32), x0, x1, x2, x3)
        sum_sq = tl.reshape(norm_order.fold_sum(acc, HEADS * TOKENS, LANES, WARPS), [HEADS, TOKENS])
        rstd = tl.rsqrt(tl.math.div_rn(sum_sq, D * 1.0) + eps)
        # first rounding: RMSNorm's output is in the input's dtype
        y = (x * rstd[:, :, None] * w[None, None, :]).to(out_ptr.dtype.element_ty).to(tl.float32)
        out = _rotate(y, f00, f01, f10, f11, HEADS, TOKENS, BLOCK_D, False)
        # output is contiguous BHND: for each head the block's tokens are one contiguous run
        out_offsets = ((b * H + h[:, None, None]) * N + n[None, :, None]) * D + d[None, None, :]
        tl.store(out_ptr + out_offsets, out.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _flux_heads(x_ptr, w_ptr, out_ptr, b, n, n_mask, f00, f01, f10, f11, H, N, D,
                    sxb, sxh, sxn, sxd, eps,
                    TOKENS: tl.constexpr, HEADS: tl.constexpr, BLOCK_D: tl.constexpr,
                    LANES: tl.constexpr, WARPS: tl.constexpr, PREFETCH: tl.constexpr):
        """Norm + rotate every head of one tensor for the program's tokens, HEADS heads per step (PREFETCH: the
        next step's heads are loaded before this step's are stored; past H the load is masked, moving nothing)."""
        d = tl.arange(0, BLOCK_D)
        d_mask = d < D
        # comfy casts the weight to x's dtype before the norm
        w = tl.load(w_ptr + d, mask=d_mask, other=0.0).to(x_ptr.dtype.element_ty).to(tl.float32)
        if PREFETCH:
            x, h, mask = _flux_load_heads(x_ptr, b, n, n_mask, d, d_mask, 0, H, sxb, sxh, sxn, sxd, HEADS)
            for h0 in range(0, H, HEADS):
                x_next, h_next, mask_next = _flux_load_heads(x_ptr, b, n, n_mask, d, d_mask, h0 + HEADS, H,
                                                             sxb, sxh, sxn, sxd, HEADS)
                _flux_norm_rotate_store(x, h, mask, w, out_ptr, b, n, d, f00, f01, f10, f11, H, N, D, eps,
                                        TOKENS, HEADS, BLOCK_D, LANES, WARPS)
                x, h, mask = x_next, h_next, mask_next
        else:
            for h0 in range(0, H, HEADS):
                x, h, mask = _flux_load_heads(x_ptr, b, n, n_mask, d, d_mask, h0, H, sxb, sxh, sxn, sxd, HEADS)
                _flux_norm_rotate_store(x, h, mask, w, out_ptr, b, n, d, f00, f01, f10, f11, H, N, D, eps,
                                        TOKENS, HEADS, BLOCK_D, LANES, WARPS)

    @triton.jit
    def _flux_rms_rope_kernel(q_ptr, k_ptr, wq_ptr, wk_ptr, oq_ptr, ok_ptr, pe_ptr, H, N, D,
                              sqb, sqh, sqn, sqd, skb, skh, skn, skd,
                              spb, spn, spi, spr, spc, eps,
                              TOKENS: tl.constexpr, HEADS: tl.constexpr, BLOCK_D: tl.constexpr,
                              LANES: tl.constexpr, WARPS: tl.constexpr, SPLIT_QK: tl.constexpr,
                              PREFETCH: tl.constexpr):
        # program (token block, batch[, q or k]): the block's rotations are loaded once and serve all heads of
        # q and k (SPLIT_QK: of the one tensor program axis 2 picks)
        n = tl.program_id(0) * TOKENS + tl.arange(0, TOKENS)
        n_mask = n < N
        b = tl.program_id(1)
        f00, f01, f10, f11 = _load_rotations(pe_ptr, b * spb + n * spn, n_mask, spi, spr, spc, D // 2,
                                             BLOCK_D // 2)
        f00, f01, f10, f11 = f00[None, :, :], f01[None, :, :], f10[None, :, :], f11[None, :, :]
        if not SPLIT_QK or tl.program_id(2) == 0:
            _flux_heads(q_ptr, wq_ptr, oq_ptr, b, n, n_mask, f00, f01, f10, f11, H, N, D, sqb, sqh, sqn, sqd,
                        eps, TOKENS, HEADS, BLOCK_D, LANES, WARPS, PREFETCH)
        if not SPLIT_QK or tl.program_id(2) == 1:
            _flux_heads(k_ptr, wk_ptr, ok_ptr, b, n, n_mask, f00, f01, f10, f11, H, N, D, skb, skh, skn, skd,
                        eps, TOKENS, HEADS, BLOCK_D, LANES, WARPS, PREFETCH)

    @triton.jit
    def _wan_load_step(x_ptr, row_offsets, r_mask, c0, C, D, sxc,
                       HEADS: tl.constexpr, BLOCK_D: tl.constexpr):
        """Channels [c0, c0 + HEADS * D) of the program's tokens as a [TOKENS, HEADS, BLOCK_D] fp32 tile."""
        d = tl.arange(0, BLOCK_D)
        c = c0 + tl.arange(0, HEADS)[:, None] * D + d[None, :]
        c_mask = (d < D)[None, :] & (c < C)
        mask = r_mask[:, None, None] & c_mask[None, :, :]
        x = tl.load(x_ptr + row_offsets[:, None, None] + c[None, :, :] * sxc, mask=mask, other=0.0)
        return x.to(tl.float32), c, c_mask, mask

    @triton.jit
    def _wan_store_step(x, c, c_mask, mask, rstd, w_ptr, out_ptr, dtype_ptr, r, C, f00, f01, f10, f11,
                        TOKENS: tl.constexpr, HEADS: tl.constexpr, BLOCK_D: tl.constexpr,
                        HAS_ROPE: tl.constexpr):
        w = tl.load(w_ptr + c, mask=c_mask, other=0.0).to(dtype_ptr.dtype.element_ty).to(tl.float32)
        y = (x * rstd[:, None, None] * w[None, :, :]).to(dtype_ptr.dtype.element_ty)
        if HAS_ROPE:
            y = _rotate(y.to(tl.float32), f00, f01, f10, f11, TOKENS, HEADS, BLOCK_D, True)
        tl.store(out_ptr + r[:, None, None] * C + c[None, :, :], y.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _wan_rows(row_start, rows, L, sxb, sxl, spb, spl, TOKENS: tl.constexpr):
        """The token block at row_start: (rows r, their mask, offsets of their x rows, of their rotations)."""
        r = row_start + tl.arange(0, TOKENS)
        l_idx = r % L
        b = r // L
        return r, r < rows, b * sxb + l_idx * sxl, b * spb + l_idx * spl

    @triton.jit
    def _wan_rotations(pe_ptr, rot_offsets, r_mask, spi, spr, spc, D, BLOCK_D: tl.constexpr, HAS_ROPE: tl.constexpr):
        """The block's rotations as `[TOKENS, 1, BLOCK_D // 2]` tensors (zeros, unused, without a rotation)."""
        if HAS_ROPE:
            f00, f01, f10, f11 = _load_rotations(pe_ptr, rot_offsets, r_mask, spi, spr, spc, D // 2, BLOCK_D // 2)
            f00, f01, f10, f11 = f00[:, None, :], f01[:, None, :], f10[:, None, :], f11[:, None, :]
        else:
            f00, f01, f10, f11 = 0.0, 0.0, 0.0, 0.0
        return f00, f01, f10, f11

    @triton.jit
    def _wan_tokens(x_ptr, w_ptr, out_ptr, pe_ptr, row_start, rows, L, C, D,
                    sxb, sxl, sxc, spb, spl, spi, spr, spc, eps,
                    TOKENS: tl.constexpr, HEADS: tl.constexpr, BLOCK_D: tl.constexpr,
                    HAS_ROPE: tl.constexpr, STATS_UNROLL: tl.constexpr, UNROLL: tl.constexpr,
                    PREFETCH: tl.constexpr, HELD_STEPS: tl.constexpr):
        # The norm spans a token's full C (all heads), the rotation is per head: C is walked in head-aligned
        # steps of HEADS * D channels. Output contiguous [B, L, C].
        r, r_mask, row_offsets, rot_offsets = _wan_rows(row_start, rows, L, sxb, sxl, spb, spl, TOKENS)
        f00, f01, f10, f11 = _wan_rotations(pe_ptr, rot_offsets, r_mask, spi, spr, spc, D, BLOCK_D, HAS_ROPE)
        # pass 1: sum of squares over C in torch's order; pass 2 normalizes + rotates the chunks pass 1 held in
        # registers (HELD_STEPS) or reads the (L1/L2-resident) row again
        if HELD_STEPS:
            chunks = _wan_load_held(x_ptr, row_offsets, r_mask, sxc, TOKENS, HELD_STEPS)
            rstd = tl.rsqrt(tl.math.div_rn(_wan_sum_sq_of_held(chunks, TOKENS, HELD_STEPS), C * 1.0) + eps)
            _wan_store_held(chunks, rstd, w_ptr, out_ptr, x_ptr, r, r_mask, C, f00, f01, f10, f11, TOKENS,
                            BLOCK_D, HAS_ROPE, HELD_STEPS)
        else:
            sum_sq = _wan_sum_sq_torch_order(x_ptr, row_offsets, r_mask, C, sxc, TOKENS, STATS_UNROLL)
            rstd = tl.rsqrt(tl.math.div_rn(sum_sq, C * 1.0) + eps)
            if PREFETCH:
                # the next step's chunk is loaded before this one is stored (loads stay after stores that may
                # alias them); past C the load is masked and moves nothing
                x, c, c_mask, mask = _wan_load_step(x_ptr, row_offsets, r_mask, 0, C, D, sxc, HEADS, BLOCK_D)
                for c0 in tl.range(0, C, HEADS * D, loop_unroll_factor=UNROLL):
                    x_next, c_next, c_mask_next, mask_next = _wan_load_step(x_ptr, row_offsets, r_mask,
                                                                            c0 + HEADS * D, C, D, sxc, HEADS,
                                                                            BLOCK_D)
                    _wan_store_step(x, c, c_mask, mask, rstd, w_ptr, out_ptr, x_ptr, r, C, f00, f01, f10, f11,
                                    TOKENS, HEADS, BLOCK_D, HAS_ROPE)
                    x, c, c_mask, mask = x_next, c_next, c_mask_next, mask_next
            else:
                for c0 in tl.range(0, C, HEADS * D, loop_unroll_factor=UNROLL):
                    x, c, c_mask, mask = _wan_load_step(x_ptr, row_offsets, r_mask, c0, C, D, sxc, HEADS,
                                                        BLOCK_D)
                    _wan_store_step(x, c, c_mask, mask, rstd, w_ptr, out_ptr, x_ptr, r, C, f00, f01, f10, f11,
                                    TOKENS, HEADS, BLOCK_D, HAS_ROPE)

    @triton.jit
    def _wan_load_held(x_ptr, row_offsets, r_mask, sxc, TOKENS: tl.constexpr, STEPS: tl.constexpr):
        """The rows of exactly STEPS * 512 channels as a tuple of `[TOKENS, 512]` tiles as stored."""
        chunks = ()
        for step in tl.static_range(STEPS):
            c = step * (norm_order.THREADS * 4) + tl.arange(0, norm_order.THREADS * 4)
            chunks = chunks + (tl.load(x_ptr + row_offsets[:, None] + c[None, :] * sxc, mask=r_mask[:, None],
                                       other=0.0),)
        return chunks

    @triton.jit
    def _wan_sum_sq_of_held(chunks, TOKENS: tl.constexpr, STEPS: tl.constexpr):
        """_wan_sum_sq_torch_order of held rows: the same order, from registers."""
        T: tl.constexpr = norm_order.THREADS
        acc = tl.zeros([TOKENS, T], dtype=tl.float32)
        for step in tl.static_range(STEPS):
            x0, x1, x2, x3 = norm_order.elements_of_vectors(chunks[step].to(tl.float32), TOKENS, T)
            acc = norm_order.square_into(acc, x0, x1, x2, x3)
        return norm_order.fold_sum(acc, TOKENS, norm_order.LANES_PER_WARP, T // norm_order.LANES_PER_WARP)

    @triton.jit
    def _wan_store_held(chunks, rstd, w_ptr, out_ptr, dtype_ptr, r, r_mask, C, f00, f01, f10, f11,
                        TOKENS: tl.constexpr, BLOCK_D: tl.constexpr, HAS_ROPE: tl.constexpr, STEPS: tl.constexpr):
        """Normalise, rotate and store held rows: a chunk is 512 // D whole heads (D a power of two dividing 512),
        `[TOKENS, heads, D]`."""
        HELD_HEADS: tl.constexpr = norm_order.THREADS * 4 // BLOCK_D
        for step in tl.static_range(STEPS):
            c = step * (norm_order.THREADS * 4) + tl.arange(0, HELD_HEADS)[:, None] * BLOCK_D + \
                tl.arange(0, BLOCK_D)[None, :]
            c_mask = c < C
            mask = r_mask[:, None, None] & c_mask[None, :, :]
            x = tl.reshape(chunks[step].to(tl.float32), [TOKENS, HELD_HEADS, BLOCK_D])
            _wan_store_step(x, c, c_mask, mask, rstd, w_ptr, out_ptr, dtype_ptr, r, C, f00, f01, f10, f11,
                            TOKENS, HELD_HEADS, BLOCK_D, HAS_ROPE)

    @triton.jit
    def _wan_sum_sq_torch_order(x_ptr, row_offsets, r_mask, C, sxc, TOKENS: tl.constexpr, UNROLL: tl.constexpr):
        """Sum of squares of each token's C channels in torch's order: 128 threads x 4 channels per step."""
        T: tl.constexpr = norm_order.THREADS
        acc = tl.zeros([TOKENS, T], dtype=tl.float32)
        for c0 in tl.range(0, C, T * 4, loop_unroll_factor=UNROLL):
            c = c0 + tl.arange(0, T * 4)
            x = tl.load(x_ptr + row_offsets[:, None] + c[None, :] * sxc, mask=r_mask[:, None] & (c < C)[None, :],
                        other=0.0).to(tl.float32)
            x0, x1, x2, x3 = norm_order.elements_of_vectors(x, TOKENS, T)
            acc = norm_order.square_into(acc, x0, x1, x2, x3)
        return norm_order.fold_sum(acc, TOKENS, norm_order.LANES_PER_WARP, T // norm_order.LANES_PER_WARP)

    @triton.jit
    def _wan_rms_rope_kernel(q_ptr, k_ptr, wq_ptr, wk_ptr, oq_ptr, ok_ptr, pe_ptr, rows_q, rows_k, Lq, Lk, C, D,
                             sqb, sql, sqc, skb, skl, skc, spb, spl, spi, spr, spc, eps,
                             TOKENS: tl.constexpr, HEADS: tl.constexpr, BLOCK_D: tl.constexpr,
                             HAS_ROPE: tl.constexpr, STATS_UNROLL: tl.constexpr, UNROLL: tl.constexpr,
                             PREFETCH: tl.constexpr, HELD_STEPS: tl.constexpr):
        row_start = tl.program_id(0) * TOKENS
        if tl.program_id(1) == 0:
            _wan_tokens(q_ptr, wq_ptr, oq_ptr, pe_ptr, row_start, rows_q, Lq, C, D, sqb, sql, sqc,
                        spb, spl, spi, spr, spc, eps, TOKENS, HEADS, BLOCK_D, HAS_ROPE, STATS_UNROLL, UNROLL,
                        PREFETCH, HELD_STEPS)
        else:
            _wan_tokens(k_ptr, wk_ptr, ok_ptr, pe_ptr, row_start, rows_k, Lk, C, D, skb, skl, skc,
                        spb, spl, spi, spr, spc, eps, TOKENS, HEADS, BLOCK_D, HAS_ROPE, STATS_UNROLL, UNROLL,
                        PREFETCH, HELD_STEPS)


# ---------------------------------------------------------------------------------------------------------------
# Launch wrappers
# ---------------------------------------------------------------------------------------------------------------

def _pe_strides(pe: torch.Tensor, batch: int, tokens: int, token_dim: int) -> tuple[int, ...] | None:
    """(batch, token, pair, row, col) strides of a `[B|1, ..., N, D/2, 2, 2]` rotation table, or None if unfit."""
    if pe.dim() != 6 or pe.shape[-2:] != (2, 2) or pe.size(0) not in (1, batch) or pe.size(token_dim) != tokens:
        return None
    return (batch_stride(pe), pe.stride(token_dim), pe.stride(3), pe.stride(4), pe.stride(5))


def _weight_ok(weight: torch.Tensor, size: int) -> bool:
    return weight.dim() == 1 and weight.numel() == size and weight.stride(0) == 1


def _head_threads(block_d: int) -> tuple[int, int]:
    """(lanes, warps) of torch's norm block that hold a head of `block_d` channels (d <= 512: one pass of its 128
    threads); lanes past d hold zeros, which the tree adds exactly."""
    threads = block_d // norm_order.TORCH_VEC
    lanes = min(norm_order.WARP, threads)
    return lanes, threads // lanes


def flux_rms_rope(q: torch.Tensor, k: torch.Tensor, q_scale: torch.Tensor, k_scale: torch.Tensor,
                  pe: torch.Tensor, eps: float = 1e-6, out=None,
                  launch: FluxLaunch = FLUX_LAUNCH) -> tuple[torch.Tensor, torch.Tensor]:
    """Flux QK-norm (per head, weight `scale`) + RoPE on q, k `[B,H,N,D]` (strided views allowed).

    Returns contiguous `[B,H,N,D]` tensors in the input dtype (written into `out=(q_out, k_out)` if given);
    pe is `[B|1, 1, N, D/2, 2, 2]`. Under torch.compile: one custom op (`torch.ops.fused_dit.flux_rms_rope`).
    """
    if compiling() and launch is FLUX_LAUNCH:
        return into_out(_FLUX_RMS_ROPE(q, k, q_scale, k_scale, pe, eps), out)
    op = "rms_rope_flux"
    if not choose(op, q, k, q_scale, k_scale, pe).triton:
        return into_out(flux_reference_comfy(q, k, q_scale, k_scale, pe, eps), out)
    reason = None
    if q.dim() != 4 or q.shape != k.shape or q.dtype != k.dtype:
        reason = f"q {tuple(q.shape)} {q.dtype} and k {tuple(k.shape)} {k.dtype} are not one [B,H,N,D] shape"
    elif q.dtype not in KERNEL_DTYPES or q.size(-1) % 2:
        reason = f"dtype {q.dtype} / head dim {q.size(-1)} not supported by the kernel"
    elif not (_weight_ok(q_scale, q.size(-1)) and _weight_ok(k_scale, q.size(-1))):
        reason = "norm weights are not contiguous [D] vectors"
    elif not norm_order.follows_torch_order(q.size(-1)) or q.size(-1) > norm_order.CHUNK:
        reason = norm_order.OTHER_PATH.format(n=q.size(-1))
    pe_strides = None if reason else _pe_strides(pe, q.size(0), q.size(2), token_dim=2)
    if reason is None and (pe_strides is None or pe.size(1) != 1):
        reason = f"pe {tuple(pe.shape)} is not [B|1, 1, N, D/2, 2, 2]"
    if reason:
        eager_because(op, reason)
        return into_out(flux_reference_comfy(q, k, q_scale, k_scale, pe, eps), out)

    B, H, N, D = q.shape
    if out is None:
        q_out = torch.empty((B, H, N, D), dtype=q.dtype, device=q.device)
        k_out = torch.empty_like(q_out)
    else:
        q_out, k_out = (check_out(o, (B, H, N, D), q.dtype, q.device) for o in out)
    block_d = next_power_of_2(D)
    heads_per_step = min(launch.heads_per_step, next_power_of_2(H))
    lanes, warps = _head_threads(block_d)
    grid = (cdiv(N, launch.tokens_per_program), B, 2 if launch.split_qk else 1)
    launch_args(
        _flux_rms_rope_kernel, grid,
        (q, k, q_scale, k_scale, q_out, k_out, pe, H, N, D, *q.stride(), *k.stride(), *pe_strides, eps),
        {"TOKENS": launch.tokens_per_program, "HEADS": heads_per_step, "BLOCK_D": block_d, "LANES": lanes,
         "WARPS": warps, "SPLIT_QK": launch.split_qk, "PREFETCH": launch.prefetch},
        num_warps=launch.num_warps, enable_fp_fusion=False)  # eager rounds each product: no fma contraction
    return q_out, k_out


def _flux_rms_rope_op(q: torch.Tensor, k: torch.Tensor, q_scale: torch.Tensor, k_scale: torch.Tensor,
                      pe: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return flux_rms_rope(q, k, q_scale, k_scale, pe, eps)


def _flux_rms_rope_fake(q, k, q_scale, k_scale, pe, eps):
    return q.new_empty(q.shape), k.new_empty(k.shape)


_FLUX_RMS_ROPE = register("flux_rms_rope", _flux_rms_rope_op, _flux_rms_rope_fake)


def wan_held_steps(C: int, head_dim: int, launch: WanLaunch = WAN_LAUNCH) -> int:
    """How many 512-channel chunks of a row the Wan kernel holds in registers between its passes (0: it reads the
    row again): all of them where C is a multiple of 512 of at most launch.held_max_steps steps and each chunk is
    whole heads of a power-of-two head_dim."""
    steps, rest = divmod(C, norm_order.CHUNK)
    whole_heads = head_dim & (head_dim - 1) == 0 and norm_order.CHUNK % head_dim == 0
    return steps if not rest and steps <= launch.held_max_steps and whole_heads else 0


def _launch_wan(op, q, k, q_weight, k_weight, freqs, num_heads, eps, out, launch: WanLaunch):
    """One launch over q and k rows; freqs None means norm only. Returns None when the kernel cannot take it."""
    if q.dim() != 3 or k.dim() != 3 or q.size(-1) != k.size(-1) or q.dtype != k.dtype:
        return f"q {tuple(q.shape)} and k {tuple(k.shape)} are not [B, L, C] with one C and dtype"
    C = q.size(-1)
    if q.dtype not in KERNEL_DTYPES:
        return f"dtype {q.dtype} not supported by the kernel"
    if not (_weight_ok(q_weight, C) and _weight_ok(k_weight, C)):
        return "norm weights are not contiguous [C] vectors"
    if not norm_order.follows_torch_order(C):
        return norm_order.OTHER_PATH.format(n=C)
    # the kernel walks C in "heads" of head_dim channels; without a rotation any chunk width will do
    head_dim, pe_strides = launch.norm_chunk, (0, 0, 0, 0, 0)
    if freqs is not None:
        if C % num_heads or (C // num_heads) % 2 or q.shape[:2] != k.shape[:2]:
            return f"C={C} with {num_heads} heads does not give an even head dim, or q/k token counts differ"
        head_dim = C // num_heads
        pe_strides = _pe_strides(freqs, q.size(0), q.size(1), token_dim=1)
        if pe_strides is None or freqs.size(2) != 1 or freqs.size(3) != head_dim // 2:
            return f"freqs {tuple(freqs.shape)} is not [B|1, L, 1, D/2, 2, 2]"
    if out is None:
        q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    else:
        q_out, k_out = (check_out(o.view(x.shape) if o.is_contiguous() else o, x.shape, x.dtype, x.device)
                        for o, x in zip(out, (q, k)))
    heads_per_step = min(launch.heads_per_step, next_power_of_2(cdiv(C, head_dim)))
    rows_q, rows_k = q.size(0) * q.size(1), k.size(0) * k.size(1)
    # a zero-row k (single-tensor norm) gets no programs of its own
    grid = (cdiv(max(rows_q, rows_k), launch.tokens_per_program), 2 if rows_k else 1)
    launch_args(
        _wan_rms_rope_kernel, grid,
        (q, k, q_weight, k_weight, q_out, k_out, freqs if freqs is not None else q, rows_q, rows_k, q.size(1),
         k.size(1), C, head_dim, *q.stride(), *k.stride(), *pe_strides, eps),
        {"TOKENS": launch.tokens_per_program, "HEADS": heads_per_step, "BLOCK_D": next_power_of_2(head_dim),
         "HAS_ROPE": freqs is not None, "STATS_UNROLL": launch.stats_unroll, "UNROLL": launch.loop_unroll,
         "PREFETCH": launch.prefetch, "HELD_STEPS": wan_held_steps(C, head_dim, launch)},
        num_warps=launch.num_warps, enable_fp_fusion=False)  # eager rounds each product: no fma contraction
    return q_out, k_out


def wan_rms_rope(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                 freqs: torch.Tensor, num_heads: int, eps: float = 1e-6,
                 out=None, launch: WanLaunch = WAN_LAUNCH) -> tuple[torch.Tensor, torch.Tensor]:
    """Wan self-attention: RMSNorm over the full C of q, k `[B, L, C]`, then RoPE per head.

    Returns contiguous `[B, L, H, D]` (or writes `out=(q_out, k_out)`); freqs is `[B|1, L, 1, D/2, 2, 2]`.
    Under torch.compile: one custom op (`torch.ops.fused_dit.wan_rms_rope`).
    """
    if compiling() and launch is WAN_LAUNCH:
        return into_out(_WAN_RMS_ROPE(q, k, q_weight, k_weight, freqs, num_heads, eps), out)
    op = "rms_rope_wan"
    if choose(op, q, k, q_weight, k_weight, freqs).triton:
        result = _launch_wan(op, q, k, q_weight, k_weight, freqs, num_heads, eps, out, launch)
        if not isinstance(result, str):
            b, s, c = q.shape
            return tuple(t.view(b, s, num_heads, c // num_heads) for t in result)
        eager_because(op, result)
    return into_out(wan_reference_comfy(q, k, q_weight, k_weight, freqs, num_heads, eps), out)


def wan_rms_norm_qk(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                    eps: float = 1e-6, out=None, launch: WanLaunch = WAN_LAUNCH) -> tuple[torch.Tensor, torch.Tensor]:
    """Wan cross-attention: norm_q(q) and norm_k(k) over the full C in one launch (q and k may differ in L)."""
    if compiling() and launch is WAN_LAUNCH:
        return into_out(_WAN_RMS_NORM_QK(q, k, q_weight, k_weight, eps), out)
    op = "rms_norm_wan"
    if choose(op, q, k, q_weight, k_weight).triton:
        result = _launch_wan(op, q, k, q_weight, k_weight, None, 1, eps, out, launch)
        if not isinstance(result, str):
            return result
        eager_because(op, result)
    return into_out((wan_norm_reference_comfy(q, q_weight, eps), wan_norm_reference_comfy(k, k_weight, eps)), out)


def wan_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, out=None,
                 launch: WanLaunch = WAN_LAUNCH) -> torch.Tensor:
    """One full-C RMSNorm (`[B, L, C]`), e.g. norm_k_img."""
    if compiling() and launch is WAN_LAUNCH:
        return into_out(_WAN_RMS_NORM(x, weight, eps), out)
    op = "rms_norm_wan"
    if choose(op, x, weight).triton:
        # the kernel has a q and a k slot; an empty k launches no programs
        empty = x[:, :0]
        result = _launch_wan(op, x, empty, weight, weight, None, 1, eps,
                             None if out is None else (out, torch.empty_like(empty)), launch)
        if not isinstance(result, str):
            return result[0]
        eager_because(op, result)
    return into_out(wan_norm_reference_comfy(x, weight, eps), out)


def _wan_rms_rope_op(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                     freqs: torch.Tensor, num_heads: int, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return wan_rms_rope(q, k, q_weight, k_weight, freqs, num_heads, eps)


def _wan_rms_rope_fake(q, k, q_weight, k_weight, freqs, num_heads, eps):
    return tuple(x.new_empty((*x.shape[:2], num_heads, x.shape[2] // num_heads)) for x in (q, k))


def _wan_rms_norm_qk_op(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                        eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return wan_rms_norm_qk(q, k, q_weight, k_weight, eps)


def _wan_rms_norm_qk_fake(q, k, q_weight, k_weight, eps):
    return q.new_empty(q.shape), k.new_empty(k.shape)


def _wan_rms_norm_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return wan_rms_norm(x, weight, eps)


def _wan_rms_norm_fake(x, weight, eps):
    return x.new_empty(x.shape)


_WAN_RMS_ROPE = register("wan_rms_rope", _wan_rms_rope_op, _wan_rms_rope_fake)
_WAN_RMS_NORM_QK = register("wan_rms_norm_qk", _wan_rms_norm_qk_op, _wan_rms_norm_qk_fake)
_WAN_RMS_NORM = register("wan_rms_norm", _wan_rms_norm_op, _wan_rms_norm_fake)
