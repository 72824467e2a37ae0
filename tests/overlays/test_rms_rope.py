"""Fused QK RMSNorm + RoPE (Flux per-head BHND, Wan full-C BNHD, Wan norm-only) against both references."""
from __future__ import annotations

import logging
import math
from dataclasses import replace

import pytest
import torch

from fused_dit.dispatch import choose
from fused_dit.ops import rms_rope
from fused_dit.testing import assert_close_fp32, generator, poisoned_empty


def rotation_table(leading, half, gen):
    angle = (torch.rand((*leading, half), generator=gen) * 2 - 1) * math.pi
    return torch.stack([angle.cos(), -angle.sin(), angle.sin(), angle.cos()], dim=-1).view(*leading, half, 2, 2)


def flux_inputs(B, H, N, D, pe_batch, gen, dtype=torch.float32):
    qkv = (torch.randn(B, N, 3 * H * D, generator=gen) * 3).to(dtype)
    q, k, _ = qkv.view(B, N, 3, H, D).permute(2, 0, 3, 1, 4)   # strided views of packed qkv, as in Flux
    scales = [(torch.randn(D, generator=gen) * 0.2 + 1).to(dtype) for _ in range(2)]
    return q, k, *scales, rotation_table((pe_batch, 1, N), D // 2, gen)


def wan_inputs(B, L, H, D, pe_batch, gen, dtype=torch.float32):
    q, k = ((torch.randn(B, L, H * D, generator=gen) * 3).to(dtype) for _ in range(2))
    weights = [(torch.randn(H * D, generator=gen) * 0.2 + 1).to(dtype) for _ in range(2)]
    return q, k, *weights, rotation_table((pe_batch, L, 1), D // 2, gen)


@pytest.mark.parametrize("B,H,N,D,pe_batch", [(2, 3, 37, 64, 1), (2, 2, 37, 128, 2), (1, 2, 16, 64, 1)])
def test_flux_kernel_matches_comfy_chain_and_fp64_and_writes_every_element(B, H, N, D, pe_batch, seed):
    q, k, sq, sk, pe = flux_inputs(B, H, N, D, pe_batch, generator(seed))
    assert not q.is_contiguous()
    out = (poisoned_empty((B, H, N, D), q.dtype), poisoned_empty((B, H, N, D), q.dtype))
    q_out, k_out = rms_rope.flux_rms_rope(q, k, sq, sk, pe, out=out)
    assert q_out is out[0] and k_out is out[1]
    for got, comfy, exact in zip((q_out, k_out), rms_rope.flux_reference_comfy(q, k, sq, sk, pe),
                                 rms_rope.flux_reference_fp32(q, k, sq, sk, pe)):
        assert_close_fp32(got, comfy, "vs ComfyUI chain")
        assert_close_fp32(got, exact, "vs fp64")


@pytest.mark.parametrize("tokens", [2, 8])
def test_flux_kernel_with_q_and_k_in_separate_programs_writes_the_same_bits(tokens, seed):
    q, k, sq, sk, pe = flux_inputs(2, 3, 37, 64, 2, generator(seed))
    launch = replace(rms_rope.FLUX_LAUNCH, tokens_per_program=tokens)
    together = rms_rope.flux_rms_rope(q, k, sq, sk, pe, launch=launch)
    out = (poisoned_empty((2, 3, 37, 64), q.dtype), poisoned_empty((2, 3, 37, 64), q.dtype))
    apart = rms_rope.flux_rms_rope(q, k, sq, sk, pe, out=out, launch=replace(launch, split_qk=True))
    for got, expected in zip(apart, together):
        assert torch.equal(got.view(torch.int32), expected.view(torch.int32))


@pytest.mark.parametrize("heads_per_step", [2, 4])
def test_flux_prefetching_the_next_heads_keeps_the_bits(heads_per_step, seed):
    """Loading the next head step before storing this one changes when loads are issued, not the values (H=3 with
    2 heads per step: a partial last step)."""
    q, k, sq, sk, pe = flux_inputs(2, 3, 11, 64, 1, generator(seed))
    launch = replace(rms_rope.FLUX_LAUNCH, heads_per_step=heads_per_step)
    plain = rms_rope.flux_rms_rope(q, k, sq, sk, pe, launch=replace(launch, prefetch=False))
    out = (poisoned_empty((2, 3, 11, 64), q.dtype), poisoned_empty((2, 3, 11, 64), q.dtype))
    for got, expected in zip(rms_rope.flux_rms_rope(q, k, sq, sk, pe, out=out,
                                                    launch=replace(launch, prefetch=True)), plain):
        assert torch.equal(got, expected)


def test_flux_returns_contiguous_bhnd_in_input_dtype(seed):
    q, k, sq, sk, pe = flux_inputs(1, 2, 5, 64, 1, generator(seed))
    q_out, k_out = rms_rope.flux_rms_rope(q, k, sq, sk, pe)
    assert q_out.shape == (1, 2, 5, 64) and q_out.is_contiguous() and q_out.dtype == q.dtype


@pytest.mark.parametrize("B,L,H,D,pe_batch", [(2, 37, 4, 32, 1), (2, 19, 3, 64, 2)])
def test_wan_kernel_norms_full_c_then_ropes_per_head(B, L, H, D, pe_batch, seed):
    q, k, wq, wk, freqs = wan_inputs(B, L, H, D, pe_batch, generator(seed))
    out = (poisoned_empty((B, L, H, D), q.dtype), poisoned_empty((B, L, H, D), q.dtype))
    q_out, k_out = rms_rope.wan_rms_rope(q, k, wq, wk, freqs, H, out=out)
    assert q_out.shape == (B, L, H, D)
    for got, comfy, exact in zip((q_out, k_out), rms_rope.wan_reference_comfy(q, k, wq, wk, freqs, H),
                                 rms_rope.wan_reference_fp32(q, k, wq, wk, freqs, H)):
        assert_close_fp32(got, comfy, "vs ComfyUI chain")
        assert_close_fp32(got, exact, "vs fp64")


@pytest.mark.parametrize("schedule", [{}, {"prefetch": True}, {"loop_unroll": 2}, {"stats_unroll": 3},
                                      {"held_max_steps": 0}])
# 640 and 108 channels: tails in both loops; 1024 channels of 64-channel heads: held in registers (2 chunks)
@pytest.mark.parametrize("H,D", [(5, 128), (3, 36), (16, 64)])
def test_wan_loop_schedules_keep_the_bits(schedule, H, D, seed):
    """Prefetching the next chunk, unrolling and holding the row in registers change when loads are issued, not
    the values: the shipped schedule ({}) and each variant equal the plain loops bit for bit."""
    q, k, wq, wk, freqs = wan_inputs(2, 7, H, D, 1, generator(seed))
    out = (poisoned_empty((2, 7, H, D), q.dtype), poisoned_empty((2, 7, H, D), q.dtype))
    shipped = rms_rope.wan_rms_rope(q, k, wq, wk, freqs, H, out=out) if not schedule else None
    plain_loops = replace(rms_rope.WAN_LAUNCH, prefetch=False, stats_unroll=1, loop_unroll=1, held_max_steps=0)
    plain = rms_rope.wan_rms_rope(q, k, wq, wk, freqs, H, launch=plain_loops)
    got = shipped or rms_rope.wan_rms_rope(q, k, wq, wk, freqs, H, out=out, launch=replace(plain_loops, **schedule))
    for a, b in zip(got, plain):
        assert torch.equal(a, b)


@pytest.mark.parametrize("C,head_dim,steps", [(5120, 128, 10), (1024, 64, 2), (1024, 96, 0), (640, 128, 0),
                                              (9216, 128, 0)])
def test_wan_holds_rows_of_whole_head_chunks_up_to_the_limit(C, head_dim, steps):
    assert rms_rope.wan_held_steps(C, head_dim) == steps


def test_wan_norm_only_holds_the_row_and_keeps_the_bits(seed):
    """The cross-attention norm (no rotation) walks 1024 channels as 2 held chunks: the same bits as reading the
    row again."""
    gen = generator(seed)
    q, k = torch.randn(2, 5, 1024, generator=gen), torch.randn(2, 3, 1024, generator=gen)
    wq, wk = torch.rand(1024, generator=gen) + 0.5, torch.rand(1024, generator=gen) + 0.5
    held = rms_rope.wan_rms_norm_qk(q, k, wq, wk, out=(poisoned_empty(q.shape, q.dtype),
                                                       poisoned_empty(k.shape, k.dtype)))
    read_twice = replace(rms_rope.WAN_LAUNCH, held_max_steps=0)
    for got, expected in zip(held, rms_rope.wan_rms_norm_qk(q, k, wq, wk, launch=read_twice)):
        assert torch.equal(got, expected)
    assert_close_fp32(held[0], rms_rope.wan_norm_reference_comfy(q, wq))


def test_wan_norm_is_not_a_per_head_norm(seed):
    """Guards the trap other packs fell into: Wan's norm spans all heads, so a per-head norm must differ."""
    q, k, wq, wk, freqs = wan_inputs(1, 8, 4, 32, 1, generator(seed))
    q_out, _ = rms_rope.wan_rms_rope(q, k, wq, wk, freqs, 4)
    per_head = rms_rope._comfy_rope(torch.nn.functional.rms_norm(q.view(1, 8, 4, 32), (32,), eps=1e-6)
                                    * wq.view(4, 32), freqs)
    assert (q_out - per_head).abs().max() > 1e-3


def test_wan_cross_attention_norms_q_and_k_of_different_lengths_in_one_call(seed):
    gen = generator(seed)
    q, k = torch.randn(2, 37, 96, generator=gen), torch.randn(2, 5, 96, generator=gen)
    wq, wk = torch.rand(96, generator=gen) + 0.5, torch.rand(96, generator=gen) + 0.5
    out = (poisoned_empty(q.shape, q.dtype), poisoned_empty(k.shape, k.dtype))
    q_out, k_out = rms_rope.wan_rms_norm_qk(q, k, wq, wk, out=out)
    assert_close_fp32(q_out, rms_rope.wan_norm_reference_comfy(q, wq))
    assert_close_fp32(k_out, rms_rope.wan_norm_reference_fp32(k, wk))
    single = rms_rope.wan_rms_norm(k, wk, out=poisoned_empty(k.shape, k.dtype))
    assert_close_fp32(single, rms_rope.wan_norm_reference_comfy(k, wk))


def test_forced_eager_backend_runs_the_comfy_chain_exactly(monkeypatch, seed):
    monkeypatch.setenv("FUSED_DIT_BACKEND", "eager")
    q, k, sq, sk, pe = flux_inputs(1, 2, 9, 64, 1, generator(seed), dtype=torch.bfloat16)
    assert choose("rms_rope_flux", q, k).reason == "FUSED_DIT_BACKEND=eager"
    got = rms_rope.flux_rms_rope(q, k, sq, sk, pe)
    for g, r in zip(got, rms_rope.flux_reference_comfy(q, k, sq, sk, pe)):
        assert torch.equal(g, r)
    qw, kw, wq, wk, freqs = wan_inputs(1, 9, 2, 32, 1, generator(seed), dtype=torch.bfloat16)
    for g, r in zip(rms_rope.wan_rms_rope(qw, kw, wq, wk, freqs, 2),
                    rms_rope.wan_reference_comfy(qw, kw, wq, wk, freqs, 2)):
        assert torch.equal(g, r)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU interpreter's dispatch")
def test_dispatch_sends_cpu_tensors_to_the_interpreter():
    choice = choose("rms_rope_flux", torch.zeros(1))
    assert choice.triton and choice.reason == "TRITON_INTERPRET=1 on CPU"


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tensors reach the kernel path only in the interpreter")
def test_unsupported_dtype_falls_back_to_eager_and_says_why(caplog, seed):
    q, k, sq, sk, pe = flux_inputs(1, 2, 4, 64, 1, generator(seed), dtype=torch.float64)
    with caplog.at_level(logging.INFO, logger="fused_dit"):
        got = rms_rope.flux_rms_rope(q, k, sq, sk, pe)
    assert torch.equal(got[0], rms_rope.flux_reference_comfy(q, k, sq, sk, pe)[0])
    assert "dtype torch.float64" in caplog.text
