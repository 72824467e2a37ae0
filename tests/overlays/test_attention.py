"""The attention family: ComfyUI's attention seam (`optimized_attention_override`) with the fastest exact SDPA
backend per shape, on CPU fixtures.

`attention_pytorch` here stands for ComfyUI's (same name, same call, reading `comfy.ops.SDPA_BACKEND_PRIORITY` at call
time as ComfyUI's scaled_dot_product_attention does); each backend's speed comes from a fake timer, and one backend
is made inexact on purpose, so the choice, the cache, the restore and the exactness gate are all visible.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import blocks
import comfyui_fused_dit as node_pack
from comfy_fakes import FakeModelPatcher
from fused_dit.integration import attention

comfy = SimpleNamespace(ops=SimpleNamespace(SDPA_BACKEND_PRIORITY=["flash", "cudnn", "efficient", "math"]))
FAKE_MS = {"flash": 3.0, "cudnn": 1.0, "efficient": 0.5, "math": 9.0}
ran_first: list[str] = []


def attention_pytorch(q, k, v, heads, mask=None, skip_reshape=False, **kwargs):
    first = comfy.ops.SDPA_BACKEND_PRIORITY[0]
    ran_first.append(first)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return out + 1.0 if first == "efficient" else out        # "efficient" is made inexact on purpose


def attention_sage(q, k, v, heads, **kwargs):
    return F.scaled_dot_product_attention(q, k, v)


def fake_timer(fn) -> float:
    fn()
    return FAKE_MS[ran_first[-1]]


def qkv(length=16):
    generator = torch.Generator().manual_seed(0)
    return tuple(torch.randn(1, 2, length, 8, generator=generator) for _ in range(3))


def test_the_fastest_exact_backend_is_measured_once_per_shape_and_put_first_for_the_call():
    override = attention.FastestSdpa(timer=fake_timer, devices=("cpu",))
    q, k, v = qkv()
    release_order = comfy.ops.SDPA_BACKEND_PRIORITY
    ran_first.clear()
    out = override(attention_pytorch, q, k, v, 2, skip_reshape=True)
    measured = len(ran_first)
    assert override.choices == {next(iter(override.choices)): "cudnn"}      # efficient is faster but not exact
    ran_first.clear()
    again = override(attention_pytorch, q, k, v, 2, skip_reshape=True)
    assert ran_first == ["cudnn"] and measured > 1                           # no second measurement
    assert comfy.ops.SDPA_BACKEND_PRIORITY is release_order                  # the very list is back
    assert torch.equal(out, again) and torch.equal(out, F.scaled_dot_product_attention(q, k, v))
    override(attention_pytorch, *qkv(32), 2, skip_reshape=True)
    assert len(override.choices) == 2                                        # a new shape is measured


def test_where_the_release_order_is_fastest_it_is_kept():
    override = attention.FastestSdpa(timer=lambda fn: (fn(), 0.1)[1] if ran_first[-1] == "flash" else
                                     (fn(), 5.0)[1], devices=("cpu",))
    ran_first.clear()
    override(attention_pytorch, *qkv(), 2, skip_reshape=True)
    assert list(override.choices.values()) == [None]


@pytest.mark.parametrize("ms, chosen", [(4.9, None), (4.0, "cudnn")], ids=["within-noise", "clear-gain"])
def test_a_backend_is_put_first_only_for_a_gain_above_noise(ms, chosen):
    timings = {"flash": 5.0, "cudnn": ms, "efficient": 9.0, "math": 9.0}
    override = attention.FastestSdpa(timer=lambda fn: (fn(), timings[ran_first[-1]])[1], devices=("cpu",))
    ran_first.clear()
    override(attention_pytorch, *qkv(), 2, skip_reshape=True)
    assert list(override.choices.values()) == [chosen]


def test_the_backend_already_first_in_the_release_order_is_no_reorder(monkeypatch):
    monkeypatch.setattr(comfy.ops, "SDPA_BACKEND_PRIORITY", ["cudnn", "flash", "efficient", "math"])
    override = attention.FastestSdpa(timer=fake_timer, devices=("cpu",))
    ran_first.clear()
    override(attention_pytorch, *qkv(), 2, skip_reshape=True)
    assert list(override.choices.values()) == [None]          # as 0.3.64 orders them: the call stays ComfyUI's


def test_other_attention_functions_and_devices_pass_through_untouched():
    q, k, v = qkv()
    ran_first.clear()
    on_cpu = attention.FastestSdpa(timer=fake_timer)                         # the default: CUDA tensors only
    assert torch.equal(on_cpu(attention_pytorch, q, k, v, 2), attention_pytorch(q, k, v, 2))
    assert ran_first == ["flash", "flash"] and on_cpu.choices == {}
    sage = attention.FastestSdpa(timer=fake_timer, devices=("cpu",))
    assert torch.equal(sage(attention_sage, q, k, v, 2), attention_sage(q, k, v, 2)) and sage.choices == {}


def test_the_node_installs_it_only_when_on_and_never_over_another_nodes_override(flash_first):
    model, _ = blocks.make_flux_stack()
    (plain,) = node_pack.FusedDiTOps().patch(FakeModelPatcher(model), attention=False)
    assert "optimized_attention_override" not in plain.model_options["transformer_options"]
    (fast,) = node_pack.FusedDiTOps().patch(FakeModelPatcher(model), attention=True)
    assert isinstance(fast.model_options["transformer_options"]["optimized_attention_override"],
                      attention.FastestSdpa)
    theirs = FakeModelPatcher(model)
    other = lambda func, *a, **kw: func(*a, **kw)  # noqa: E731
    theirs.model_options["transformer_options"]["optimized_attention_override"] = other
    (kept,) = node_pack.FusedDiTOps().patch(theirs, attention=True)
    assert kept.model_options["transformer_options"]["optimized_attention_override"] is other
    assert "optimized_attention_override" not in FakeModelPatcher(model).model_options["transformer_options"]


def test_under_torch_compile_the_override_steps_aside(monkeypatch):
    """While Dynamo traces (ComfyUI's TorchCompileModel) nothing is measured or reordered: the call is the
    release's own, so the compiled graph has no break at each attention."""
    q, k, v = qkv()
    fastest = attention.FastestSdpa(timer=fake_timer, devices=("cpu",))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    ran_first.clear()
    out = fastest(attention_pytorch, q, k, v, 2)
    assert ran_first == ["flash"] and fastest.choices == {}
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v))
