"""The attention family's `fp8` mode: ComfyUI's attention call through the FP8 override, on CPU under the Triton
interpreter.

Pinned here: both of ComfyUI's layouts in and out (`[B, S, heads * D]`, and `[B, heads, S, D]` with skip_reshape /
skip_output_reshape) give the kernel's own result; every refused call (a mask, full precision asked for, a head dim
the kernel does not take) runs the exact mode and says why once; the node's `attention_mode` input defaults to exact
so saved workflows keep their meaning; the registry puts the fp8 override in only where its GPU takes it; under
torch.compile the override traces (one custom op) and a refused call is ComfyUI's own.
"""
from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

import blocks
import comfyui_fused_dit as node_pack
from comfy_fakes import FakeModelPatcher
from fused_dit import families, registry, state
from fused_dit.integration import attention, attention_fp8
from fused_dit.ops import attention_fp8 as kernel

interpreter_only = pytest.mark.skipif(torch.cuda.is_available(),
                                      reason="CPU tensors through the Triton interpreter (the GPU runs are separate)")
B, H, S, D = 1, 2, 40, 64


def attention_pytorch(q, k, v, heads, mask=None, attn_precision=None, skip_reshape=False, skip_output_reshape=False,
                      **kwargs):
    """ComfyUI's attention_pytorch, its layouts included (SDPA in the inputs' dtype)."""
    if not skip_reshape:
        q, k, v = (attention_fp8.to_heads(t, heads) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=kwargs.get("scale"))
    return out if skip_output_reshape else out.transpose(1, 2).reshape(out.shape[0], out.shape[2], -1)


class RecordingExact:
    """The exact mode's override, recording the calls it is handed."""

    def __init__(self):
        self.calls = []

    def __call__(self, func, *args, **kwargs):
        self.calls.append(kwargs)
        return func(*args, **kwargs)


def heads_layout(seed, d=D, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(B, H, S, d, generator=g) * 0.5).to(dtype) for _ in range(3)]


def flat(t):
    return t.transpose(1, 2).reshape(t.shape[0], t.shape[2], -1)


@interpreter_only
@pytest.mark.parametrize("skip_reshape, skip_output_reshape", [(False, False), (True, True), (True, False)])
def test_each_comfyui_layout_gets_the_kernels_result(seed, skip_reshape, skip_output_reshape):
    q, k, v = heads_layout(seed)
    expected = kernel.attention_fp8(q, k, v)                         # [B, H, S, D]
    args = (q, k, v) if skip_reshape else tuple(flat(t) for t in (q, k, v))
    exact = RecordingExact()
    out = attention_fp8.Fp8Attention(exact)(attention_pytorch, *args, H, skip_reshape=skip_reshape,
                                             skip_output_reshape=skip_output_reshape)
    assert exact.calls == []
    assert torch.equal(out, expected if skip_output_reshape else flat(expected))
    stock = attention_pytorch(*args, H, skip_reshape=skip_reshape, skip_output_reshape=skip_output_reshape)
    assert out.shape == stock.shape and out.dtype == stock.dtype


@interpreter_only
def test_the_models_softmax_scale_is_the_kernels(seed):
    q, k, v = heads_layout(seed)
    out = attention_fp8.Fp8Attention()(attention_pytorch, q, k, v, H, skip_reshape=True, skip_output_reshape=True,
                                       scale=0.05)
    assert torch.equal(out, kernel.attention_fp8(q, k, v, 0.05))


@pytest.mark.parametrize("case, said", [
    ("mask", "calls with a mask"),
    ("full_precision", "low_precision_attention=False"),
    ("head_dim", "head dim 96"),
    ("gqa", "grouped-query attention"),
])
def test_a_refused_call_runs_the_exact_mode_and_says_why_once(seed, caplog, case, said):
    d = 96 if case == "head_dim" else D
    q, k, v = heads_layout(seed, d)
    kwargs = {"skip_reshape": True, "skip_output_reshape": True}
    if case == "mask":
        kwargs["mask"] = torch.zeros(S, S, dtype=torch.bfloat16)
    elif case == "full_precision":
        kwargs["low_precision_attention"] = False
    elif case == "gqa":
        kwargs["enable_gqa"] = True
    exact = RecordingExact()
    override = attention_fp8.Fp8Attention(exact)
    state.forget_said()
    with caplog.at_level(logging.INFO, logger="fused_dit"):
        outs = [override(attention_pytorch, q, k, v, H, **kwargs) for _ in range(2)]
    assert len(exact.calls) == 2
    mask = kwargs.get("mask")
    for out in outs:
        assert torch.equal(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    lines = [r.getMessage() for r in caplog.records if "attention fp8 -> exact" in r.getMessage()]
    assert len(lines) == 1 and said in lines[0]


def test_without_the_exact_mode_a_refused_call_is_comfyuis_own(seed):
    q, k, v = heads_layout(seed, 96)
    out = attention_fp8.Fp8Attention(None)(attention_pytorch, flat(q), flat(k), flat(v), H)
    assert torch.equal(out, attention_pytorch(flat(q), flat(k), flat(v), H))


@interpreter_only
def test_under_torch_compile_the_override_traces_and_a_refused_call_is_comfyuis_own(seed):
    q, k, v = heads_layout(seed)
    override = attention_fp8.Fp8Attention(RecordingExact())

    def block(q, k, v, mask=None):
        return override(attention_pytorch, flat(q), flat(k), flat(v), H, mask=mask)

    compiled = torch.compile(block, fullgraph=True, backend="eager")
    assert torch.equal(compiled(q, k, v), flat(kernel.attention_fp8(q, k, v)))
    mask = torch.zeros(S, S, dtype=torch.bfloat16)
    assert torch.equal(compiled(q, k, v, mask), block(q, k, v, mask))
    assert override.exact.calls == [{"mask": mask, "attn_precision": None, "skip_reshape": False,
                                     "skip_output_reshape": False}]     # the eager call only


# ------------------------------------------------------------------------------------------------ node and registry
class _Patcher(FakeModelPatcher):
    def __init__(self, model):
        super().__init__(model)
        self.load_device = torch.device("cpu")


def test_the_nodes_attention_mode_defaults_to_exact_and_saved_workflows_keep_it(flash_first):
    optional = node_pack.FusedDiTOps.INPUT_TYPES()["optional"]
    assert optional["attention_mode"] == (["exact", "fp8"], {"default": "exact",
                                                             "tooltip": families.ATTENTION_MODE_TOOLTIP})
    model, _ = blocks.make_flux_stack()
    (patched,) = node_pack.FusedDiTOps().patch(FakeModelPatcher(model))       # a workflow saved before the input
    assert isinstance(patched.model_options["transformer_options"]["optimized_attention_override"],
                      attention.FastestSdpa)


def test_fp8_mode_puts_the_fp8_override_in_with_the_exact_mode_behind_it(flash_first, monkeypatch):
    monkeypatch.setattr(registry, "runs_on", lambda device, needs: None)
    model, _ = blocks.make_flux_stack()
    (patched,) = node_pack.FusedDiTOps().patch(_Patcher(model), attention_mode="fp8")
    override = patched.model_options["transformer_options"]["optimized_attention_override"]
    assert isinstance(override, attention_fp8.Fp8Attention) and isinstance(override.exact, attention.FastestSdpa)


def test_fp8_mode_on_a_cudnn_first_release_leaves_refused_calls_to_comfyui(cudnn_first, monkeypatch):
    monkeypatch.setattr(registry, "runs_on", lambda device, needs: None)
    model, _ = blocks.make_flux_stack()
    selection = registry.choose(_Patcher(model), registry.Request(("attention",), attention_mode="fp8"))
    assert selection.attention and selection.attention_mode == "fp8" and not selection.attention_exact_fallback
    assert selection.lines[-1] == f"attention: {attention_fp8.RUNS} (refused calls: ComfyUI's own attention)"


def test_fp8_mode_on_a_gpu_below_sm89_runs_the_exact_mode_and_says_why(flash_first, monkeypatch):
    monkeypatch.setattr(registry, "runs_on", lambda device, needs: "sm_86 < 8.9")
    model, _ = blocks.make_flux_stack()
    selection = registry.choose(_Patcher(model), registry.Request(("attention",), attention_mode="fp8"))
    assert selection.attention and selection.attention_mode == "exact"
    assert selection.lines[-1].startswith(f"attention: fp8 -> exact (sm_86 < 8.9): {attention.RUNS}")


def test_fp8_attention_may_run_where_blocks_are_captured_in_cuda_graphs(flash_first, monkeypatch):
    monkeypatch.setattr(registry, "runs_on", lambda device, needs: None)
    model, _ = blocks.make_flux_stack()
    selection = registry.choose(_Patcher(model), registry.Request(("attention",), attention_mode="fp8",
                                                                  graphs_captured=True))
    assert selection.attention and selection.attention_mode == "fp8" and selection.attention_exact_fallback
    assert families.FP8_ATTENTION.needs.capture_safe and families.FASTEST_SDPA.needs.capture_safe


def test_an_unknown_attention_mode_is_refused():
    model, _ = blocks.make_flux_stack()
    with pytest.raises(ValueError, match="attention_mode='int4'"):
        registry.choose(_Patcher(model), registry.Request(("attention",), attention_mode="int4"))


@pytest.mark.parametrize("fastest", [attention_fp8.KERNEL, attention_fp8.EXACT])
def test_fp8_mode_keeps_the_faster_of_the_kernel_and_exact_per_shape(monkeypatch, fastest):
    """A shape's first call times the kernel and the exact mode (cuDNN's FP8 SDPA only where it takes the call)
    and every call of that shape runs the faster: fp8 is never slower than exact."""
    times = {attention_fp8.KERNEL: 2.0, attention_fp8.EXACT: 3.0} if fastest == attention_fp8.KERNEL else \
        {attention_fp8.KERNEL: 3.0, attention_fp8.EXACT: 2.0}
    ran = []

    def exact_func(q, k, v, heads, **kwargs):
        ran.append("exact")
        return q
    order = iter([attention_fp8.KERNEL, attention_fp8.EXACT] * 10)

    def timer(fn):
        fn()
        return times[next(order)]
    monkeypatch.setattr(attention_fp8.kernel, "attention_fp8", lambda q, k, v, scale=None: ran.append("kernel") or q)
    override = attention_fp8.Fp8Attention(timer=timer, devices=("cpu",))
    q = torch.randn(1, 8, 2 * 64, dtype=torch.bfloat16)
    for _ in range(3):
        ran.clear()
        override(exact_func, q, q, q, 2)
        assert ran[-1] == ("kernel" if fastest == attention_fp8.KERNEL else "exact")
    assert list(override.choices.values()) == [fastest]
