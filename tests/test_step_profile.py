"""benchmarks/step_profile.py's pure parts: the kernel categoriser, the per-category summary and the ceilings.

The script itself needs ComfyUI and a GPU; these parts take kernel names and times only, so they run anywhere."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "step_profile.py"


@pytest.fixture(scope="module")
def step_profile():
    spec = importlib.util.spec_from_file_location("step_profile_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


# kernel names as torch.profiler reported them on the H200 (benchmarks/results/fp8-stack-profile.json and others)
BF16_GEMM = "nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNN"
FP8_GEMM = "nvjet_sm90_qqtst_128x128_128x6_2x1_v_bz_coopA_algo2_bias_TNT"
CUDNN_SDPA = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_cga1x1x1_kernel0_0"
LAYER_NORM = ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float, true>"
              "(int, float, c10::BFloat16 const*)")
FP8_CAST = "void at::native::elementwise_kernel<128, 4, direct_copy_kernel_cuda c10::Float8_e4m3fn>()"


def test_fused_dit_kernel_names_come_from_the_ops_sources(step_profile):
    names = step_profile.fused_dit_kernel_names()
    for kernel in ("_adaln_kernel", "_gate_add_kernel", "_flux_rms_rope_kernel", "_wan_rms_rope_kernel",
                   "_quantize_dynamic_kernel", "_gelu_quantize_kernel"):
        assert kernel in names


@pytest.mark.parametrize("name, ops, expected", [
    (BF16_GEMM, ("aten::addmm",), "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", (), "gemm"),
    ("cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8", (), "gemm"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float>", (), "gemm"),
    (FP8_GEMM, (), "fp8_gemm"),
    (BF16_GEMM, ("aten::_scaled_mm", "fused_dit::fp8_linear"), "fp8_gemm"),   # launched under _scaled_mm
    (CUDNN_SDPA, ("aten::_cudnn_attention",), "attention"),                   # wgmma in the name, still attention
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>", (), "attention"),
    ("fmha_cutlassF_bf16_aligned_64x128_rf_sm80", (), "attention"),
    ("void attention_kernel_batched_impl<AttentionKernel<cutlass::bfloat16_t>>", (), "attention"),
    ("_adaln_kernel", ("fused_dit::adaln",), "fused_dit"),
    ("_quantize_dynamic_kernel", ("fused_dit::quantize_dynamic",), "fused_dit"),
    (LAYER_NORM, ("aten::native_layer_norm",), "other"),
    (FP8_CAST, ("aten::copy_",), "other"),                                     # a cast to FP8 is not a GEMM
    ("Memcpy DtoD (Device -> Device)", (), "other"),
    ("triton_poi_fused_add_mul_0", (), "other"),                               # not one of ours
])
def test_categorise_sorts_kernels_by_name_and_launching_op(step_profile, name, ops, expected):
    fused = step_profile.fused_dit_kernel_names()
    assert step_profile.categorise(name, ops, fused) == expected


def test_categorise_matches_fused_dit_names_exactly(step_profile):
    fused = frozenset({"_adaln_kernel"})
    assert step_profile.categorise("_adaln_kernel", (), fused) == "fused_dit"
    assert step_profile.categorise("my_adaln_kernel_v2", (), fused) == "other"


def test_summarise_sums_times_counts_launches_and_ranks_the_top_kernels(step_profile):
    fused = frozenset({"_gate_add_kernel"})
    kernels = [(BF16_GEMM, 3000.0, ("aten::addmm",)), (BF16_GEMM, 1000.0, ("aten::addmm",)),
               (CUDNN_SDPA, 2000.0, ()), ("_gate_add_kernel", 500.0, ("fused_dit::gate_add",)),
               (LAYER_NORM, 700.0, ("aten::native_layer_norm", "aten::layer_norm")),
               ("void at::native::elementwise_kernel<mul>", 300.0, ("aten::mul",))]
    table = step_profile.summarise(kernels, fused, top=1)
    assert set(table) == set(step_profile.CATEGORIES)
    assert table["gemm"]["ms"] == 4.0 and table["gemm"]["launches"] == 2
    assert table["gemm"]["top_kernels"] == [{"name": BF16_GEMM, "count": 2, "ms": 4.0}]
    assert table["attention"]["ms"] == 2.0
    assert table["fused_dit"]["ms"] == 0.5
    assert table["fp8_gemm"] == {"ms": 0.0, "launches": 0, "distinct_kernels": 0, "top_kernels": []}
    assert table["other"]["ms"] == 1.0 and table["other"]["distinct_kernels"] == 2
    assert len(table["other"]["top_kernels"]) == 1                       # top=1 keeps one
    assert table["other"]["top_launching_ops"] == [{"name": "aten::native_layer_norm", "count": 1, "ms": 0.7}]


def test_summarise_of_no_kernels_is_all_zero(step_profile):
    table = step_profile.summarise([], frozenset())
    assert all(table[c]["ms"] == 0 and table[c]["launches"] == 0 for c in step_profile.CATEGORIES)


def test_ceilings_follow_their_definitions(step_profile):
    stock = {"s_per_step": 0.200,
             "kernel_ms": {"gemm": 100.0, "fp8_gemm": 0.0, "attention": 60.0, "fused_dit": 0.0, "other": 30.0}}
    overlay = {"s_per_step": 0.180,
               "kernel_ms": {"gemm": 100.0, "fp8_gemm": 0.0, "attention": 60.0, "fused_dit": 9.0, "other": 6.0}}
    derived = step_profile.ceilings(stock, {"stock": stock, "overlay": overlay})
    assert derived["ceiling_if_all_non_gemm_non_attention_work_were_free"] == 1.25        # 200 / 160
    assert derived["ceiling_if_other_kernels_were_free_idle_kept"] == round(200 / 170, 3)
    assert derived["stock_idle_ms_unprofiled"] == 10.0                                     # 200 - 190
    assert derived["overlay"]["overlay_share_left"] == 0.5                                 # (9 + 6) / 30
    assert derived["overlay"]["speedup_vs_stock"] == round(0.2 / 0.18, 3)
    assert derived["overlay"]["idle_ms_unprofiled"] == 5.0                                 # 180 - 175
    assert "stock" not in {k for k, v in derived.items() if isinstance(v, dict)}


def test_ceilings_without_device_kernels_are_not_invented(step_profile):
    empty = {c: 0.0 for c in step_profile.CATEGORIES}
    derived = step_profile.ceilings({"s_per_step": 0.2, "kernel_ms": empty}, {})
    assert derived["ceiling_if_all_non_gemm_non_attention_work_were_free"] is None
    assert derived["ceiling_if_other_kernels_were_free_idle_kept"] is None
    assert step_profile.ceilings({"error": "failed"}, {}) == {}


def test_host_profile_takes_the_second_step_and_names_the_functions_it_watches(step_profile):
    """One step under cProfile, opened and closed by the sampler's callback; the functions of HOST_FUNCTIONS are
    reported by name with their calls (here: the second step's two cast_bias_weight calls, not the first's)."""
    from types import SimpleNamespace

    def cast_bias_weight():
        return sum(range(1000))

    def sample(patched, noise, latent, positive, steps, seed, callback):
        for step in range(steps):
            cast_bias_weight()
            cast_bias_weight()
            callback(step)
    generation = SimpleNamespace(sample=sample, synchronize=lambda device: None)
    record = step_profile.host_profile(generation, None, (None, None, None), 0, "cpu")
    assert record["functions"]["cast_bias_weight"]["calls"] == 2
    assert record["host_profiled_ms"] >= record["functions"]["cast_bias_weight"]["cumulative_ms"] > 0
    assert record["top_by_own_time"]
