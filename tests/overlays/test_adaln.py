"""Fused AdaLN `addcmul(shift, LayerNorm(x), 1 + scale)` against both references, modulation layouts included."""
from __future__ import annotations

import pytest
import torch

from fused_dit.dispatch import choose
from fused_dit.ops import adaln, modulation_group, repeat_rows_like_comfy
from fused_dit.testing import assert_close_fp32, generator, poisoned_empty


def modulation(B, rows, C, gen, dtype=torch.float32):
    """shift and scale as ComfyUI gets them: strided chunks of one `[B, rows, 6, C]` tensor."""
    e = (torch.randn(B, rows, 6, C, generator=gen) * 0.5).to(dtype)
    return e[:, :, 0], e[:, :, 1]


@pytest.mark.parametrize("B,L,C,rows", [
    (2, 37, 68, 1),      # per sample, C not a multiple of the 512 channels per step
    (2, 37, 64, 37),     # per token
    (2, 40, 48, 4),      # Wan grouped rows, even split
    (2, 37, 48, 5),      # Wan grouped rows, uneven split (repeat_e repeats tokens // rows + 1)
    (1, 16, 96, 1),
])
def test_adaln_matches_comfy_chain_and_fp64_and_writes_every_element(B, L, C, rows, seed):
    gen = generator(seed)
    x = torch.randn(B, L, C, generator=gen) * 2 + 0.3
    shift, scale = modulation(B, rows, C, gen)
    out = adaln.adaln(x, shift, scale, out=poisoned_empty((B, L, C), x.dtype))
    assert_close_fp32(out, adaln.reference_comfy(x, shift, scale), "vs ComfyUI chain")
    assert_close_fp32(out, adaln.reference_fp32(x, shift, scale), "vs fp64")


def test_two_dimensional_modulation_is_per_sample(seed):
    gen = generator(seed)
    x = torch.randn(3, 9, 32, generator=gen)
    shift, scale = torch.randn(3, 32, generator=gen), torch.randn(3, 32, generator=gen)
    assert_close_fp32(adaln.adaln(x, shift, scale), adaln.reference_fp32(x, shift, scale))


def test_each_sample_gets_its_own_modulation_row_at_batch_above_one(seed):
    """Batch mapping by modulo instead of division is wrong only at batch > 1 (CFG): pin it down."""
    gen = generator(seed)
    x = torch.randn(1, 8, 32, generator=gen).expand(2, 8, 32).contiguous()
    shift, scale = modulation(2, 4, 32, gen)
    out = adaln.adaln(x, shift, scale)
    assert_close_fp32(out[1], adaln.reference_fp32(x[1:], shift[1:], scale[1:])[0])
    assert (out[0] - out[1]).abs().max() > 1e-3


@pytest.mark.parametrize("rows,tokens", [(1, 7), (4, 40), (5, 37), (21, 4097), (7, 7), (9, 4), (3, 100)])
def test_modulation_group_reproduces_repeat_e(rows, tokens):
    expanded = repeat_rows_like_comfy(torch.arange(rows).view(1, rows, 1), tokens).flatten()
    group = modulation_group(rows, tokens)
    expected = expanded if expanded.numel() == tokens else expanded.expand(tokens)
    assert torch.equal(torch.arange(tokens) // group if rows > 1 else torch.zeros(tokens, dtype=torch.long), expected)


def test_rows_that_repeat_e_cannot_broadcast_are_rejected(seed):
    gen = generator(seed)
    x = torch.randn(1, 5, 16, generator=gen)
    shift, scale = modulation(1, 3, 16, gen)
    with pytest.raises((ValueError, RuntimeError)):
        adaln.adaln(x, shift, scale)


def test_forced_eager_backend_runs_the_comfy_chain_exactly(monkeypatch, seed):
    monkeypatch.setenv("FUSED_DIT_BACKEND", "eager")
    gen = generator(seed)
    x = torch.randn(2, 9, 64, generator=gen).bfloat16()
    shift, scale = modulation(2, 1, 64, gen, torch.bfloat16)
    assert choose("adaln", x).backend == "eager"
    assert torch.equal(adaln.adaln(x, shift, scale), adaln.reference_comfy(x, shift, scale))
    out = poisoned_empty(x.shape, x.dtype)
    assert adaln.adaln(x, shift, scale, out=out) is out and torch.equal(out, adaln.reference_comfy(x, shift, scale))


def test_output_dtype_follows_eager_type_promotion(seed):
    gen = generator(seed)
    x = torch.randn(1, 4, 32, generator=gen, dtype=torch.float64).float()
    shift, scale = modulation(1, 1, 32, gen, torch.float16)
    assert adaln.adaln(x, shift, scale).dtype == adaln.reference_comfy(x, shift, scale).dtype == torch.float32
