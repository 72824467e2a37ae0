"""Norm statistics in torch's CUDA order (ops/norm_order.py) and the fused ops that use them.

On CPU the kernels run in the interpreter, whose float32 arithmetic (explicit fmas, IEEE division, 1/sqrt) is the
emulation's, so a kernel that folds in another order shows up as different bits here. The GPU test holds the
emulation to torch's own CUDA kernels (benchmarks/norm_order_probe.py records the same at more sizes).
"""
from __future__ import annotations

import logging
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from fused_dit.dispatch import choose
from fused_dit.ops import adaln, norm_order, rms_rope
from fused_dit.testing import byte_mismatch, generator

LENGTHS = [4, 64, 128, 516, 1540, 3072]


def _rows(n, gen, rows=6, device="cpu"):
    return (torch.randn(rows, n, generator=gen) * 1.7 + 0.4).to(device)


@pytest.mark.parametrize("n", LENGTHS)
def test_emulated_statistics_are_the_row_statistics(n, seed):
    x = _rows(n, generator(seed))
    x64 = x.double()
    mean, var = norm_order.layer_norm_stats_emulated(x)
    assert torch.allclose(mean.double(), x64.mean(-1), rtol=1e-5, atol=1e-6)
    assert torch.allclose(var.double(), x64.var(-1, unbiased=False), rtol=1e-5)
    assert torch.allclose(norm_order.rms_stat_emulated(x).double(), x64.square().mean(-1), rtol=1e-5)


def test_the_order_matters_in_the_last_bits():
    """The emulation is not a plain sum: on enough rows its float32 results differ from torch's CPU reduction."""
    x = _rows(3072, generator(7), rows=256)
    ours = norm_order.rms_stat_emulated(x)
    plain = x.square().mean(-1)
    assert torch.allclose(ours, plain, rtol=1e-6)
    assert not torch.equal(ours, plain)


def _bits_equal(a, b):
    return byte_mismatch(a, b)[0] == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs torch's CUDA kernels")
@pytest.mark.parametrize("n", [128, 1536, 3072, 5120])
def test_emulation_reproduces_torch_cuda_bit_for_bit(n, seed):
    x = _rows(n, generator(seed), rows=2048, device="cuda").bfloat16()
    _, mean, rstd = torch.native_layer_norm(x, [n], None, None, 1e-6)
    ours_mean, ours_var = norm_order.layer_norm_stats_emulated(x)
    assert _bits_equal(ours_mean, mean.view(-1))
    assert _bits_equal(torch.rsqrt(ours_var + 1e-6), rstd.view(-1))
    w = torch.ones(n, device="cuda", dtype=torch.bfloat16)
    rstd_rms = torch.rsqrt(norm_order.rms_stat_emulated(x) + 1e-6)
    assert torch.equal((rstd_rms[:, None] * x.float()).bfloat16(), F.rms_norm(x, (n,), weight=w, eps=1e-6))


def _adaln_from_emulation(x, shift, scale, eps=1e-6):
    rows = x.reshape(-1, x.size(-1))
    mean, var = norm_order.layer_norm_stats_emulated(rows)
    normed = torch.rsqrt(var + eps)[:, None] * (rows - mean[:, None])
    return norm_order._fma(normed.view(x.shape), 1 + scale, shift)   # addcmul: one fma on CUDA


@pytest.mark.parametrize("C", [64, 516, 1540, 1024, 1536])   # 1024, 1536: the pair-sum tree (equal counts)
def test_adaln_kernel_folds_in_torch_order(C, seed, device):
    if device != "cpu":
        pytest.skip("bit equality with the CPU emulation holds in the interpreter; on a GPU the gates check it")
    gen = generator(seed)
    x = torch.randn(2, 5, C, generator=gen) * 2 + 0.3
    shift, scale = torch.randn(2, 1, C, generator=gen) * 0.5, torch.randn(2, 1, C, generator=gen) * 0.5
    assert choose("adaln", x, shift, scale).triton
    assert _bits_equal(adaln.adaln(x, shift, scale), _adaln_from_emulation(x, shift, scale))


def test_pair_sum_tree_applies_to_rows_of_whole_512_channel_steps():
    assert norm_order.halves_are_exact(3072) and norm_order.halves_are_exact(5120)
    assert not norm_order.halves_are_exact(3068) and not norm_order.halves_are_exact(1540)


@pytest.mark.parametrize("C", [1024, 1536])
def test_pair_sum_tree_gives_the_general_trees_bits(C, seed, device):
    gen = generator(seed)
    x = (torch.randn(2, 9, C, generator=gen) * 3 + 1.1).to(device)
    shift, scale = (torch.randn(2, 1, C, generator=gen) * 0.5).to(device), torch.zeros(2, 1, C).to(device)
    fast = adaln.adaln(x, shift, scale)
    general = replace(adaln.LAUNCH, equal_halves=False)
    assert _bits_equal(fast, adaln.adaln(x, shift, scale, launch=general))


def test_flux_and_wan_norms_fold_in_torch_order(seed, device):
    if device != "cpu":
        pytest.skip("bit equality with the CPU emulation holds in the interpreter; on a GPU the gates check it")
    gen = generator(seed)
    C = 1540
    q, k = torch.randn(2, 3, C, generator=gen), torch.randn(2, 3, C, generator=gen)
    w = torch.randn(C, generator=gen) * 0.2 + 1
    expected = [w * (torch.rsqrt(norm_order.rms_stat_emulated(t.reshape(-1, C)) + 1e-6)[:, None]
                     * t.reshape(-1, C)) for t in (q, k)]
    for got, want in zip(rms_rope.wan_rms_norm_qk(q, k, w, w), expected):
        assert _bits_equal(got.reshape(-1, C), want)

    B, H, N, D = 1, 2, 9, 128
    q = torch.randn(B, H, N, D, generator=gen)
    scale = torch.randn(D, generator=gen) * 0.2 + 1
    identity = torch.tensor([[1.0, 0.0], [0.0, 1.0]]).expand(B, 1, N, D // 2, 2, 2).contiguous()
    out_q, _ = rms_rope.flux_rms_rope(q, q, scale, scale, identity)
    rows = q.reshape(-1, D)
    want = scale * (torch.rsqrt(norm_order.rms_stat_emulated(rows) + 1e-6)[:, None] * rows)
    assert _bits_equal(out_q.reshape(-1, D), want)


def test_rows_torch_normalises_another_way_run_eager_and_say_so(seed, caplog, device):
    gen = generator(seed)
    x = torch.randn(2, 5, 67, generator=gen).to(device)
    shift, scale = (torch.randn(2, 1, 67, generator=gen).to(device) for _ in range(2))
    with caplog.at_level(logging.INFO, logger="fused_dit"):
        out = adaln.adaln(x, shift, scale)
        q = torch.randn(1, 2, 5, 66, generator=gen).to(device)
        pe = torch.randn(1, 1, 5, 33, 2, 2, generator=gen).to(device)
        ones = torch.ones(66, device=device)
        rms_rope.flux_rms_rope(q, q, ones, ones, pe)
    assert torch.equal(out, adaln.reference_comfy(x, shift, scale))
    said = caplog.text
    assert "adaln -> eager (rows of 67 channels" in said
    assert "rms_rope_flux -> eager (rows of 66 channels" in said
