"""Fused gated residual add: Wan's addcmul (one rounding) and Flux's x + gate * y (two roundings)."""
from __future__ import annotations

import pytest
import torch

from fused_dit.dispatch import choose
from fused_dit.ops import gate_add
from fused_dit.testing import assert_close_fp32, generator, poisoned_empty


def inputs(B, L, C, rows, gen, dtype=torch.float32):
    x, y = ((torch.randn(B, L, C, generator=gen) * 2).to(dtype) for _ in range(2))
    gate = torch.randn(B, rows, 6, C, generator=gen).to(dtype)[:, :, 2]   # a strided chunk, as ComfyUI has it
    return x, y, gate


@pytest.mark.parametrize("rounding", [gate_add.WAN, gate_add.FLUX])
@pytest.mark.parametrize("B,L,C,rows", [(2, 37, 67, 1), (2, 37, 64, 37), (2, 37, 48, 5), (1, 16, 1100, 1)])
def test_gate_add_matches_comfy_chain_and_fp64_and_writes_every_element(rounding, B, L, C, rows, seed):
    x, y, gate = inputs(B, L, C, rows, generator(seed))
    out = gate_add.gate_add(x, y, gate, rounding, out=poisoned_empty((B, L, C), x.dtype))
    assert_close_fp32(out, gate_add.reference_comfy(x, y, gate, rounding), "vs ComfyUI chain")
    assert_close_fp32(out, gate_add.reference_fp32(x, y, gate, rounding), "vs fp64")


def test_flux_inplace_writes_x_like_plus_equals(seed):
    x, y, gate = inputs(2, 9, 32, 1, generator(seed))
    expected = gate_add.reference_fp32(x, y, gate)
    target = x.clone()
    assert gate_add.gate_add(target, y, gate, gate_add.FLUX, inplace=True) is target
    assert_close_fp32(target, expected)


def test_inplace_is_only_for_the_flux_form(seed):
    x, y, gate = inputs(1, 4, 16, 1, generator(seed))
    with pytest.raises(ValueError):
        gate_add.gate_add(x, y, gate, gate_add.WAN, inplace=True)


def test_the_two_roundings_differ_in_bf16_on_the_eager_path():
    """Why there are two variants: in bf16, rounding the product first changes some results."""
    gen = generator(0)
    x, y, gate = inputs(1, 64, 256, 1, gen, torch.bfloat16)
    wan, flux = (gate_add.reference_comfy(x, y, gate, r) for r in (gate_add.WAN, gate_add.FLUX))
    assert not torch.equal(wan, flux)
    assert torch.equal(flux, x + gate * y) and torch.equal(wan, torch.addcmul(x, y, gate))


def test_forced_eager_backend_runs_the_comfy_chain_exactly(monkeypatch, seed):
    monkeypatch.setenv("FUSED_DIT_BACKEND", "eager")
    x, y, gate = inputs(2, 9, 64, 9, generator(seed), torch.bfloat16)
    assert choose("gate_add_wan", x).reason == "FUSED_DIT_BACKEND=eager"
    for rounding in (gate_add.WAN, gate_add.FLUX):
        assert torch.equal(gate_add.gate_add(x, y, gate, rounding), gate_add.reference_comfy(x, y, gate, rounding))
