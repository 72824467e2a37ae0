"""`applier budget`: token arithmetic, the verdict and what flips it, the caps it reads, its errors and its JSON.

No measured figure is asserted here: the efficiencies and peaks are data (applier/data/), checked against the
committed results by python -m benchmarks validate budget (and by the last test, which runs its --check).
"""
from __future__ import annotations

import ast
import configparser
import fnmatch
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from applier import budget
from applier.budget.data import DATA_DIR, BudgetDataError, load_budget_data
from applier.budget.records import config_words
from applier.cli import cli
from applier.errors import EXIT_REFUSED, EXIT_USAGE
from tests.fixtures.comfy_tree import build_comfy_tree

REPO = Path(__file__).resolve().parent.parent
DATA = load_budget_data()
KNOWN_GPU = "h200"
VERDICTS = ("native", "tiled", "out of reach")


@pytest.fixture(scope="module")
def comfy(tmp_path_factory) -> Path:
    return build_comfy_tree(tmp_path_factory.mktemp("budget") / "ComfyUI", era="latest", layout="plain")


def invoke(*args: str, env: dict | None = None):
    return CliRunner().invoke(cli, ["budget", *args], env={"APPLIER_NO_GPU_PROBE": "1", **(env or {})})


def report(comfy: Path, *args: str) -> dict:
    result = invoke("--target", str(comfy), "--json", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def canvas_tokens(model: str, width: int, height: int, frames: int = 1) -> budget.Tokens:
    return budget.token_counts(DATA.models[model], budget.Canvas(width, height, frames))


# ---------------------------------------------------------------- arithmetic

def test_flux_tokens_are_the_16_pixel_patches_plus_comfyuis_256_t5_tokens():
    tokens = canvas_tokens("flux-dev", 1024, 1024)
    assert (tokens.latent_width, tokens.latent_height, tokens.image, tokens.text) == (128, 128, 4096, 256)
    assert canvas_tokens("flux-dev", 32768, 18432).image == 2048 * 1152 == 2_359_296


def test_wan_packs_frames_four_to_one_after_the_first_and_patches_two_by_two():
    assert canvas_tokens("wan-14b", 832, 480, 33).image == 9 * 30 * 52 == 14040
    assert canvas_tokens("wan-14b", 832, 480, 81).image == 21 * 30 * 52
    assert canvas_tokens("wan-14b", 832, 480, 1).latent_frames == 1


def test_flux2_and_sdxl_tokens_follow_their_vae_factor_and_patch():
    assert canvas_tokens("flux2-dev", 1024, 1024).image == 64 * 64     # 16x VAE, patch 1
    assert canvas_tokens("sdxl", 1024, 1024).image == 128 * 128        # 8x VAE, one token per latent pixel
    assert canvas_tokens("qwen-image", 1024, 1024).all == 4096 + 115


def test_attention_flops_are_four_times_queries_keys_heads_and_head_dim_per_call():
    model = DATA.models["flux-dev"]
    work = budget.forward_work(model, budget.Canvas(1024, 1024))
    calls = sum(g.count for g in model.groups)
    assert work.attention_flop == calls * 4 * 4352 ** 2 * 24 * 128
    wan = budget.forward_work(DATA.models["wan-14b"], budget.Canvas(832, 480, 33))
    assert wan.attention_flop == 40 * 4 * 40 * 128 * (14040 ** 2 + 14040 * 512)


def test_gemm_flops_are_twice_the_linears_weights_per_token_they_see():
    model = DATA.models["flux-dev"]
    work = budget.forward_work(model, budget.Canvas(1024, 1024))
    per_token = sum(g.count * sum(lin.fan_in * lin.fan_out for lin in g.linears) for g in model.groups)
    assert work.gemm_flop == 2 * per_token * 4352


def test_attention_grows_with_the_square_of_the_tokens_and_gemms_linearly():
    model = DATA.models["flux-dev"]
    small, large = (budget.forward_work(model, budget.Canvas(s, s)) for s in (2048, 4096))
    ratio = large.tokens.all / small.tokens.all
    assert large.attention_flop / small.attention_flop == pytest.approx(ratio ** 2)
    assert large.gemm_flop / small.gemm_flop == pytest.approx(ratio)


def test_attention_calls_are_grouped_by_length_and_a_cross_attention_is_short():
    wan = budget.forward_work(DATA.models["wan-14b"], budget.Canvas(832, 480, 33))
    assert sum(flop for _, flop in wan.attention_calls) == pytest.approx(wan.attention_flop)
    lengths = [length for length, _ in wan.attention_calls]
    assert lengths == sorted(lengths) and lengths[-1] == 14040
    assert lengths[0] == pytest.approx((14040 * 512) ** 0.5)   # the cross-attention to the 512 text tokens


def test_an_efficiency_by_tokens_is_log_linear_between_its_points_and_flat_outside():
    curve = budget.Efficiency(0.3, "a", tokens=1000, by_tokens=((4000, 0.5, "b"), (16000, 0.4, "c")))
    assert curve.at(10) == curve.at(1000) == 0.3
    assert curve.at(2000) == pytest.approx(0.4)            # half-way between 1000 and 4000 in log(tokens)
    assert curve.at(8000) == pytest.approx(0.45)
    assert curve.at(10 ** 7) == curve.at(16000) == 0.4
    assert budget.Efficiency(0.3, "a").at(10 ** 6) == 0.3   # no curve: the value at any length


def test_a_longer_call_is_priced_at_its_own_lengths_efficiency():
    measured = DATA.measured
    flash = measured.attention["flash"]
    if not flash.by_tokens:
        pytest.skip("efficiency.toml has no attention curve")
    gpu, model = DATA.gpus[measured.gpu], DATA.models["flux-dev"]
    work = budget.forward_work(model, budget.Canvas(4096, 4096))
    seconds, backend = budget.attention_seconds(work, measured, gpu, "flash")
    length = work.attention_calls[-1][0]
    assert backend == "flash"
    assert seconds == pytest.approx(work.attention_flop / (gpu.bf16_tflops * 1e12 * flash.at(length)))
    _, fastest = budget.attention_seconds(work, measured, gpu, None)
    assert fastest == max(measured.attention, key=lambda b: measured.attention[b].at(length))


def test_a_curve_without_the_length_of_its_value_is_refused(tmp_path):
    for name in ("gpus.toml", "efficiency.toml"):
        (tmp_path / name).write_bytes((DATA_DIR / name).read_bytes())
    text = (tmp_path / "efficiency.toml").read_text()
    if "tokens = 4352\n" not in text:
        pytest.skip("efficiency.toml has no attention curve")
    (tmp_path / "efficiency.toml").write_text(text.replace("tokens = 4352\n", "", 1))
    with pytest.raises(BudgetDataError, match="by_tokens needs the tokens"):
        load_budget_data(tmp_path)


def test_sizes_and_durations_parse_and_garbage_is_refused():
    assert budget.parse_size("32768x18432") == (32768, 18432)
    assert budget.parse_size("1024") == (1024, 1024)          # one number is a square
    assert budget.parse_duration("1h") == 3600 and budget.parse_duration("2h30m") == 9000
    assert budget.parse_duration("90") == 90 and budget.parse_duration("45s") == 45
    for bad in ("32768x", "axb", "0x0", "", "10000000x10000000", "65537x1024"):
        with pytest.raises(ValueError):
            budget.parse_size(bad)
    for bad in ("soon", "1h soon", "-5", "0", "inf", "nan", "1001h"):
        with pytest.raises(ValueError):
            budget.parse_duration(bad)


def test_the_release_picks_the_stock_attention_backend_and_an_unknown_release_the_newest():
    measured = DATA.measured
    assert budget.era_for(measured, "0.3.64")[0].stock_attention == "cudnn"
    assert budget.era_for(measured, "0.33.0")[0].stock_attention == "flash"
    era, why = budget.era_for(measured, None)
    assert era == measured.eras[-1] and "unknown" in why


# ---------------------------------------------------------------- verdicts

def test_every_model_family_gets_a_verdict_on_every_gpu_of_the_table():
    for model in DATA.models.values():
        for gpu in DATA.gpus.values():
            request = budget.Request(model, gpu, budget.Canvas(4096, 4096, model.frames), model.steps,
                                     model.cfg_forwards)
            result = budget.plan_budget(DATA, request)
            assert result.verdict.kind in VERDICTS, (model.key, gpu.key)
            basis = result.basis
            assert basis.startswith("measured") == (gpu.key == DATA.measured.gpu), basis
            if gpu.key != DATA.measured.gpu:
                assert "projected from" in basis and gpu.name in basis


def test_within_flips_a_native_canvas_to_out_of_reach(comfy):
    generous = report(comfy, "--model", "flux-dev", "--size", "1024x1024", "--gpu", KNOWN_GPU, "--within", "1h")
    assert generous["verdict"]["kind"] == "native"
    tight = report(comfy, "--model", "flux-dev", "--size", "1024x1024", "--gpu", KNOWN_GPU, "--within", "1s")
    assert tight["verdict"]["kind"] == "out of reach"
    assert tight["within_seconds"] == 1


def test_a_canvas_whose_activations_do_not_fit_is_never_native_and_within_flips_tiled_to_out_of_reach(comfy):
    args = ("--model", "flux-dev", "--size", "32768x18432", "--gpu", KNOWN_GPU)
    roomy = report(comfy, *args, "--within", "1000h")
    assert not roomy["memory"]["activations_fit"]
    assert roomy["verdict"]["kind"] == "tiled"
    tile = roomy["verdict"]["tile"]
    assert tile["tile_px"] in DATA.models["flux-dev"].tile_px and tile["tiles"] > 1
    assert report(comfy, *args, "--within", "1s")["verdict"]["kind"] == "out of reach"


def test_the_tiled_route_is_the_tiled_sampling_node_as_its_planner_plans_it(comfy):
    """The route names the pack's node and the settings its planner (overlays/fused_dit/tiling/plan.py, loaded by
    path) chooses: the same tile count and batch, the batch from the memory beside the weights."""
    from applier.resources import load_pack_module
    plan, models = load_pack_module("tiling.plan"), load_pack_module("tiling.models")
    small = report(comfy, "--model", "flux-dev", "--size", "32768x18432", "--gpu", "rtx-4090", "--within", "1000h")
    route = next(r for r in small["tiled_routes"] if r["tile_px"] == 1024)
    assert route["node"] == "Tiled Sampling" and route["fits"]
    layout = plan.plan(18432 // 8, 32768 // 8, 1024 // 8, route["overlap_px"] // 8, align=2)
    assert route["tiles"] == layout.count
    assert route["settings"] == {"tile_px": 1024, "overlap_px": route["overlap_px"], "tile_batch": route["batch"]}
    assert route["tile_activation_bytes"] == models.MODELS["flux-dev"].tile_bytes(1024)
    assert route["peak_bytes"] <= small["gpu"]["memory_bytes"]
    assert any("Tiled Sampling, tile_px" in reason for reason in small["verdict"]["reasons"])
    sdxl = report(comfy, "--model", "sdxl", "--size", "16384x16384", "--gpu", KNOWN_GPU, "--within", "1000h")
    assert all(r["node"] is None for r in sdxl["tiled_routes"])


def _tiled_models() -> list[str]:
    from applier.resources import load_pack_module
    return list(load_pack_module("tiling.models").MODELS)


@pytest.mark.parametrize("key", _tiled_models())
def test_every_model_the_node_tiles_is_priced_natively_and_tiled_at_8192(comfy, key):
    """The budget's models are the pack's table (overlays/fused_dit/models.json): each model the Tiled Sampling node
    tiles is priced at 8192x8192 natively and by the node's tiles, at its own latent factor, channels and patch, with
    the tile count the node's planner cuts."""
    from applier.resources import load_pack_module
    plan, models = load_pack_module("tiling.plan"), load_pack_module("tiling.models")
    shape = models.MODELS[key]
    out = report(comfy, "--model", key, "--size", "8192x8192", "--gpu", "h200", "--within", "1000h")
    latent = out["tokens"]["latent"]
    assert (latent["width"], latent["channels"]) == (8192 // shape.vae_factor, shape.latent_channels)
    side = 8192 // shape.vae_factor // shape.patch
    assert out["tokens"]["image"] == side * side * latent["frames"]
    assert out["verdict"]["kind"] in VERDICTS and out["configs"]
    routes = {r["tile_px"]: r for r in out["tiled_routes"]}
    assert routes and all(r["node"] == "Tiled Sampling" for r in routes.values())
    for tile_px, route in routes.items():
        layout = plan.plan(latent["height"], latent["width"], tile_px // shape.vae_factor,
                           route["overlap_px"] // shape.vae_factor, align=shape.patch)
        assert route["tiles"] == layout.count, (key, tile_px)


def test_flux2_is_priced_at_its_own_latent_and_tokens(comfy):
    """FLUX.2 [dev]: 1/16 latent of 128 channels, patch 1, so 8192 px is 512 x 512 tokens, as many as FLUX.1 at
    8192 px gets from its 1/8 latent and patch 2; its 32B weights (6144 wide) make each token dearer."""
    flux2 = report(comfy, "--model", "flux2-dev", "--size", "8192x8192", "--gpu", "h200", "--within", "1000h")
    flux1 = report(comfy, "--model", "flux-dev", "--size", "8192x8192", "--gpu", "h200", "--within", "1000h")
    assert flux2["tokens"]["image"] == flux1["tokens"]["image"] == 512 * 512
    assert flux2["tokens"]["latent"]["channels"] == 128 and flux2["tokens"]["text"] == 512
    assert flux2["memory"]["weights_bf16_bytes"] > 2.5 * flux1["memory"]["weights_bf16_bytes"]
    tiled = {r["tile_px"]: r for r in flux2["tiled_routes"]}
    assert tiled[1024]["tiles"] == 81 and tiled[1024]["node"] == "Tiled Sampling"


def test_flux2_stock_holds_the_fp8_file_users_load_not_bf16(comfy):
    """Users load Comfy-Org's FLUX.2 [dev] file, its matrices in FP8, and stock ComfyUI keeps them so: the stock
    config is priced at that size (about half of bf16), FLUX.1's (a bf16 file) at bf16."""
    flux2 = report(comfy, "--model", "flux2-dev", "--size", "2048x2048", "--gpu", "h200", "--within", "1000h")
    memory = flux2["memory"]
    assert memory["weights_stock_bytes"] == memory["weights_fp8_bytes"] < 0.6 * memory["weights_bf16_bytes"]
    stock = next(c for c in flux2["configs"] if c["config"] == "stock")
    assert stock["weights_bytes"] == memory["weights_stock_bytes"]
    flux1 = report(comfy, "--model", "flux-dev", "--size", "2048x2048", "--gpu", "h200", "--within", "1000h")
    assert flux1["memory"]["weights_stock_bytes"] == flux1["memory"]["weights_bf16_bytes"]


def test_fp8_is_not_offered_where_the_gpu_has_no_fp8_tensor_cores(comfy):
    configs = {c["config"]: c for c in report(comfy, "--model", "flux-dev", "--size", "1024x1024",
                                              "--gpu", "rtx-3090")["configs"]}
    assert not configs["overlay_fp8"]["available"] and "sm_89" in configs["overlay_fp8"]["note"]
    assert configs["stock"]["available"] and configs["overlay_all"]["available"]


def test_fp8_on_a_model_the_block_families_do_not_know_gives_memory_but_no_time(comfy):
    configs = {c["config"]: c for c in report(comfy, "--model", "qwen-image", "--size", "1024x1024",
                                              "--gpu", KNOWN_GPU)["configs"]}
    fp8 = configs["overlay_all_fp8"]
    assert fp8["available"] and not fp8["predicted"] and "seconds_per_step" not in fp8
    assert fp8["weights_bytes"] < configs["stock"]["weights_bytes"]


def test_cfg_one_halves_the_step_of_a_model_that_guides_with_two_forwards(comfy):
    args = ("--model", "wan", "--size", "832x480", "--frames", "33", "--gpu", KNOWN_GPU)
    guided, plain = report(comfy, *args), report(comfy, *args, "--cfg", "1.0")
    assert (guided["forwards_per_step"], plain["forwards_per_step"]) == (2, 1)
    assert guided["configs"][0]["seconds_per_step"] == pytest.approx(2 * plain["configs"][0]["seconds_per_step"])


@pytest.mark.parametrize("cfg", ["nan", "-1", "inf", "-inf", "100.5"])
def test_a_cfg_outside_ksamplers_range_is_a_usage_error_never_priced(comfy, cfg):
    result = invoke("--target", str(comfy), "--model", "flux-dev", "--size", "1024x1024", "--gpu", KNOWN_GPU,
                    "--cfg", cfg)
    assert result.exit_code == EXIT_USAGE, result.output
    assert "Invalid value for '--cfg'" in result.output and "from 0 to 100" in result.output


def test_weights_that_do_not_fit_beside_the_activations_stream_and_fp8_weights_may_not(comfy):
    configs = {c["config"]: c for c in report(comfy, "--model", "qwen-image", "--size", "1024x1024",
                                              "--gpu", "rtx-4090")["configs"]}
    stock, fp8 = configs["stock"], configs["overlay_all_fp8"]
    assert stock["streamed_weights_bytes"] > 0 and stock["seconds_per_forward"]["weight_streaming"] > 0
    assert fp8["streamed_weights_bytes"] < stock["streamed_weights_bytes"]
    roomy = report(comfy, "--model", "qwen-image", "--size", "1024x1024", "--gpu", KNOWN_GPU)["configs"][0]
    assert roomy["streamed_weights_bytes"] == 0 and roomy["seconds_per_forward"]["weight_streaming"] == 0


def test_a_tiled_route_whose_weights_do_not_fit_beside_a_tile_streams_them_as_native_does(comfy):
    """FLUX.2 [dev]'s 32B weights exceed a 24 GiB card in any precision: natively ComfyUI streams what does not fit
    from the host every forward, and the tiled route is priced the same way (a tile's activations are what must fit),
    saying how much streams, never 'no tile size fits' while a 2048 canvas is priced as fitting."""
    out = report(comfy, "--model", "flux2-dev", "--size", "8192x8192", "--gpu", "rtx-4090", "--within", "1000h")
    memory = out["gpu"]["memory_bytes"]
    routes = [r for r in out["tiled_routes"] if r["fits"]]
    assert routes and all(r["streamed_weights_bytes"] > 0 and r["peak_bytes"] <= memory for r in routes)
    assert all(r["tile_activation_bytes"] < memory for r in routes)
    assert out["verdict"]["kind"] == "tiled"
    assert any("stream from the host every forward" in reason for reason in out["verdict"]["reasons"])
    roomy = report(comfy, "--model", "flux-dev", "--size", "8192x8192", "--gpu", KNOWN_GPU, "--within", "1000h")
    assert all(r["streamed_weights_bytes"] == 0 for r in roomy["tiled_routes"] if r["fits"])


def test_a_video_model_takes_its_own_frames_unless_told():
    model = DATA.models["wan-14b"]
    result = budget.plan_budget(DATA, budget.Request(model, DATA.gpus[KNOWN_GPU], budget.Canvas(832, 480, model.frames),
                                                     model.steps, model.cfg_forwards))
    assert result.request.canvas.frames == model.frames > 1
    assert result.work.tokens.latent_frames == (model.frames - 1) // 4 + 1


def test_windows_keeps_cudnn_first_where_linux_runs_flash_first():
    model, gpu = DATA.models["flux-dev"], DATA.gpus[KNOWN_GPU]
    for windows, backend in ((False, "flash"), (True, "cudnn")):
        request = budget.Request(model, gpu, budget.Canvas(1024, 1024), 28, 1, comfyui_version="0.33.0",
                                 windows=windows)
        result = budget.plan_budget(DATA, request)
        assert result.stock_attention == backend
        assert result.configs[0].priced.attention_backend == backend


# ---------------------------------------------------------------- caps

def test_stock_caps_refuse_a_32k_canvas_and_name_the_fix(comfy):
    caps = report(comfy, "--model", "flux-dev", "--size", "32768x18432", "--gpu", KNOWN_GPU)["caps"]
    assert caps["checked"] and caps["allowed"] is False
    by_cap = {b["cap"]: b for b in caps["blocking"]}
    assert by_cap["MAX_RESOLUTION"]["value"] == 16384 and by_cap["MAX_RESOLUTION"]["where"].startswith("nodes.py:")
    assert "comfyui/max-resolution" in by_cap["MAX_RESOLUTION"]["fix"]
    assert "comfyui/pil-pixel-limit" in by_cap["PIL.Image.MAX_IMAGE_PIXELS"]["fix"]
    assert all(f"--target {comfy}" in b["fix"] for b in caps["blocking"])     # a command to run as it is
    # verify's resolution-caps scan: the fixture's 3D loader and custom node caps
    assert {c["value"] for c in caps["node_caps"]} == {4096, 16384}


def test_a_canvas_within_every_cap_is_allowed(comfy):
    caps = report(comfy, "--model", "flux-dev", "--size", "2048x2048", "--gpu", KNOWN_GPU)["caps"]
    assert caps["allowed"] is True and not caps["blocking"] and not caps["node_caps"]


def test_patched_caps_are_read_from_the_files_as_they_are(tmp_path):
    comfy = build_comfy_tree(tmp_path / "ComfyUI", era="latest", layout="plain")
    nodes = comfy / "nodes.py"
    text = nodes.read_text()
    text = text.replace("MAX_RESOLUTION=16384", "MAX_RESOLUTION=40960").replace(
        "MAX_RESOLUTION = 16384", "MAX_RESOLUTION = 40960")
    text += ("\nif Image.MAX_IMAGE_PIXELS is not None:\n"
             "    Image.MAX_IMAGE_PIXELS = max(Image.MAX_IMAGE_PIXELS, MAX_RESOLUTION * MAX_RESOLUTION)\n")
    nodes.write_text(text)
    caps = report(comfy, "--model", "flux-dev", "--size", "32768x18432", "--gpu", KNOWN_GPU)["caps"]
    assert caps["allowed"] is True, caps
    assert any("MAX_RESOLUTION 40960" in note for note in caps["notes"])
    assert any("raised in nodes.py" in note and f"{40960 ** 2:,}" in note for note in caps["notes"])


def test_pillows_bound_comes_from_the_targets_own_pil(tmp_path):
    from applier.budget.caps import pillow_bound, resolution_readers
    from applier.target import Target
    comfy = build_comfy_tree(tmp_path / "ComfyUI", era="latest", layout="plain")
    site = tmp_path / "site-packages"
    (site / "PIL").mkdir(parents=True)
    (site / "PIL" / "Image.py").write_text("MAX_IMAGE_PIXELS: int | None = int(1024 * 1024 * 1024 // 4 // 3)\n")
    target = Target(comfy, "plain", comfy, None, "unknown", None, None, "none", None, site, None, None, None)
    notes: list = []
    assert pillow_bound(target, comfy, 16384, 1, resolution_readers(), notes)[0] == 1024 ** 3 // 4 // 3
    (site / "PIL" / "Image.py").write_text("MAX_IMAGE_PIXELS = None\n")
    assert pillow_bound(target, comfy, 16384, 1, resolution_readers(), notes)[0] is None
    gone = Target(comfy, "plain", comfy, None, "unknown", None, None, "none", None, None, None, None, None)
    notes.clear()
    assert pillow_bound(gone, comfy, 16384, 7, resolution_readers(), notes) == (7, "Pillow's default")
    assert any("Pillow not found" in n for n in notes)


# ---------------------------------------------------------------- errors and GPUs

def test_an_unknown_gpu_is_exit_3_naming_the_known_ones(comfy):
    result = invoke("--target", str(comfy), "--model", "flux-dev", "--size", "1024x1024", "--gpu", "voodoo-5")
    assert result.exit_code == EXIT_REFUSED
    assert "voodoo-5" in result.output and "--gpu" in result.output
    assert all(key in result.output for key in DATA.gpus)


def test_without_a_detected_gpu_the_budget_asks_for_gpu(comfy):
    result = invoke("--target", str(comfy), "--model", "flux-dev", "--size", "1024x1024", "--json")
    assert result.exit_code == EXIT_REFUSED
    error = json.loads(result.output)["error"]
    assert error["kind"] == "UnknownGpuError" and "--gpu" in error["hint"] and error["exit_code"] == 3


def test_the_detected_gpu_is_used_with_its_own_memory(comfy, tmp_path):
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\necho 'NVIDIA GeForce RTX 4090, 8.9, 20000'\n")
    smi.chmod(0o755)
    env = {"APPLIER_NO_GPU_PROBE": "0", "PATH": f"{smi.parent}{os.pathsep}{os.environ['PATH']}"}
    result = invoke("--target", str(comfy), "--model", "sdxl", "--size", "1024x1024", "--json", env=env)
    assert result.exit_code == 0, result.output
    gpu = json.loads(result.output)["gpu"]
    assert (gpu["key"], gpu["how"], gpu["memory_bytes"]) == ("rtx-4090", "detected", 20000 * 1024 * 1024)
    smi.write_text("#!/bin/sh\necho 'NVIDIA Quadro K2000, 3.0, 2048'\n")
    result = invoke("--target", str(comfy), "--model", "sdxl", "--size", "1024x1024", env=env)
    assert result.exit_code == EXIT_REFUSED and "Quadro K2000" in result.output and "--gpu" in result.output


def test_an_unknown_model_is_exit_3_listing_the_known_ones(comfy):
    result = invoke("--target", str(comfy), "--model", "dalle", "--size", "1024x1024", "--gpu", KNOWN_GPU)
    assert result.exit_code == EXIT_REFUSED
    assert all(key in result.output for key in DATA.models)


def test_model_names_and_gpu_names_match_their_aliases():
    assert budget.find_model(DATA, "Wan2.1-T2V-14B").key == "wan-14b"
    assert budget.find_model(DATA, "FLUX.1-dev").key == "flux-dev"
    assert budget.find_gpu(DATA, "NVIDIA GeForce RTX 4090").key == "rtx-4090"
    assert budget.find_gpu(DATA, "NVIDIA A100-SXM4-80GB").key == "a100-80gb"
    assert budget.find_gpu(DATA, "NVIDIA H200 NVL") is None      # another board: other clocks, not guessed


def test_kandinsky5_video_pro_is_its_own_model_and_each_family_runs_or_stays_comfyuis_own(comfy):
    """Kandinsky 5.0 Video Pro (19B, 4096 wide) answers to its own names, not Lite's. At ComfyUI's default 768x512
    and 121 frames on a 24 GiB card its bf16 weights stream; the pack's fused blocks stay ComfyUI's own (its blocks
    are neither Flux's nor Wan's), FP8 Linears give memory but no time, and Tiled Sampling tiles it at 512 px."""
    for name in ("kandinsky5-video-pro", "kandinsky5-pro", "kandinsky5pro-t2v", "Kandinsky-5.0-T2V-Pro"):
        assert budget.find_model(DATA, name).key == "kandinsky5-video-pro", name
    assert budget.find_model(DATA, "kandinsky5-lite").key == "kandinsky5-video"
    out = report(comfy, "--model", "kandinsky5-pro", "--size", "768x512", "--gpu", "rtx-4090", "--within", "1000h")
    assert out["model"]["key"] == "kandinsky5-video-pro"
    assert out["tokens"]["latent"] == {"width": 96, "height": 64, "frames": 31, "channels": 16}
    assert out["tokens"]["image"] == 48 * 32 * 31 and out["forwards_per_step"] == 2
    configs = {c["config"]: c for c in out["configs"]}
    stock, fused, fp8 = configs["stock"], configs["overlay"], configs["fp8"]
    assert stock["weights_bytes"] == 2 * DATA.models["kandinsky5-video-pro"].parameters
    assert stock["streamed_weights_bytes"] > 0
    assert "this model's blocks stay ComfyUI's own" in fused["note"]
    assert fused["seconds_per_step"] == stock["seconds_per_step"]
    assert not fp8["predicted"] and fp8["weights_bytes"] < 0.6 * stock["weights_bytes"]
    (route,) = out["tiled_routes"]                       # 1024 and 768 px tiles are no smaller than the canvas
    assert (route["node"], route["tile_px"], route["fits"]) == ("Tiled Sampling", 512, True)


@pytest.mark.parametrize("args", [("--size", "32768x"), ("--size", "1024x1024", "--within", "soon"),
                                  ("--size", "1024x1024", "--frames", "33")])
def test_malformed_values_are_usage_errors(comfy, args):
    result = invoke("--target", str(comfy), "--model", "flux-dev", "--gpu", KNOWN_GPU, *args)
    assert result.exit_code == EXIT_USAGE, result.output


@pytest.mark.parametrize("option, value, stated", [
    ("--size", "10000000x10000000", "from 16 to 65536"), ("--size", "8x1024", "from 16 to 65536"),
    ("--size", "65537", "from 16 to 65536"), ("--steps", "0", "from 1 to 10000"),
    ("--steps", "10001", "from 1 to 10000"), ("--frames", "0", "from 1 to 16384"),
    ("--frames", "16385", "from 1 to 16384"), ("--cfg", "101", "from 0 to 100"),
    ("--within", "0.5s", "from 1 s to 1000 h"), ("--within", "1001h", "from 1 s to 1000 h"),
    ("--cpu-cores", "0", "from 1 to 1024"), ("--cpu-cores", "1025", "from 1 to 1024")])
def test_every_numeric_option_outside_its_range_is_a_usage_error_stating_the_range(comfy, option, value, stated):
    """Refused before any work (a 10000000 px side used to be priced, growing past 3.7 GB of memory)."""
    result = invoke("--target", str(comfy), "--model", "wan", "--size", "832x480", "--gpu", KNOWN_GPU,
                    option, value)
    assert result.exit_code == EXIT_USAGE, result.output
    assert f"Invalid value for '{option}'" in result.output and stated in result.output


def test_one_number_is_a_square_canvas(comfy):
    canvas = report(comfy, "--model", "flux-dev", "--size", "1024", "--gpu", KNOWN_GPU)["canvas"]
    assert (canvas["width"], canvas["height"]) == (1024, 1024)


# ---------------------------------------------------------------- the verdict in words

def template_refinement_steps() -> int:
    """The steps of the KSampler that the template's Tiled Sampling feeds, read here from the JSON itself."""
    workflow = json.loads((REPO / "overlays" / "comfyui_fused_dit" / "example_workflows" /
                           "make_a_32k_image_flux.json").read_text())
    tiled = {n["id"] for n in workflow["nodes"] if n["type"] == "TiledSampling"}
    fed = {link[3] for link in workflow["links"] if link[1] in tiled and link[5] == "MODEL"}
    (sampler,) = [n for n in workflow["nodes"] if n["id"] in fed and n["type"] == "KSampler"]
    return sampler["widgets_values"][2]


def test_a_tiled_route_is_priced_at_the_templates_refinement_steps_unless_steps_says(comfy):
    args = ("--model", "flux-dev", "--size", "32768x18432", "--gpu", "rtx-4090")
    default = report(comfy, *args)
    steps = template_refinement_steps()
    assert default["steps"] == DATA.models["flux-dev"].steps and default["tiled_steps"] == steps
    assert {r["steps"] for r in default["tiled_routes"]} == {steps}
    assert "make_a_32k_image_flux" in default["steps_source"]["tiled"]
    told = report(comfy, *args, "--steps", "20")
    assert told["steps"] == told["tiled_steps"] == 20 and {r["steps"] for r in told["tiled_routes"]} == {20}
    plain = invoke("--target", str(comfy), *args)
    steps_line = next(line for line in plain.output.splitlines() if line.startswith("steps"))
    assert f"tiled {steps}" in steps_line and "--steps" in steps_line


def test_a_template_read_with_other_steps_gives_those_steps(tmp_path):
    from applier.budget.template import template_for, tiled_templates
    pack = tmp_path / "overlays"
    node = pack / "comfyui_fused_dit" / "example_workflows"
    node.mkdir(parents=True)
    (pack / "pack.toml").write_bytes((REPO / "overlays" / "pack.toml").read_bytes())
    workflow = json.loads((REPO / "overlays" / "comfyui_fused_dit" / "example_workflows" /
                           "make_a_32k_image_flux.json").read_text())
    for n in workflow["nodes"]:
        if n["type"] == "KSampler" and n["widgets_values"][2] == template_refinement_steps():
            n["widgets_values"][2] = 12
    (node / "make_a_32k_image_flux.json").write_text(json.dumps(workflow))
    (node / "no_tiles.json").write_text(json.dumps({"nodes": [], "links": []}))
    (node / "garbage.json").write_text("{not json")
    assert [t.steps for t in tiled_templates(pack)] == [12]
    assert template_for(DATA, DATA.models["flux-dev"], pack).steps == 12
    assert template_for(DATA, DATA.models["qwen-image"], pack) is None


def text_lines(comfy: Path, *args: str) -> list[str]:
    result = invoke("--target", str(comfy), *args)
    assert result.exit_code == 0, result.output
    return result.output.splitlines()


def test_the_32k_report_fits_one_screen_with_the_verdict_first_and_its_caps_in_one_line(tmp_path):
    """As on a real 0.33.0 tree, dozens of node caps: one line by default, every one with --verbose."""
    comfy = build_comfy_tree(tmp_path / "ComfyUI", era="latest", layout="plain")
    many = "\n".join(f"class Node{i}:\n    @classmethod\n    def INPUT_TYPES(cls):\n        return {{'required': "
                     f"{{'{name}': ('INT', {{'default': 64, 'min': 1, 'max': {value}}})}}}}\n"
                     for i, (name, value) in enumerate([("resolution_steps", 256), ("octree_resolution", 512)]
                                                       + [("width", 2048 + 64 * i) for i in range(60)]))
    (comfy / "custom_nodes" / "ManyCaps").mkdir()
    (comfy / "custom_nodes" / "ManyCaps" / "__init__.py").write_text(many)
    args = ("--model", "flux-dev", "--size", "32768x18432", "--gpu", "rtx-4090")
    lines = text_lines(comfy, *args)
    assert len(lines) <= 25, "\n".join(lines)
    assert any(line.startswith("verdict") for line in lines[:5])
    (caps_line,) = [line for line in lines if line.startswith("node caps")]
    assert "width = 2048" in caps_line and "and 64 others" in caps_line and "--verbose" in caps_line
    verbose = text_lines(comfy, *args, "--verbose")
    assert sum("octree_resolution = 512" in line for line in verbose) == 1
    assert sum(" width = " in line for line in verbose) == 61
    assert sum(line.lstrip().startswith(config_words("overlay_all_fp8") + ":") for line in verbose) == 1


def test_the_verdict_says_why_it_picks_the_largest_tile_over_a_faster_one(comfy):
    result = report(comfy, "--model", "flux-dev", "--size", "32768x18432", "--gpu", "h100-sxm", "--within", "1000h")
    verdict = result["verdict"]
    fastest = min((r for r in result["tiled_routes"] if r["fits"]), key=lambda r: r["seconds"])
    assert verdict["kind"] == "tiled" and verdict["tile"]["tile_px"] == max(DATA.models["flux-dev"].tile_px)
    assert fastest["tile_px"] != verdict["tile"]["tile_px"]
    assert any(f"over the faster {fastest['tile_px']} px" in r and "fewest seams" in r for r in verdict["reasons"])


def test_the_verdict_says_why_native_wins_over_a_faster_tiled_route(comfy):
    result = report(comfy, "--model", "flux-dev", "--size", "4096", "--gpu", "rtx-4090")
    verdict = result["verdict"]
    assert verdict["kind"] == "native"
    assert any(r["fits"] and r["seconds"] < verdict["seconds"] for r in result["tiled_routes"])
    assert any("native over the faster" in r and "whole canvas" in r for r in verdict["reasons"])


def test_out_of_reach_says_what_reaches_it_and_each_suggestion_does(comfy):
    args = ("--model", "flux-dev", "--size", "32768x18432", "--gpu", "rtx-4090", "--within", "30m")
    verdict = report(comfy, *args)["verdict"]
    assert verdict["kind"] == "out of reach"
    advice = " ".join(verdict["advice"])
    for option in ("--within", "--steps", "--size", "--gpu"):
        assert option in advice, advice
    within = advice.split("--within ")[1].split()[0].rstrip(";")
    steps = advice.split("--steps ")[1].split()[0]
    size = advice.split("--size ")[1].split()[0]
    gpu = advice.split("--gpu ")[1].split()[0]
    base = dict(zip(args[::2], args[1::2]))
    for change in ({"--within": within}, {"--steps": steps}, {"--size": size}, {"--gpu": gpu}):
        changed = [item for pair in {**base, **change}.items() for item in pair]
        assert report(comfy, *changed)["verdict"]["kind"] != "out of reach", change
    lines = text_lines(comfy, *args)
    assert any(line.strip().startswith("to reach it:") for line in lines[:8])


def test_node_caps_that_set_no_side_of_the_canvas_are_not_the_lowest_that_matters():
    from applier.budget.verdict import caps_verdict
    caps = [budget.Cap("a.py:1", 256, "resolution_steps", "ImageScaleToTotalPixels"),
            budget.Cap("b.py:2", 512, "octree_resolution", "VAEDecodeHunyuan3D"),
            budget.Cap("c.py:3", 1024, "spacing_width", "ImageStitch"), budget.Cap("d.py:4", 4096, "width", "Load3D"),
            budget.Cap("e.py:5", 8192, "MAX_RESOLUTION")]
    found = caps_verdict(budget.Canvas(16384, 16384), budget.TargetCaps(16384, "nodes.py:1", None, "off", tuple(caps)))
    assert found.lowest_that_matters.where == "d.py:4" and len(found.node_caps) == 5
    assert [c.canvas_side for c in found.node_caps] == [False, False, False, True, True]
    latent = budget.Cap("f.py:6", 8192, "height", "EmptyHiDreamO1LatentImage")     # an image or latent node first
    found = caps_verdict(budget.Canvas(16384, 16384), budget.TargetCaps(16384, "nodes.py:1", None, "off",
                                                                          (*caps, latent)))
    assert found.lowest_that_matters.where == "f.py:6"


# ---------------------------------------------------------------- the report

def test_the_json_report_has_every_section_with_its_types(comfy):
    result = report(comfy, "--model", "flux-dev", "--size", "32768x18432", "--gpu", "rtx-4090", "--steps", "20")
    for key in ("target", "model", "gpu", "canvas", "comfyui", "tokens", "per_forward", "memory", "vae_decode",
                "configs", "caps", "tiled_routes", "verdict"):
        assert key in result, key
    assert result["steps"] == 20 and result["gpu"]["how"] == "--gpu" and result["gpu"]["source"].count("https://")
    assert isinstance(result["tokens"]["image"], int) and isinstance(result["memory"]["activation_peak_bytes"], int)
    assert [c["config"] for c in result["configs"]] == list(budget.CONFIGS)
    for config in result["configs"]:
        if config.get("seconds_per_step") is not None:
            assert set(config["seconds_per_forward"]) == {"attention", "gemm", "fp8_quantize", "elementwise",
                                                          "host_gap", "weight_streaming", "total"}
            assert config["seconds_per_generation"] == pytest.approx(20 * config["seconds_per_step"])
            assert config["basis"].startswith("projected from")
    assert result["vae_decode"]["tiled_bytes"] < result["vae_decode"]["whole_bytes"]
    assert result["verdict"]["kind"] in VERDICTS and result["verdict"]["reasons"]


def test_the_text_report_says_the_basis_the_verdict_and_each_config(comfy):
    result = invoke("--target", str(comfy), "--model", "flux-dev", "--size", "4096x4096", "--gpu", "l40s")
    assert result.exit_code == 0, result.output
    assert "projected from NVIDIA L40S's published peaks" in result.output
    assert "verdict" in result.output and config_words("overlay_all_fp8") in result.output and "tokens" in result.output


@pytest.mark.parametrize("args", [
    ("--model", "flux-dev", "--size", "1024", "--gpu", "rtx-4090"),                           # native, every config
    ("--model", "flux-dev", "--size", "4096", "--gpu", "rtx-3090"),                           # FP8 not on this GPU
    ("--model", "qwen-image", "--size", "2048", "--gpu", KNOWN_GPU),                          # FP8 not timed
    ("--model", "flux-dev", "--size", "32768x18432", "--gpu", "h100-sxm", "--within", "1000h"),   # tiled
    ("--model", "flux-dev", "--size", "32768x18432", "--gpu", "rtx-4090")])                   # out of reach
def test_the_text_report_names_what_runs_in_words_never_a_config_id(comfy, args):
    """The configs are the benchmarks' ids (overlay_fp8...): the text says what runs, the JSON keeps the ids and
    gives the words beside them."""
    import re
    text = "\n".join(text_lines(comfy, *args))
    ids = [c for c in budget.CONFIGS if c != "stock"]          # "stock" is the user's word too: "stock ComfyUI"
    assert re.findall(r"\b(?:" + "|".join(ids) + r")\b", text) == [], text
    assert not re.search(r"\bstock[ :]+[0-9.]+ (?:s|min|h|d)\b", text), text     # a time after the bare id
    assert "stock ComfyUI" in text or config_words("overlay_fp8") in text
    result = report(comfy, *args)
    for config in result["configs"]:
        assert config["words"] == config_words(config["config"])
    for route in (r for r in result["tiled_routes"] if r["fits"]):
        assert route["config"] in budget.CONFIGS and route["words"] == config_words(route["config"])


def test_the_budget_imports_no_torch(comfy):
    code = ("import sys; from applier.cli import cli\n"
            "cli.main(sys.argv[1:], standalone_mode=False)\n"
            "print('torch imported' if 'torch' in sys.modules else 'no torch')")
    proc = subprocess.run([sys.executable, "-c", code, "budget", "--target", str(comfy), "--model", "flux-dev",
                           "--size", "1024x1024", "--gpu", KNOWN_GPU], capture_output=True, text=True,
                          env={**os.environ, "APPLIER_NO_GPU_PROBE": "1"}, cwd=REPO)
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and any(line.startswith("verdict") for line in lines), proc.stdout + proc.stderr
    assert lines[-1] == "no torch"


# ---------------------------------------------------------------- data

@pytest.mark.parametrize("module", ["__init__", "records", "inputs", "cost", "verdict", "plan", "report"])
def test_the_budget_model_reads_no_file_and_prints_nothing(module):
    tree = ast.parse((REPO / "applier" / "budget" / f"{module}.py").read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= {"__future__", "math", "re", "dataclasses", "typing", "packaging", "applier"}, imported
    calls = {node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    assert not calls & {"open", "print"}
    modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not {m for m in modules if m.startswith("applier.") and m.split(".")[1] not in ("budget", "errors",
                                                                                          "resources", "strenum")}


def test_every_gpu_and_model_and_efficiency_names_its_source():
    for gpu in DATA.gpus.values():
        assert "https://" in gpu.source, gpu.key
    for model in DATA.models.values():
        assert model.sources.get("source") and model.vae.source, model.key
        assert all(model.sources.get(k) for k in ("parameters_source", "activation_source", "steps_source"))
    measured = DATA.measured
    efficiencies = [measured.gemm_bf16, measured.gemm_fp8, measured.fp8_quantize, *measured.attention.values()]
    efficiencies += [e for era in measured.eras for e in (era.other, era.elementwise_factor, era.host_gap_s)]
    sources = [e.source for e in efficiencies] + [p[2] for e in measured.attention.values() for p in e.by_tokens]
    for source in sources:
        results_file = source.split(":")[0]
        assert (REPO / "benchmarks" / "results" / results_file).is_file(), source


def test_a_malformed_table_is_a_refusal_naming_file_and_key(tmp_path):
    for name in ("gpus.toml", "efficiency.toml"):
        (tmp_path / name).write_bytes((DATA_DIR / name).read_bytes())
    text = (tmp_path / "gpus.toml").read_text().replace("bandwidth_gbs = 4800", 'bandwidth_gbs = "fast"')
    (tmp_path / "gpus.toml").write_text(text)
    with pytest.raises(BudgetDataError, match=r"gpus.toml\[h200\]: key 'bandwidth_gbs' is str") as caught:
        load_budget_data(tmp_path)
    assert caught.value.exit_code == EXIT_REFUSED


def test_the_tables_ship_as_package_data():
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    patterns = config["options.package_data"]["applier"].split()
    for path in DATA_DIR.iterdir():
        rel = path.relative_to(DATA_DIR.parent).as_posix()
        assert any(fnmatch.fnmatch(rel, pattern) for pattern in patterns), f"{rel} is not package data"


def test_the_efficiency_table_agrees_with_the_committed_results():
    spec = importlib.util.spec_from_file_location("budget_validation", REPO / "benchmarks" / "budget.py")
    validation = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(validation)
    derived = validation.derive_efficiencies(DATA)
    assert validation.compare_efficiencies(derived, validation.table_values(DATA_DIR / "efficiency.toml")) == []


def test_readmes_32k_figure_for_an_rtx_4090_is_what_the_command_prints(tmp_path):
    """README's "Make a 32K image" quotes the command on a 0.33.0 tree: its minutes within 5% of the route priced."""
    import re
    comfy = build_comfy_tree(tmp_path / "ComfyUI", era="latest", layout="plain")
    (comfy / "comfyui_version.py").write_text('__version__ = "0.33.0"\n')
    result = report(comfy, "--model", "flux-dev", "--size", "32768x18432", "--gpu", "rtx-4090")
    fastest = min((r for r in result["tiled_routes"] if r["fits"]), key=lambda r: r["seconds"])
    readme = (REPO / "README.md").read_text()
    quoted = re.search(r"RTX 4090: the route ([0-9.]+) min end to end, its\s+refinement ([0-9.]+) min", readme)
    for figure, seconds in zip(quoted.groups(), (fastest["seconds"], fastest["refine_seconds"])):
        assert abs(float(figure) * 60 - seconds) <= 0.05 * seconds, (figure, seconds)
    assert (f"takes {fastest['seconds'] / 60:.1f} min end to end ({len(fastest['stages'])} stages; the refinement "
            f"{fastest['refine_seconds'] / 60:.1f} min with {fastest['words']}, {fastest['steps']} steps)") in readme


def test_the_help_states_each_range_the_readers_hold():
    result = CliRunner().invoke(cli, ["budget", "--help"], terminal_width=200)
    text = " ".join(result.output.split())
    for low, high in (budget.SIZE_RANGE, budget.FRAMES_RANGE, budget.STEPS_RANGE, budget.CFG_RANGE,
                      budget.CPU_CORES_RANGE):
        assert f"{low:g}-{high:g}" in text, (low, high)
    low, high = budget.WITHIN_RANGE_S
    assert f"{low:g} s to {high / 3600:g} h" in text
    assert f"[default: {DATA.measured.route.host_cores}, those of the host the route was measured on" in text


def test_the_help_lists_the_models_of_the_packs_model_table():
    """--model's help names every key of overlays/fused_dit/models.json, read from it, as the refusal of an
    unknown model does (test_an_unknown_model_is_exit_3_listing_the_known_ones)."""
    from applier.budget.data import MODELS_TABLE
    result = CliRunner().invoke(cli, ["budget", "--help"], terminal_width=400)
    (model_help,) = [line for line in result.output.splitlines() if line.lstrip().startswith("--model")]
    keys = list(json.loads(MODELS_TABLE.read_text()))
    assert len(keys) > 5 and ", ".join(keys) in model_help, model_help


# ---------------------------------------------------------------- the whole route

def template_nodes() -> list[dict]:
    workflow = json.loads((REPO / "overlays" / "comfyui_fused_dit" / "example_workflows" /
                           "make_a_32k_image_flux.json").read_text())
    return workflow["nodes"]


# the template's nodes that take time, as ComfyUI runs them (KSampler twice: the generation and the refinement)
ROUTE_NODES = ("KSampler", "VAEDecode", "ImageScale", "TiledVAEEncode", "KSampler", "TiledVAEDecode", "SaveImagePNG")


def test_the_tiled_route_prices_every_stage_of_the_template_and_they_sum_to_its_time(comfy):
    """Every node of the template that takes time is a stage of each route that fits, in the template's order; the
    stages add up to the route's time, the refinement is its own stage. A stage dropped fails here."""
    result = report(comfy, "--model", "flux-dev", "--size", "32768x18432", "--gpu", "rtx-4090")
    timed = sorted(n["type"] for n in template_nodes() if n["type"] in ROUTE_NODES)
    assert timed == sorted(ROUTE_NODES)
    for route in (r for r in result["tiled_routes"] if r["fits"]):
        stages = route["stages"]
        assert tuple(s["node"] for s in stages) == ROUTE_NODES
        assert [s["stage"] for s in stages] == ["generate", "decode_base", "upscale", "encode", "refine", "decode",
                                                "save"]
        assert all(s["seconds"] > 0 and s["basis"] for s in stages)
        assert sum(s["seconds"] for s in stages) == pytest.approx(route["seconds"])
        (refine,) = [s for s in stages if s["stage"] == "refine"]
        assert refine["seconds"] == pytest.approx(route["refine_seconds"])
        assert route["refine_seconds"] == pytest.approx(route["seconds_per_tile"] * route["tiles"])
    verdict = result["verdict"]
    assert "end to end" in " ".join(verdict["reasons"])
    lines = text_lines(comfy, "--model", "flux-dev", "--size", "32768x18432", "--gpu", "rtx-4090")
    (stages_line,) = [line for line in lines if line.startswith("route stages")]
    for word in ("generate", "upscale", "encode", "refinement", "decode", "save"):
        assert word in stages_line, word


def test_the_routes_generation_is_the_templates_and_its_vae_tiles_are_the_templates_nodes():
    from applier.budget.plan import route_base
    nodes = {n["type"]: n["widgets_values"] for n in template_nodes()}
    base = route_base(DATA, DATA.models["flux-dev"])
    width, height = nodes["EmptySD3LatentImage"][:2]
    assert (base.canvas.width, base.canvas.height) == (width, height)
    assert base.steps in [n["widgets_values"][2] for n in template_nodes() if n["type"] == "KSampler"]
    assert base.steps != template_refinement_steps()
    route = DATA.measured.route
    for node in ("TiledVAEEncode", "TiledVAEDecode"):
        assert nodes[node][:2] == [route.vae_tile_px, route.vae_overlap_px], node
    assert route_base(DATA, DATA.models["qwen-image"]) is None


def test_the_vae_stages_are_its_convolutions_over_the_planners_tiles_and_project_by_bf16_peak():
    from applier.budget import cost
    route, flux = DATA.measured.route, DATA.models["flux-dev"]
    canvas = budget.Canvas(32768, 18432)
    decode, encode = cost.vae_work(route, flux, canvas, decode=True), cost.vae_work(route, flux, canvas, decode=False)
    plan = load_pack_module_plan()
    tile, overlap = route.vae_tile_px // 8, route.vae_overlap_px // 8
    assert decode.tiles == encode.tiles == plan.plan(18432 // 8, 32768 // 8, tile, overlap,
                                                     margin=plan.margin_for(overlap)).count
    assert decode.flop > encode.flop > 0           # the decoder has a ResnetBlock more per level and wider top levels
    # a larger tile: more tokens in the middle attention block, more FLOPs per pixel
    assert cost.vae_flop_per_pixel(route.vae, 2048 ** 2, True) > cost.vae_flop_per_pixel(route.vae, 1024 ** 2, True)
    measured_on, other = DATA.gpus[route.gpu], DATA.gpus["rtx-4090"]
    compute = decode.flop / (route.decode.value * 1e12)
    assert cost.vae_seconds(decode, route.decode, other) - decode.host_bytes / (other.host_link_gbs * 1e9) == \
        pytest.approx(compute / other.bf16_tflops)
    assert cost.vae_seconds(decode, route.decode, measured_on) < cost.vae_seconds(decode, route.decode, other)


def test_host_stages_are_core_seconds_per_megapixel_on_the_measuring_hosts_cores():
    from applier.budget import cost
    route = DATA.measured.route
    canvas = budget.Canvas(32768, 18432)
    request = budget.Request(DATA.models["flux-dev"], DATA.gpus["h200"], canvas, 8, 1)
    era, _ = budget.era_for(DATA.measured, "0.33.0")
    _, after = cost.route_stages(DATA, request, era, "overlay_fp8", None)
    (save,) = [s for s in after if s.name == "save"]
    assert save.seconds == pytest.approx(route.save.value * canvas.width * canvas.height / 1e6 / route.host_cores)
    _, doubled = cost.route_stages(DATA, request, era, "overlay_fp8", None, cores=2 * route.host_cores)
    assert [s.seconds for s in doubled if s.name == "save"] == [pytest.approx(save.seconds / 2)]
    assert f"{route.host_cores} cores" in save.basis


def test_fewer_cpu_cores_make_the_host_stages_slower_and_the_default_is_the_measuring_hosts(comfy):
    """The budget usually runs on another machine than ComfyUI's: --cpu-cores prices the host stages (ImageScale, the
    PNG save) on that machine's cores; without it, on the measuring host's, which the report says."""
    args = ("--model", "flux-dev", "--size", "32768x18432", "--gpu", "rtx-4090")
    measured = DATA.measured.route.host_cores

    def host_stages(result):
        route = result["verdict"].get("tile") or min((r for r in result["tiled_routes"] if r["fits"]),
                                                      key=lambda r: r["seconds"])
        return {s["stage"]: s["seconds"] for s in route["stages"] if s["stage"] in ("upscale", "save")}, route
    default, fewer = report(comfy, *args), report(comfy, *args, "--cpu-cores", "4")
    assert default["cpu_cores"] is None and fewer["cpu_cores"] == 4
    (base, base_route), (slower, slower_route) = host_stages(default), host_stages(fewer)
    for stage in ("upscale", "save"):
        assert slower[stage] == pytest.approx(base[stage] * measured / 4)
    assert slower_route["seconds"] > base_route["seconds"]
    (line,) = [x for x in text_lines(comfy, *args) if x.startswith("route stages")]
    assert f"{measured} cores as measured" in line and "--cpu-cores N" in line
    (line,) = [x for x in text_lines(comfy, *args, "--cpu-cores", "4") if x.startswith("route stages")]
    assert f"4 cores, projected from {measured} measured" in line and "--cpu-cores N" not in line


def test_a_model_without_a_measured_vae_route_is_priced_for_its_refinement_only(comfy):
    result = report(comfy, "--model", "qwen-image", "--size", "16384x16384", "--gpu", KNOWN_GPU, "--within", "1000h")
    for route in (r for r in result["tiled_routes"] if r["fits"]):
        assert [s["stage"] for s in route["stages"]] == ["refine"]
        assert route["seconds"] == pytest.approx(route["refine_seconds"])


def test_steps_advice_keeps_the_routes_other_stages(comfy):
    """--steps N priced in the advice reaches the time given although encode, decode and save do not shrink."""
    args = ("--model", "flux-dev", "--size", "32768x18432", "--gpu", "rtx-4090", "--within", "40m")
    advice = " ".join(report(comfy, *args)["verdict"]["advice"])
    steps = advice.split("--steps ")[1].split()[0]
    told = report(comfy, *args[:-2], "--steps", steps, "--within", "40m")
    assert told["verdict"]["kind"] == "tiled" and told["verdict"]["seconds"] <= 40 * 60


def test_the_validation_compares_every_measured_stage_of_the_route_results():
    """Each stage a tiled-route results file times on a card (whole routes and stages timed alone) is a row of the
    validation, priced on that card; the calibration figures are the ones efficiency.toml names."""
    spec = importlib.util.spec_from_file_location("budget_validation", REPO / "benchmarks" / "budget.py")
    validation = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(validation)
    rows = validation.route_rows(DATA)
    expected = 0
    for path in sorted((REPO / "benchmarks" / "results").glob("tiled-route-*.json")):
        for _, gpu, _, stages, end_to_end in validation.measured_stages(json.loads(path.read_text())):
            if validation._gpu_of(DATA, gpu) is not None:
                expected += len(set(stages) | ({"refine", "route"} if end_to_end else set()))
    assert len(rows) == expected > 0
    assert {"encode", "decode", "save", "refine", "route"} <= {r["stage"] for r in rows}
    calibration = [r for r in rows if r["fit"].startswith("calibration")]
    named = {DATA.measured.route.encode.source, DATA.measured.route.decode.source, DATA.measured.route.save.source}
    assert calibration and all(any(r["measured"].split(": ")[1] in source for source in named) for r in calibration)


def load_pack_module_plan():
    from applier.resources import load_pack_module
    return load_pack_module("tiling.plan")


def test_qwen_image_edit_prices_its_reference_image_in_the_image_stream(comfy):
    """Qwen-Image-Edit is Qwen-Image with one reference image (the table's `like` entry): ComfyUI's
    TextEncodeQwenImageEdit scales it to 1024 x 1024 pixels, and the model concatenates its patchified latent onto the
    image tokens, so every joint attention and Linear runs over canvas + reference tokens; the Tiled Sampling node
    gives it whole to every tile, so each tile carries those tokens too."""
    def run(model, size):
        return report(comfy, "--model", model, "--size", size, "--gpu", "h200", "--within", "1000h")
    edit, plain = run("qwen-image-edit", "2048x2048"), run("qwen-image", "2048x2048")
    reference = (1024 // 8 // 2) ** 2
    assert edit["tokens"]["reference"] == reference and plain["tokens"]["reference"] == 0
    assert edit["tokens"]["image"] == plain["tokens"]["image"] + reference
    share = (plain["tokens"]["stream"] + reference) / plain["tokens"]["stream"]      # joint: image + text
    assert edit["per_forward"]["attention_flop"] / plain["per_forward"]["attention_flop"] == pytest.approx(share ** 2)
    assert edit["per_forward"]["gemm_flop"] / plain["per_forward"]["gemm_flop"] == pytest.approx(share)
    edit_tiled, plain_tiled = ({r["tile_px"]: r for r in run(m, "8192x8192")["tiled_routes"]}
                               for m in ("qwen-image-edit", "qwen-image"))
    tile = 1024 // 8 // 2
    for route in edit_tiled.values():
        assert route["node"] == "Tiled Sampling" and route["tiles"] == plain_tiled[route["tile_px"]]["tiles"]
    assert edit_tiled[1024]["tile_activation_bytes"] / plain_tiled[1024]["tile_activation_bytes"] == pytest.approx(
        (tile * tile + reference + 115) / (tile * tile + 115), rel=1e-6)
    assert edit_tiled[1024]["seconds_per_tile"] > plain_tiled[1024]["seconds_per_tile"]


def test_a_gpu_of_the_measured_architecture_keeps_its_attention_kernels(comfy):
    """The H100 runs the H200's attention kernels (both sm_90): every config's attention is priced at the H200's
    measured fraction of the same peak, the attention family's gain with it; an Ada card is projected, no gain."""
    h200, h100, ada = (report(comfy, "--model", "flux-dev", "--size", "4096x4096", "--gpu", gpu, "--within", "1000h")
                       for gpu in ("h200", "h100-sxm", "rtx-4090"))

    def configs(out):
        return {c["config"]: c for c in out["configs"]}
    for name in ("stock", "overlay_attention"):
        assert (configs(h100)[name]["seconds_per_forward"]["attention"]
                == pytest.approx(configs(h200)[name]["seconds_per_forward"]["attention"]))
        assert configs(h100)[name]["attention_backend"] == configs(h200)[name]["attention_backend"]
    assert "none predicted" not in configs(h100)["overlay_attention"]["note"]
    assert "none predicted" in configs(ada)["overlay_attention"]["note"]


def test_flux2s_fp8_file_multiplies_in_fp8_in_stock_comfyui_where_the_card_can(comfy):
    """Comfy-Org's FLUX.2 file carries ComfyUI's quantization metadata: on a card with FP8 compute ComfyUI's own
    mixed-precision ops multiply its matrices in FP8, so stock's GEMMs are priced as FP8 and the pack's FP8 Linears
    add nothing (said); on a card without FP8 the same file multiplies in bf16."""
    def configs(gpu):
        out = report(comfy, "--model", "flux2-dev", "--size", "2048x2048", "--gpu", gpu, "--within", "1000h")
        return {c["config"]: c for c in out["configs"]}
    hopper, ampere = configs("h200"), configs("rtx-3090")
    assert hopper["stock"]["seconds_per_forward"]["gemm"] == pytest.approx(hopper["fp8"]["seconds_per_forward"]["gemm"])
    assert hopper["fp8"]["predicted"] and "already multiply in FP8" in hopper["fp8"]["note"]
    assert hopper["stock"]["seconds_per_forward"]["fp8_quantize"] > 0
    assert ampere["stock"]["seconds_per_forward"]["fp8_quantize"] == 0
    flux1 = report(comfy, "--model", "flux-dev", "--size", "2048x2048", "--gpu", "h200", "--within", "1000h")
    assert next(c for c in flux1["configs"] if c["config"] == "stock")["seconds_per_forward"]["fp8_quantize"] == 0


def test_under_dynamic_vram_the_fp8_linears_save_no_weight_memory(tmp_path):
    """A ComfyUI whose main.py starts DynamicVRAM (comfy-aimdo) streams the weights per call and the pack's FP8
    Linears quantise each for its call: the budget holds stock's weights for them there, and says why."""
    comfy = build_comfy_tree(tmp_path / "ComfyUI", era="latest", layout="plain")
    before = report(comfy, "--model", "wan-14b", "--size", "832x480", "--frames", "81", "--gpu", "rtx-4090")
    assert before["memory"]["weights_fp8_bytes"] < 0.6 * before["memory"]["weights_bf16_bytes"]
    assert before["comfyui"]["dynamic_vram"] is False
    main_py = comfy / "main.py"
    main_py.write_text((main_py.read_text() if main_py.exists() else "") + "\nimport comfy_aimdo.control\n")
    after = report(comfy, "--model", "wan-14b", "--size", "832x480", "--frames", "81", "--gpu", "rtx-4090")
    assert after["comfyui"]["dynamic_vram"] is True and "DynamicVRAM" in after["comfyui"]["vram"]
    assert after["memory"]["weights_fp8_bytes"] == after["memory"]["weights_bf16_bytes"]
    fp8 = next(c for c in after["configs"] if c["config"] == "fp8")
    assert fp8["weights_bytes"] == after["memory"]["weights_bf16_bytes"] and "codes per call" in fp8["note"]
    text = invoke("--target", str(comfy), "--model", "wan-14b", "--size", "832x480", "--frames", "81",
                  "--gpu", "rtx-4090").output
    assert "vram" in text and "(codes per call under DynamicVRAM)" in text
