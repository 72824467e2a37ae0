"""FP8 through ComfyUI's Linear ops on a model whose blocks the overlays do not know (Qwen-Image-shaped).

The block families (norm_rope, adaln, gate) need a block forward written for the model; the FP8 Linear seam does
not: on any model it takes the Linears of the transformer stacks' blocks (integration.generic_blocks), leaves the
modulation Linears, the embedders and the final projection stock, and the node says so once. The fixture is this
project's own Qwen-Image-shaped stack (its submodule names, not its code).
"""
from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

import comfyui_fused_dit as node_pack
import fused_dit
from comfy_fakes import FakeModelPatcher, call_model
from fused_dit import families, registry, state
from fused_dit.integration import generic_blocks, modulation_prefixes
from fused_dit.testing import fp8_emulated

DIM = 32


class ProjectedGelu(nn.Module):
    def __init__(self, dim_in, dim_out):
        super().__init__()
        self.proj = nn.Linear(dim_in, dim_out)

    def forward(self, x):
        return nn.functional.gelu(self.proj(x), approximate="tanh")


class ToyBlock(nn.Module):
    """A joint block named as Qwen-Image's: img_mod (SiLU, Linear) modulation, attention projections, an MLP."""

    def __init__(self, dim=DIM):
        super().__init__()
        self.img_mod = nn.Sequential(nn.SiLU(), nn.Linear(dim, 2 * dim))
        self.attn = nn.Module()
        self.attn.to_q, self.attn.to_k, self.attn.to_v = (nn.Linear(dim, dim) for _ in range(3))
        self.attn.to_out = nn.ModuleList([nn.Linear(dim, dim), nn.Dropout(0.0)])
        self.img_mlp = nn.Module()
        self.img_mlp.net = nn.ModuleList([ProjectedGelu(dim, 4 * dim), nn.Dropout(0.0), nn.Linear(4 * dim, dim)])

    def forward(self, x, temb):
        shift, scale = self.img_mod(temb).unsqueeze(1).chunk(2, dim=-1)
        h = nn.functional.layer_norm(x, (x.shape[-1],)) * (1 + scale) + shift
        q, k, v = self.attn.to_q(h), self.attn.to_k(h), self.attn.to_v(h)
        attended = nn.functional.scaled_dot_product_attention(q, k, v)
        x = x + self.attn.to_out[0](attended)
        mlp = self.img_mlp.net
        return x + mlp[2](mlp[1](mlp[0](x)))


class ToyModel(nn.Module):
    def __init__(self, depth=4, dim=DIM):
        super().__init__()
        self.img_in = nn.Linear(16, dim)
        self.transformer_blocks = nn.ModuleList([ToyBlock(dim) for _ in range(depth)])
        self.proj_out = nn.Linear(dim, 16)

    def forward(self, x, temb):
        x = self.img_in(x)
        for block in self.transformer_blocks:
            x = block(x, temb)
        return self.proj_out(x)


def toy(depth=4):
    torch.manual_seed(0)
    model = ToyModel(depth).eval().requires_grad_(False).to(torch.bfloat16)
    inputs = dict(x=torch.randn(2, 24, 16, dtype=torch.bfloat16), temb=torch.randn(2, DIM, dtype=torch.bfloat16))
    return model, inputs


def test_the_seam_takes_the_blocks_linears_but_modulation_embedders_and_output():
    model, _ = toy()
    assert generic_blocks(model) == list(model.transformer_blocks)
    assert modulation_prefixes(model.transformer_blocks[0]) == ("img_mod",)
    report = fused_dit.enable(model, ops=("fp8_linear",))
    try:
        assert report["generic_blocks"] == 4 and report["fp8_linears"] == 4 * 6
        taken = {name for name, m in model.named_modules() if "forward" in m.__dict__}
        assert "transformer_blocks.0.attn.to_q" in taken and "transformer_blocks.3.img_mlp.net.2" in taken
        assert not any("img_mod" in name for name in taken)
        assert "img_in" not in taken and "proj_out" not in taken
    finally:
        fused_dit.disable(model)
    assert all("forward" not in m.__dict__ for m in model.modules())


def test_fp8_output_stays_within_fp8_rounding_of_stock():
    model, inputs = toy()
    with torch.inference_mode():
        stock = model(**inputs)
    calls: list[str] = []
    fused_dit.enable(model, ops=("fp8_linear",))
    try:
        with fp8_emulated(calls), torch.inference_mode():
            out = model(**inputs)
    finally:
        fused_dit.disable(model)
    assert len(calls) == 4 * 6
    assert 0 < ((out - stock).float().norm() / stock.float().norm()).item() < 0.05


def test_block_families_on_an_unknown_model_are_still_refused_by_enable():
    model, _ = toy()
    with pytest.raises(fused_dit.UnsupportedModelError, match="ToyModel"):
        fused_dit.enable(model, ops=("adaln", "fp8_linear"))


def test_the_node_runs_fp8_on_it_and_says_once_that_the_block_families_stay_stock(caplog):
    state.forget_said()
    model, inputs = toy()
    with caplog.at_level(logging.DEBUG, logger="fused_dit"):
        (patched,) = node_pack.FusedDiTOps().patch(FakeModelPatcher(model), fp8_linear=True, fp8_weights="alongside")
        assert not caplog.records                                 # the blocks are read at the first call
        with fp8_emulated([]):
            call_model(patched, **inputs)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Fused DiT Ops:")]
    [summary] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Fused DiT Ops on ")]
    assert summary.startswith("Fused DiT Ops on ToyModel: runs fp8_linear (FP8 Linears, codes kept beside the "
                              "weights). Stock: norm_rope, adaln, gate (no Flux or Wan blocks)")
    assert any(line.startswith("Fused DiT Ops: norm_rope, adaln, gate: stock") for line in lines)
    assert any(line.startswith("Fused DiT Ops: fp8_linear:") and "blocks the other families do not know" in line
               for line in lines)
    assert sum(families.GENERIC_FP8_EVIDENCE.cite() in line and "Turn it on for large canvases" in line
               for line in lines) == 1
    [wrapper] = patched.wrappers["apply_model"][node_pack.WRAPPER_KEY]

    class Executor:
        class_obj = type("BaseModel", (), {"diffusion_model": model})

        def __call__(self):
            with torch.inference_mode():
                return model(**inputs)
    calls: list[str] = []
    with fp8_emulated(calls):
        wrapper(Executor())
    assert len(calls) == 4 * 6
    assert all("forward" not in m.__dict__ for m in model.modules())


def test_a_model_without_a_stack_of_blocks_stays_stock_with_fp8_on(monkeypatch):
    state.forget_said()
    model, inputs = toy(depth=2)
    enables = []
    monkeypatch.setattr(registry, "_enable", lambda *a, **kw: enables.append(a))
    (patched,) = node_pack.FusedDiTOps().patch(FakeModelPatcher(model), fp8_linear=True)
    stock = call_model(FakeModelPatcher(model), **inputs)
    assert torch.equal(call_model(patched, **inputs), stock)  # settled at the first call: nothing to install
    assert not enables
