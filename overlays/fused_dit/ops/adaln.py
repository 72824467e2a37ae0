"""AdaLN modulation, fused: `torch.addcmul(shift, LayerNorm(x), 1 + scale)` in one kernel.

Rounding points follow ComfyUI's eager chain: LayerNorm (no affine) rounds to x's dtype, `1 + scale` rounds to
scale's dtype, and addcmul rounds once to the promoted dtype. Modulation rows broadcast per sample (`[B|1, 1, C]`),
per token (`[B, L, C]`) or per group of tokens as Wan's `repeat_e` expands them (row = token // group).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..dispatch import choose
from ..launch import launch_args
from ..library import compiling, register
from . import (KERNEL_DTYPES, TuningRecord, as_batch_rows_channels, batch_stride, cdiv, check_out, eager_because,
               into_out, modulation_group, norm_order, repeat_rows_like_comfy)

try:
    import triton
    import triton.language as tl
except Exception:  # the eager path must keep working without triton; dispatch says why
    triton = None



@dataclass(frozen=True)
class AdalnLaunch:
    """The kernel's launch setting. Pass another (dataclasses.replace(LAUNCH, ...)) to `adaln` to sweep one."""
    rows_per_program: int = 2
    num_warps: int = 2
    # False: the general Welford tree also where the pair-sum fold applies (norm_order.halves_are_exact), to compare
    equal_halves: bool = True
    # the loops over a row's 512-channel steps unrolled (statistics pass, normalising pass) and software-pipelined
    # over loop_stages stages (None: not pipelined), so that a program has more than one step's loads in flight
    stats_unroll: int = 2
    loop_unroll: int = 2
    loop_stages: int | None = None
    # the normalising pass loads each chunk one step ahead of its stores
    prefetch: bool = True
    # rows of at most this many 512-channel steps (a multiple of 512 channels) are held in registers between the
    # two passes instead of being read again (0: never)
    held_max_steps: int = 8
    # held rows: the modulation of this many steps ahead is loaded before the current step's store
    mod_ahead: int = 1
    # False: every row loads its own shift/scale even where all rows of a program share them (shared_modulation)
    shared_modulation: bool = True


LAUNCH = AdalnLaunch()
TUNING = TuningRecord(
    chosen="2 rows x 2 warps, unrolled 2/2, prefetch, rows of <= 8 steps held, modulation 1 step ahead",
    runner_up="modulation 2 steps ahead (L=4096, 8192); 1 row per program (L=16384)",
    date="2026-11-30", results="kernels-sweep.json: ops.adaln")


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
    def _modulation(shift_ptr, scale_ptr, b, l_idx, c, mask, C, shift_group, scale_group, shb, shr, shc, scb, scr,
                    scc, SHARED: tl.constexpr):
        """(shift, 1 + scale) in fp32 for a tile of rows (samples b, tokens l_idx) and channels c.

        SHARED: every row of the tile has the modulation row of the first (shared_modulation), loaded once as
        `[1, channels]` and broadcast, so `1 + scale` is computed once per channel rather than once per element.
        """
        if SHARED:
            # the tile's rows are consecutive tokens of one sample: its first row's sample and token
            b0 = tl.min(b, axis=0)
            l0 = tl.min(l_idx, axis=0)
            shift_offsets = (b0 * shb + (l0 // shift_group) * shr + c * shc)[None, :]
            scale_offsets = (b0 * scb + (l0 // scale_group) * scr + c * scc)[None, :]
            mod_mask = (c < C)[None, :]
        else:
            shift_offsets = b[:, None] * shb + (l_idx // shift_group)[:, None] * shr + c[None, :] * shc
            scale_offsets = b[:, None] * scb + (l_idx // scale_group)[:, None] * scr + c[None, :] * scc
            mod_mask = mask
        shift = tl.load(shift_ptr + shift_offsets, mask=mod_mask, other=0.0).to(tl.float32)
        scale = tl.load(scale_ptr + scale_offsets, mask=mod_mask, other=0.0).to(tl.float32)
        # `1 + scale` is a tensor of scale's dtype in the eager chain
        return shift, (scale + 1.0).to(scale_ptr.dtype.element_ty).to(tl.float32)

    @triton.jit
    def _store_modulated(normed, shift, scale_plus_one, x_ptr, out_ptr, r, c, mask, C):
        """`addcmul(shift, normed, 1 + scale)` for a tile of rows r and channels c, stored to out."""
        # LayerNorm's output is a tensor of x's dtype in the eager chain
        normed = normed.to(x_ptr.dtype.element_ty).to(tl.float32)
        # torch's CUDA addcmul is one fma (exactly mul + add when both factors are 16-bit; not for fp32)
        out = tl.fma(normed, scale_plus_one, shift)
        tl.store(out_ptr + r[:, None] * C + c[None, :], out.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _modulate_store(normed, x_ptr, shift_ptr, scale_ptr, out_ptr, r, b, l_idx, c, mask, C,
                        shift_group, scale_group, shb, shr, shc, scb, scr, scc, SHARED: tl.constexpr):
        """_modulation, then _store_modulated."""
        shift, scale_plus_one = _modulation(shift_ptr, scale_ptr, b, l_idx, c, mask, C, shift_group, scale_group,
                                            shb, shr, shc, scb, scr, scc, SHARED)
        _store_modulated(normed, shift, scale_plus_one, x_ptr, out_ptr, r, c, mask, C)

    @triton.jit
    def _welford_chunk(mean, m2, x, step, C, rcp_ptr, ROWS: tl.constexpr, T: tl.constexpr, EVEN: tl.constexpr):
        """Welford's online update of each of torch's T threads with its vector of the chunk `step` (`[ROWS, T*4]`)."""
        x0, x1, x2, x3 = norm_order.elements_of_vectors(x.to(tl.float32), ROWS, T)
        if EVEN:
            valid = tl.full([1, T], 1, tl.int1)
        else:
            valid = (tl.arange(0, T) + step * T < C // 4)[None, :]
        # 1 / the thread's count after each element, the same for every thread that has this vector: from a table
        # (IEEE quotients, as torch's 1.f / count), not a division per step with its slow-path call
        count = step * 4
        mean, m2 = norm_order.welford_push(mean, m2, x0, tl.load(rcp_ptr + count), valid)
        mean, m2 = norm_order.welford_push(mean, m2, x1, tl.load(rcp_ptr + count + 1), valid)
        mean, m2 = norm_order.welford_push(mean, m2, x2, tl.load(rcp_ptr + count + 2), valid)
        return norm_order.welford_push(mean, m2, x3, tl.load(rcp_ptr + count + 3), valid)

    @triton.jit
    def _adaln_kernel(x_ptr, shift_ptr, scale_ptr, out_ptr, rcp_ptr, rows, L, C, shift_group, scale_group,
                      sxb, sxl, sxc, shb, shr, shc, scb, scr, scc, eps,
                      ROWS: tl.constexpr, EVEN: tl.constexpr, EQUAL_HALVES: tl.constexpr,
                      SHARED_MOD: tl.constexpr, STATS_UNROLL: tl.constexpr, UNROLL: tl.constexpr,
                      STAGES: tl.constexpr, PREFETCH: tl.constexpr, HELD_STEPS: tl.constexpr,
                      MOD_AHEAD: tl.constexpr):
        """Rows of C % 4 == 0 channels: mean and variance in torch's Welford order, so LayerNorm's output is
        eager's bits (EVEN: C is a multiple of the 512 channels torch's block reads per step, no masks;
        EQUAL_HALVES: norm_order.halves_are_exact(C), the per-thread states fold by pair sums; SHARED_MOD: the
        program's rows share one modulation row, see shared_modulation).

        Pass 1 walks the row as torch's 128 threads do (4 channels each per step) with Welford's online update;
        the per-thread states fold lane-then-warp. Pass 2 reads the (cache-resident) row again in the same chunks,
        or, with HELD_STEPS = C / 512 (EVEN rows of few steps), uses the chunks pass 1 loaded, kept in registers.
        """
        T: tl.constexpr = norm_order.THREADS
        r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        row_mask = r < rows
        l_idx = r % L
        b = r // L
        x_rows = x_ptr + b[:, None] * sxb + l_idx[:, None] * sxl
        mean = tl.zeros([ROWS, T], dtype=tl.float32)
        m2 = tl.zeros([ROWS, T], dtype=tl.float32)
        if HELD_STEPS:
            chunks = ()
            for step in tl.static_range(HELD_STEPS):
                c = tl.arange(0, T * 4) + step * (T * 4)
                x = tl.load(x_rows + c[None, :] * sxc, mask=row_mask[:, None], other=0.0)
                chunks = chunks + (x,)
                mean, m2 = _welford_chunk(mean, m2, x, step, C, rcp_ptr, ROWS, T, True)
        else:
            for step in tl.range(0, tl.cdiv(C, T * 4), loop_unroll_factor=STATS_UNROLL, num_stages=STAGES):
                c = tl.arange(0, T * 4) + step * (T * 4)
                x = tl.load(x_rows + c[None, :] * sxc, mask=row_mask[:, None] & (c < C)[None, :], other=0.0)
                mean, m2 = _welford_chunk(mean, m2, x, step, C, rcp_ptr, ROWS, T, EVEN)
        if EQUAL_HALVES:
            # every thread holds 4 elements per step: the general tree's layout shuffles (and its registers) are
            # not needed. sm_90a compiles (scripts/adaln_registers.py): 84 against 178 registers at 8 rows x 4 warps
            # before the loop schedules; with the shipped ones at 2 rows x 2 warps 126 against 255 and spills
            # (adaln-registers-sm90a-2026-11-30-held.json)
            mean, m2 = norm_order.fold_welford_equal(mean, m2, (C // (T * 4)) * 4.0, ROWS, T)
        else:
            t = tl.arange(0, T)
            counts = 4.0 * tl.maximum((C // 4 - t + T - 1) // T, 0).to(tl.float32)
            mean, m2 = norm_order.fold_welford(mean, m2, tl.zeros([ROWS, T], dtype=tl.float32) + counts[None, :],
                                               ROWS, T)
        rstd = tl.rsqrt(tl.math.div_rn(m2, C * 1.0) + eps)
        if HELD_STEPS:
            # the modulation of MOD_AHEAD steps past the one being stored is loaded before its store (loads stay
            # after stores that may alias them): tuples of (shift, 1 + scale) per step
            mods = ()
            for step in tl.static_range(MOD_AHEAD):
                if step < HELD_STEPS:
                    c = tl.arange(0, T * 4) + step * (T * 4)
                    mods = mods + (_modulation(shift_ptr, scale_ptr, b, l_idx, c, row_mask[:, None], C,
                                               shift_group, scale_group, shb, shr, shc, scb, scr, scc, SHARED_MOD),)
            for step in tl.static_range(HELD_STEPS):
                if step + MOD_AHEAD < HELD_STEPS:
                    c = tl.arange(0, T * 4) + (step + MOD_AHEAD) * (T * 4)
                    mods = mods + (_modulation(shift_ptr, scale_ptr, b, l_idx, c, row_mask[:, None], C,
                                               shift_group, scale_group, shb, shr, shc, scb, scr, scc, SHARED_MOD),)
                c = tl.arange(0, T * 4) + step * (T * 4)
                shift, scale_plus_one = mods[step]
                _store_modulated(rstd[:, None] * (chunks[step].to(tl.float32) - mean[:, None]), shift,
                                 scale_plus_one, x_ptr, out_ptr, r, c, row_mask[:, None], C)
        elif PREFETCH:
            # the next step's chunk is loaded before this one is stored: the compiler keeps loads after stores
            # that may alias them, so without this a program has one chunk in flight (past C: masked, no traffic)
            c = tl.arange(0, T * 4)
            mask = row_mask[:, None] & (c < C)[None, :]
            x = tl.load(x_rows + c[None, :] * sxc, mask=mask, other=0.0)
            for step in tl.range(0, tl.cdiv(C, T * 4), loop_unroll_factor=UNROLL, num_stages=STAGES):
                c_next = c + T * 4
                mask_next = row_mask[:, None] & (c_next < C)[None, :]
                x_next = tl.load(x_rows + c_next[None, :] * sxc, mask=mask_next, other=0.0)
                _modulate_store(rstd[:, None] * (x.to(tl.float32) - mean[:, None]), x_ptr, shift_ptr, scale_ptr,
                                out_ptr, r, b, l_idx, c, mask, C, shift_group, scale_group, shb, shr, shc, scb, scr,
                                scc, SHARED_MOD)
                x, c, mask = x_next, c_next, mask_next
        else:
            for step in tl.range(0, tl.cdiv(C, T * 4), loop_unroll_factor=UNROLL, num_stages=STAGES):
                c = tl.arange(0, T * 4) + step * (T * 4)
                mask = row_mask[:, None] & (c < C)[None, :]
                x = tl.load(x_rows + c[None, :] * sxc, mask=mask, other=0.0).to(tl.float32)
                _modulate_store(rstd[:, None] * (x - mean[:, None]), x_ptr, shift_ptr, scale_ptr, out_ptr, r, b,
                                l_idx, c, mask, C, shift_group, scale_group, shb, shr, shc, scb, scr, scc, SHARED_MOD)


def adaln(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float = 1e-6,
          out: torch.Tensor | None = None, launch: AdalnLaunch = LAUNCH) -> torch.Tensor:
    """`addcmul(shift, LayerNorm(x), 1 + scale)` for x `[B, L, C]`; shift/scale `[B|1, rows, C]` or `[B, C]`.

    Returns a contiguous `[B, L, C]` tensor of the promoted dtype (x's dtype when the modulation shares it).
    Under torch.compile: one custom op (`torch.ops.fused_dit.adaln`, the default launch setting).
    """
    if compiling() and launch is LAUNCH:
        return into_out(_ADALN(x, shift, scale, eps), out)
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
            if reason is None and not norm_order.follows_torch_order(x.size(-1)):
                reason = norm_order.OTHER_PATH.format(n=x.size(-1))
            if reason is None:
                reciprocals = norm_order.count_reciprocals(norm_order.steps(x.size(-1)) * norm_order.TORCH_VEC,
                                                           x.device)
                if reciprocals is None:
                    reason = norm_order.RECIPROCALS_WHILE_CAPTURING.format(n=x.size(-1))
        if reason is None:
            return _launch(x, shift3, scale3, groups, reciprocals, eps, out, launch)
        eager_because(op, reason)
    return into_out(reference_comfy(x, shift, scale, eps), out)


def _adaln_op(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    return adaln(x, shift, scale, eps)


def _adaln_fake(x, shift, scale, eps):
    dtype = torch.promote_types(torch.promote_types(x.dtype, shift.dtype), scale.dtype)
    return x.new_empty(x.shape, dtype=dtype)


_ADALN = register("adaln", _adaln_op, _adaln_fake)


def shared_modulation(tokens: int, groups, rows_per_program: int) -> bool:
    """Whether all rows of every program read the same shift and scale rows.

    A program's rows are `rows_per_program` consecutive rows starting at a multiple of it; with tokens per sample
    and tokens per modulation row (`groups`, e.g. all tokens for Flux's per-sample `[B, 1, C]`) multiples of it,
    they lie in one sample and one modulation group.
    """
    return all(n % rows_per_program == 0 for n in (tokens, *groups))


def _launch(x, shift, scale, groups, reciprocals, eps, out, launch: AdalnLaunch):
    B, L, C = x.shape
    out_dtype = torch.promote_types(torch.promote_types(x.dtype, shift.dtype), scale.dtype)
    if out is None:
        out = torch.empty((B, L, C), dtype=out_dtype, device=x.device)
    else:
        check_out(out, (B, L, C), out_dtype, x.device)
    rows = B * L
    args = (x, shift, scale, out, reciprocals, rows, L, C, groups[0], groups[1], *x.stride(),
            batch_stride(shift), shift.stride(1), shift.stride(2), batch_stride(scale), scale.stride(1),
            scale.stride(2), eps)
    # no fma contraction beyond the explicit ones, which are torch's
    launch_args(_adaln_kernel, (cdiv(rows, launch.rows_per_program),), args, kernel_constexprs(C, L, groups, launch),
                num_warps=launch.num_warps, enable_fp_fusion=False)
    return out


def kernel_constexprs(C: int, tokens: int, groups, launch: AdalnLaunch = LAUNCH,
                      rows_per_program: int | None = None) -> dict:
    """The kernel's compile-time parameters for rows of C channels, `tokens` per sample and modulation `groups`,
    under `launch` (with `rows_per_program` in place of its own, where given; scripts/adaln_registers.py compiles
    the kernel with these too)."""
    rows_per_program = launch.rows_per_program if rows_per_program is None else rows_per_program
    even = C % norm_order.CHUNK == 0
    return {"ROWS": rows_per_program, "EVEN": even,
            "EQUAL_HALVES": launch.equal_halves and norm_order.halves_are_exact(C),
            "SHARED_MOD": launch.shared_modulation and shared_modulation(tokens, groups, rows_per_program),
            "STATS_UNROLL": launch.stats_unroll, "UNROLL": launch.loop_unroll, "STAGES": launch.loop_stages,
            "PREFETCH": launch.prefetch,
            "HELD_STEPS": C // norm_order.CHUNK if even and C // norm_order.CHUNK <= launch.held_max_steps else 0,
            "MOD_AHEAD": launch.mod_ahead}
