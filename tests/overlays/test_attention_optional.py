"""Optional attention candidates (issue 38): SageAttention 2 in the `fp8` mode, FlashAttention-4 in the exact mode,
each only where the user's environment imports it. Fake modules stand in for both packages (sys.modules patched).

Pinned here: absent (or SageAttention 1.x) -> no candidate, said once; present -> timed on the shape's first call and
run when fastest; a lossy candidate runs only within SageAttention 2's error on the call; FlashAttention-4 runs only
where exact, and only in the exact mode.
"""
from __future__ import annotations

import logging
import sys
import types
import warnings

import pytest
import torch
import torch.nn.functional as F

from fused_dit import state
from fused_dit.integration import attention, attention_fp8, attention_optional, attention_yardstick

HEADS, D, TOKENS = 2, 64, 8


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    state.forget_said()
    attention_yardstick.use_table(None)              # the shipped table: no bands
    monkeypatch.setitem(sys.modules, "sageattention", None)     # absent unless a test puts a fake in
    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)
    yield
    state.forget_said()


def said(caplog, name: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(
        f"Fused DiT Ops: attention: {name} is no candidate")]


def fake_sage(monkeypatch, version: str | None, error: float, ran: list):
    module = types.ModuleType("sageattention")
    if version is not None:
        module.__version__ = version

    def sageattn(q, k, v, tensor_layout="HND", is_causal=False, sm_scale=None, smooth_k=True):
        assert tensor_layout == "HND" and smooth_k is False          # as ComfyUI's binding calls it
        ran.append("sage2")
        return q * (1 + error)
    module.sageattn = sageattn
    monkeypatch.setitem(sys.modules, "sageattention", module)


class Fp8Call:
    """ComfyUI's exact function (returns q), the pack's kernel (q * (1 + kernel_error)), a timer from `times`."""

    def __init__(self, monkeypatch, kernel_error: float, times: dict):
        self.ran: list[str] = []
        self.times = times
        monkeypatch.setattr(attention_fp8.kernel, "attention_fp8",
                            lambda q, k, v, scale=None: self.ran.append("kernel") or q * (1 + kernel_error))

    def exact(self, q, k, v, heads, **kwargs):
        self.ran.append("exact")
        return q

    def timer(self, fn):
        fn()
        return self.times[self.ran[-1]]

    def run(self, override, tokens=TOKENS):
        q = torch.randn(1, tokens, HEADS * D, dtype=torch.bfloat16)
        self.ran.clear()
        override(self.exact, q, q, q, HEADS)
        return self.ran[-1]


def test_without_sageattention_the_fp8_mode_has_no_sage_candidate_and_says_so_once(monkeypatch, caplog):
    call = Fp8Call(monkeypatch, 0.01, {"kernel": 1.0, "exact": 2.0})
    override = attention_fp8.Fp8Attention(timer=call.timer, devices=("cpu",))
    with caplog.at_level(logging.DEBUG, logger="fused_dit"):
        for tokens in (TOKENS, 2 * TOKENS):          # two shapes, two measurements
            assert call.run(override, tokens) == "kernel"
    assert set(override.choices.values()) == {attention_fp8.KERNEL}
    assert len(said(caplog, attention_optional.SAGE2)) == 1


def test_sageattention_1_is_no_candidate_and_says_why_once(monkeypatch, caplog):
    ran = []
    fake_sage(monkeypatch, "1.0.6", 0.0, ran)
    call = Fp8Call(monkeypatch, 0.01, {"kernel": 1.0, "exact": 2.0})
    with caplog.at_level(logging.DEBUG, logger="fused_dit"):
        call.run(attention_fp8.Fp8Attention(timer=call.timer, devices=("cpu",)))
    assert ran == [] and len(lines := said(caplog, attention_optional.SAGE2)) == 1 and "1.0.6" in lines[0]


def test_sageattention_2_is_timed_on_the_first_call_and_runs_where_fastest(monkeypatch):
    ran = []
    fake_sage(monkeypatch, "2.2.0", 0.05, ran)
    call = Fp8Call(monkeypatch, 0.01, {"kernel": 2.0, "exact": 3.0, "sage2": 1.0})
    call.ran = ran
    override = attention_fp8.Fp8Attention(timer=call.timer, devices=("cpu",))
    assert call.run(override) == "sage2"
    assert list(override.choices.values()) == [attention_fp8.SAGE2]
    assert call.run(override) == "sage2" and ran == ["sage2"]        # no second measurement


def test_a_lossy_candidate_beyond_sageattention_2s_error_on_the_call_is_not_chosen(monkeypatch, caplog):
    ran = []
    fake_sage(monkeypatch, "2.2.0", 0.05, ran)
    call = Fp8Call(monkeypatch, 0.2, {"kernel": 1.0, "exact": 3.0, "sage2": 2.0})
    call.ran = ran
    override = attention_fp8.Fp8Attention(timer=call.timer, devices=("cpu",))
    with caplog.at_level(logging.DEBUG, logger="fused_dit"):
        assert call.run(override) == "sage2"                   # the kernel is faster but less accurate
    said = {r.levelno: r.getMessage() for r in caplog.records if "attention fp8 for" in r.getMessage()}
    assert "beyond SageAttention 2's" in said[logging.DEBUG] and "fp8 kernel" in said[logging.DEBUG]
    assert "beyond" not in said[logging.INFO] and len(said[logging.INFO]) < 120      # one short INFO line


def test_a_lossy_candidate_within_sageattention_2s_error_may_win(monkeypatch):
    ran = []
    fake_sage(monkeypatch, None, 0.05, ran)                    # no version: SageAttention 2's functions decide
    sys.modules["sageattention"].sageattn_qk_int8_pv_fp8_cuda = object()
    call = Fp8Call(monkeypatch, 0.02, {"kernel": 1.0, "exact": 3.0, "sage2": 2.0})
    call.ran = ran
    assert call.run(attention_fp8.Fp8Attention(timer=call.timer, devices=("cpu",))) == "kernel"


# ------------------------------------------------------------------------------------------------ FlashAttention-4
comfy = types.SimpleNamespace(ops=types.SimpleNamespace(SDPA_BACKEND_PRIORITY=["flash", "cudnn"]))
ran_first: list[str] = []


def attention_pytorch(q, k, v, heads, mask=None, skip_reshape=False, skip_output_reshape=False, **kwargs):
    """ComfyUI's function as the exact mode sees it (the name and comfy.ops in its globals), both layouts."""
    ran_first.append(comfy.ops.SDPA_BACKEND_PRIORITY[0])
    if not skip_reshape:
        q, k, v = (attention_fp8.to_heads(t, heads) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return out if skip_output_reshape else out.transpose(1, 2).reshape(out.shape[0], out.shape[2], -1)


def fake_fa4(monkeypatch, offset: float = 0.0):
    module = types.ModuleType("flash_attn.cute")

    def flash_attn_func(q, k, v, softmax_scale=None, causal=False):
        assert q.shape[2] == HEADS and not causal                  # [B, S, heads, D]
        ran_first.append("fa4")
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return out.transpose(1, 2) + offset, None                   # (out, lse)
    module.flash_attn_func = flash_attn_func
    monkeypatch.setitem(sys.modules, "flash_attn.cute", module)


def exact_override(times: dict) -> attention.FastestSdpa:
    return attention.FastestSdpa(timer=lambda fn: (fn(), times[ran_first[-1]])[1], devices=("cpu",))


def qkv(skip_reshape: bool):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, HEADS, 16, D, generator=g).bfloat16() for _ in range(3))
    return (q, k, v) if skip_reshape else tuple(attention_fp8._output(t, False) for t in (q, k, v))


@pytest.mark.parametrize("skip_reshape, heads_by_name", [(True, False), (False, False), (False, True)])
def test_flashattention_4_is_timed_and_runs_where_exact_and_fastest(monkeypatch, skip_reshape, heads_by_name):
    """Flux passes heads by position; Wan (0.33.0's WanSelfAttention) passes `heads=`: both reach FlashAttention-4."""
    fake_fa4(monkeypatch)
    override = exact_override({"flash": 3.0, "cudnn": 3.0, "fa4": 1.0})
    args, kwargs = (*qkv(skip_reshape), HEADS), {"skip_reshape": skip_reshape}
    if heads_by_name:
        args, kwargs = args[:3], {**kwargs, "heads": HEADS}
    ran_first.clear()
    stock = attention_pytorch(*args, **kwargs)
    out = override(attention_pytorch, *args, **kwargs)
    assert list(override.choices.values()) == [attention_optional.FA4]
    ran_first.clear()
    again = override(attention_pytorch, *args, **kwargs)
    assert ran_first == ["fa4"] and again.shape == stock.shape
    assert torch.allclose(again.float(), stock.float(), atol=1e-2) and torch.equal(out, again)


def test_the_cutlass_dsls_compile_warning_stays_out_of_the_users_console(monkeypatch):
    """FlashAttention-4's first call of a shape compiles it, and NVIDIA's CUTLASS DSL warns there (seen on the H100);
    the node's timing of that call keeps it out of ComfyUI's console, and leaves every other warning alone."""
    fake_fa4(monkeypatch)
    module = sys.modules["flash_attn.cute"]
    dsl = {"__name__": "cutlass.base_dsl.dsl", "warnings": warnings}
    exec("def compile_warning():\n    warnings.warn('Argument aux_data (position 17) cannot be converted to a "
         "JitArgument', UserWarning)", dsl)
    inner, compiled = module.flash_attn_func, []

    def compiling(*args, **kwargs):                # the DSL warns where it compiles: a shape's first call
        if not compiled:
            compiled.append(dsl["compile_warning"]())
        return inner(*args, **kwargs)
    monkeypatch.setattr(module, "flash_attn_func", compiling)
    override = exact_override({"flash": 3.0, "cudnn": 3.0, "fa4": 1.0})
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        override(attention_pytorch, *qkv(True), HEADS, skip_reshape=True)
        dsl["compile_warning"]()                  # outside the node's timing: the user's filters decide
    assert list(override.choices.values()) == [attention_optional.FA4]
    assert len([w for w in seen if "JitArgument" in str(w.message)]) == 1


def test_an_inexact_flashattention_4_is_never_chosen(monkeypatch):
    fake_fa4(monkeypatch, offset=1.0)
    override = exact_override({"flash": 3.0, "cudnn": 3.0, "fa4": 0.1})
    override(attention_pytorch, *qkv(True), HEADS, skip_reshape=True)
    assert list(override.choices.values()) == ["cudnn"] or list(override.choices.values()) == [None]
    assert attention_optional.FA4 not in override.choices.values()


def test_without_flashattention_4_the_exact_mode_is_as_before_and_says_so_once(caplog):
    override = exact_override({"flash": 3.0, "cudnn": 1.0})
    with caplog.at_level(logging.DEBUG, logger="fused_dit"):
        for length in (16, 32):
            g = torch.Generator().manual_seed(length)
            override(attention_pytorch, *(torch.randn(1, HEADS, length, D, generator=g).bfloat16()
                                          for _ in range(3)), HEADS, skip_reshape=True)
    assert set(override.choices.values()) == {"cudnn"}
    assert len(said(caplog, attention_optional.FA4)) == 1


def test_flashattention_4_is_no_candidate_of_the_fp8_modes_lossy_set(monkeypatch):
    fake_fa4(monkeypatch)
    call = Fp8Call(monkeypatch, 0.01, {"kernel": 1.0, "exact": 2.0})
    override = attention_fp8.Fp8Attention(timer=call.timer, devices=("cpu",))
    call.run(override)
    assert set(override.choices.values()) <= {attention_fp8.KERNEL, attention_fp8.EXACT}
