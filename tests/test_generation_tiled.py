"""Issue 50's models in the generation harness (benchmarks/generation.py, models.py): FLUX.2 [dev], Z-Image, Wan 2.2
14B and Qwen-Image at stock and the node's configs, and TiledSampling at the pack's table tile on 4096 and 8192
canvases beside the model's tile-sized stock step. No ComfyUI tree: plans, run specs, the node's log line and the
summary are plain data (a CPU smoke run on a real tree is in benchmarks/README.md)."""
from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from benchmarks import comfy_release, generation, models
from benchmarks.generation_configs import tiles_of

ISSUE_50 = ("flux2-dev", "z-image", "wan2.2-t2v-14b", "qwen-image")
OVERLAYS = Path(__file__).resolve().parents[1] / "overlays"


@pytest.fixture
def pack(monkeypatch):
    """The pack's fused_dit importable, as the harness's import_paths make it."""
    monkeypatch.syspath_prepend(str(OVERLAYS))


def options_for(*words):
    parser = argparse.ArgumentParser()
    generation.add_arguments(parser)
    options = parser.parse_args(["--comfyui", "C", "--out", "o.json", *words])
    models.check_model_arguments(options, parser)
    options.configs = [c for c in options.configs.split(",") if c]
    options.skip = {s for s in options.skip.split(",") if s}
    return options


def planned(*words):
    return [(spec.key, models.resolution_name(resolution), run.name)
            for spec, resolution, run in generation.plan(options_for(*words))]


def test_issue_50s_models_are_named_but_not_run_by_default():
    assert set(ISSUE_50) <= set(models.MODELS)
    assert options_for().models == list(models.DEFAULT_MODELS)
    assert not set(models.DEFAULT_MODELS) & set(ISSUE_50[:3])


@pytest.mark.parametrize("key", ISSUE_50)
def test_each_model_tiles_at_its_table_tile(key, pack):
    from fused_dit.tiling.models import MODELS as TABLE
    spec = models.MODELS[key]
    assert generation.table_tile_px(spec) == TABLE[spec.table_key].tile_px
    assert [r[:2] for r in spec.tiled_resolutions] == [(4096, 4096), (8192, 8192)]
    assert spec.tiny_text_tokens < spec.text_tokens and spec.model_class


def test_wan_2_2_is_one_expert_of_wan_2_1s_shape():
    wan22, wan21 = models.MODELS["wan2.2-t2v-14b"], models.MODELS["wan2.1-t2v-14b"]
    assert (wan22.full, wan22.tiny, wan22.model_class) == (wan21.full, wan21.tiny, wan21.model_class)
    assert wan22.resolutions == ((480, 832, 81),)


def test_flux2_is_stored_in_fp8_and_its_tiny_model_keeps_what_detection_fixes():
    spec = models.MODELS["flux2-dev"]
    assert spec.storage == "float8_e4m3fn" and spec.family == "flux2"
    # ComfyUI's flux2 branch: heads = hidden / sum(axes_dim) (128), the rest fixed by the branch
    assert spec.tiny["hidden_size"] // sum(spec.tiny["axes_dim"]) == spec.tiny["num_heads"]
    kept = {k: v for k, v in spec.tiny.items()
            if k not in ("hidden_size", "num_heads", "depth", "depth_single_blocks", "context_in_dim")}
    assert kept == {k: v for k, v in spec.full.items() if k in kept}
    # Z-Image is named only at its full width: the tiny one loses depth only
    z = models.MODELS["z-image"]
    assert {k: v for k, v in z.tiny.items() if k != "n_layers"} == {k: v for k, v in z.full.items() if k != "n_layers"}
    assert comfy_release.checkpoint_key("double_blocks.0.img_attn.norm.key_norm.weight", "flux2") == \
        "double_blocks.0.img_attn.norm.key_norm.scale"


def test_the_matrices_take_the_storage_dtype_and_the_rest_stays_bf16():
    import torch
    state = models.random_tensors({"a.weight": (8, 4), "a.bias": (8,), "n.scale": (4,)}, 0, "cpu",
                                  matrices="float8_e4m3fn")
    assert state["a.weight"].dtype == torch.float8_e4m3fn
    assert state["a.bias"].dtype == state["n.scale"].dtype == torch.bfloat16
    plain = models.random_tensors({"a.weight": (8, 4)}, 0, "cpu")
    assert plain["a.weight"].dtype == torch.bfloat16


def test_tiled_configs_run_at_the_tiled_canvases_after_the_tile_sized_stock():
    runs = planned("--models", "flux2-dev,wan2.2-t2v-14b", "--configs", "overlay_all_fp8,tiled,tiled_overlay_all_fp8")
    assert runs == [
        ("flux2-dev", "1024x1024", "overlay_all_fp8"), ("flux2-dev", "2048x2048", "overlay_all_fp8"),
        ("flux2-dev", "1024x1024", "stock"),
        ("flux2-dev", "4096x4096", "tiled"), ("flux2-dev", "4096x4096", "tiled_overlay_all_fp8"),
        ("flux2-dev", "8192x8192", "tiled"), ("flux2-dev", "8192x8192", "tiled_overlay_all_fp8"),
        ("wan2.2-t2v-14b", "480x832x81", "overlay_all_fp8"), ("wan2.2-t2v-14b", "832x832x1", "stock"),
        ("wan2.2-t2v-14b", "4096x4096x1", "tiled"), ("wan2.2-t2v-14b", "4096x4096x1", "tiled_overlay_all_fp8"),
        ("wan2.2-t2v-14b", "8192x8192x1", "tiled"), ("wan2.2-t2v-14b", "8192x8192x1", "tiled_overlay_all_fp8")]
    # stock at the tile's size is run once; --resolutions keeps what it names, tiled canvases included
    runs = planned("--models", "z-image", "--configs", "stock,tiled", "--resolutions", "1024x1024,8192x8192")
    assert runs == [("z-image", "1024x1024", "stock"), ("z-image", "8192x8192", "tiled")]
    assert planned("--models", "z-image", "--configs", "tiled", "--tiny") == [
        ("z-image", "256x256", "stock"), ("z-image", "512x512", "tiled")]


def test_a_tiled_run_spec_is_tiled_on_a_config_and_never_on_compile():
    spec = generation.parse_run_spec("tiled_comfy_fp8_fast")
    assert (spec.weights, spec.load_key, spec.name) == ("fp8_e4m3fn", ("fp8_e4m3fn", True), "tiled_comfy_fp8_fast")
    assert generation.parse_run_spec("tiled").load_key == ("bf16", False)
    for text in ("tiled_compile", "tiled_nothing", "tiled_comfy_fp8@bf16"):
        with pytest.raises(ValueError):
            generation.parse_run_spec(text)
    with pytest.raises(ValueError, match="no entry in the pack's model table"):
        generation.plan(options_for("--models", "qwen-image-2.1", "--configs", "tiled"))


def test_the_nodes_plan_is_read_from_its_own_log_line(pack):
    from fused_dit.tiling import plan, wrappers
    from fused_dit.tiling.models import MODELS as TABLE
    shape = TABLE["flux2-dev"]
    settings = plan.choose(shape, 512, 512, 80 << 30, tile_px=1024)
    line = "Tiled Sampling: " + wrappers.describe(settings, shape, (1, 128, 512, 512), "cuda:0")
    assert tiles_of(["something else", line]) == {"tiles": 81, "tile_px": 1024, "overlap_px": 128,
                                                  "tile_batch": settings.batch}
    assert tiles_of(["Tiled Sampling: the 1024x1024 canvas fits one 1024 px tile: the model runs untiled"]) == {}


def test_the_tiled_summary_holds_each_tiled_run_against_its_two_references():
    def run(resolution, name, s, peak, used, **more):
        return {"model": "z-image", "resolution": resolution, "run": name, "config": name.split("@")[0],
                "weights": "bf16", "model_mode": "as loaded", "s_per_step": s, "peak_gib": peak,
                "device_used_peak_gib": used, **more}
    tiled = dict(tile_stock_resolution="1024x1024", memory_reference_resolution="4096x4096")
    runs = [run("1024x1024", "stock", 0.4, 2.0, 20.0),
            run("4096x4096", "tiled", 4.0, 5.0, 30.0, tiles=25, s_per_tile_step=0.16, **tiled),
            run("8192x8192", "tiled", 16.2, 5.25, 33.3, tiles=81, s_per_tile_step=0.2, **tiled)]
    rows = generation.tiled_summary(runs)
    assert [(r["resolution"], r["tile_step_vs_tile_stock"], r["peak_vs_reference"], r["device_used_vs_reference"])
            for r in rows] == [("4096x4096", 0.4, 1.0, 1.0), ("8192x8192", 0.5, 1.05, 1.11)]
    assert rows[1]["tile_stock"] == {"resolution": "1024x1024", "s_per_step": 0.4}
    # a combined report carries the summary of its runs
    report = {"environment": {"comfyui": {"comfyui_version": "0.33.0"}, "gpu": "H100"}, "runs": runs}
    assert [r["resolution"] for r in generation.combine([report])["tiled_summary"]] == ["4096x4096", "8192x8192"]
