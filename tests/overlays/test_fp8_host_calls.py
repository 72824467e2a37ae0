"""Host work per FP8 Linear call (issue 21.3): counted, never timed (fp8-host-calls.json has the times).

With the GPU work stubbed (fp8_host_harness), one FP8 Linear call is its plan lookup, one codes allocation and its
uint8 view for the kernels, the two quantisation launches (the stats buffer is the stream's own), the GEMM and the
reshapes of a 3-D input; the node's enable around every model call rebuilds no plan.
"""
from __future__ import annotations

import pytest
import torch

import blocks
import comfyui_fused_dit as node_pack
import fused_dit
from fp8_host_harness import count_torch_ops, host_only_fp8
from fused_dit.integration import fp8_modules
from fused_dit.integration.fp8_codes import Fp8CodesLinear
from test_fp8_codes import LifecyclePatcher

# aten ops of one call of a 3-D input: reshape to 2-D, codes empty + uint8 view, GEMM output (empty, standing for
# torch._scaled_mm), view back to 3-D. Before issue 21: 7 (a stats buffer allocated and its slot 0 selected per call)
OPS_PER_LINEAR_CALL = {"empty": 2, "reshape": 1, "view": 2}
LAUNCHES_PER_LINEAR_CALL = 3          # absmax, quantise, GEMM


def _calls_of(module, x, calls):
    module(x)
    before = sum(calls.launches.values())
    ops = count_torch_ops(module, x)
    return dict(ops), sum(calls.launches.values()) - before


def test_one_fp8_linear_call_dispatches_five_aten_ops_and_three_launches():
    model, _ = blocks.make_flux_stack(hidden=64, dtype=torch.bfloat16, comfy_state="newer")
    single = model.single_blocks[0]
    single.linear1 = Fp8CodesLinear.from_linear(single.linear1, single.linear1.weight, torch.device("cpu"),
                                                torch.device("cpu"))
    with host_only_fp8() as calls:
        fused_dit.enable(model, ops=("fp8_linear",))
        try:
            with torch.inference_mode():
                for module in (single.linear1, single.linear2):
                    x = torch.randn(2, 8, module.in_features, dtype=torch.bfloat16)
                    assert _calls_of(module, x, calls) == (OPS_PER_LINEAR_CALL, LAUNCHES_PER_LINEAR_CALL)
                ffn = model.double_blocks[0].img_mlp
                ops, launches = _calls_of(ffn, torch.randn(2, 8, 64, dtype=torch.bfloat16), calls)
                assert ops == {k: 2 * v for k, v in OPS_PER_LINEAR_CALL.items()} and launches == 6
        finally:
            fused_dit.disable(model)


def test_the_nodes_enable_around_every_model_call_rebuilds_no_fp8_plan(monkeypatch):
    model, inputs = blocks.make_flux_stack(hidden=64, depth=2, depth_single=2, dtype=torch.bfloat16,
                                           comfy_state="newer")
    built = []
    real = fp8_modules.Fp8Plan
    monkeypatch.setattr(fp8_modules, "Fp8Plan", lambda *a, **kw: built.append(a[0]) or real(*a, **kw))
    with host_only_fp8():
        (patched,) = node_pack.FusedDiTOps().patch(LifecyclePatcher(model), norm_rope=False, adaln=False,
                                                   gate=False, fp8_linear=True)
        patched.sample(inputs)
        first = len(built)
        patched.sample(inputs)
        patched.sample(inputs)
    assert first == len(patched.object_patches) > 0     # one plan per FP8 Linear, built on the first call
    assert len(built) == first                           # none rebuilt by the later steps' enable


def _fp8_gpu() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


@pytest.mark.skipif(not _fp8_gpu(), reason="real FP8 GEMMs need an sm_89+ CUDA device")
def test_the_streams_shared_stats_buffer_gives_the_bits_of_a_fresh_one():
    from fused_dit.ops import fp8_linear as fl
    weight = fl.Fp8Weight(*fl.quantize_weight_fp8(torch.randn(256, 128, device="cuda", dtype=torch.bfloat16)),
                          static_input=False, input_scale=None, source_key=())
    inputs = [torch.randn(64, 128, device="cuda", dtype=torch.bfloat16) * scale for scale in (1.0, 30.0, 0.01)]
    shared = [fl.linear_fp8_triton(x, weight, None) for x in inputs]       # queued back to back on one stream
    fresh = [fl.linear_fp8(x, weight, None) for x in inputs]
    assert all(torch.equal(a, b) for a, b in zip(shared, fresh))


def test_a_bias_in_another_dtype_is_refreshed_alone_when_edited_in_place(monkeypatch):
    # an fp32 bias under bf16 inputs (a model loaded in fp32, cast per call): the plan copies it in bf16
    linear = torch.nn.Linear(64, 32).bfloat16()
    linear.bias = torch.nn.Parameter(torch.zeros(32), requires_grad=False)
    built = []
    real = fp8_modules.Fp8Plan
    monkeypatch.setattr(fp8_modules, "Fp8Plan", lambda *a, **kw: built.append(a[0]) or real(*a, **kw))
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    with host_only_fp8(), torch.inference_mode():
        first = fp8_modules.fp8_plan_of(linear, x)
        fp8_modules.new_enable_epoch()                      # the node's enable before the next model call
        assert fp8_modules.fp8_plan_of(linear, x) is first  # nothing changed for a tensor that tracks its edits
        linear.bias.add_(1.0)                               # e.g. ComfyUI baking a bias patch in place
        refreshed = fp8_modules.fp8_plan_of(linear, x)
    assert len(built) == 1                                  # the plan itself was never rebuilt
    assert torch.equal(refreshed.bias, torch.ones(32, dtype=torch.bfloat16)) and refreshed.weight is first.weight
