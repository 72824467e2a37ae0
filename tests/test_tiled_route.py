"""The tiled-route harness (benchmarks/tiled_route.py) without a server: its prompts, the node's log line, the probe's
memory answer and the summary. The server run itself: `python -m benchmarks tiled-route --tiny --server-args=--cpu`
(benchmarks/README.md) and COMMAND=tiled-route scripts/comfy_server_for_device.sh on the GPU."""
from __future__ import annotations

import argparse

import pytest

from benchmarks import tiled_route
from benchmarks.tiled_route import ID

TILED = {"tile_px": 1024, "overlap_px": 128, "tile_batch": 4}


def links(prompt: dict) -> set:
    """(node, input, source node) for every link of a prompt, each source a node of the prompt."""
    found = set()
    for node, spec in prompt.items():
        for name, value in spec["inputs"].items():
            if isinstance(value, list):
                assert value[0] in prompt, f"{node}.{name} links to {value[0]}, not in the prompt"
                found.add((node, name, value[0]))
    return found


def test_the_route_is_one_prompt_from_a_2048_generation_to_the_saved_canvas():
    prompt = tiled_route.route_prompt((32768, 18432), (2048, 2048), "flux.safetensors", "ae.safetensors", "default",
                                      {"fp8_linear": True}, TILED, 4, 1, 0.3, 7, "tiled_route/route")
    kinds = {node: spec["class_type"] for node, spec in prompt.items()}
    assert sorted(kinds.values()) == sorted([
        "UNETLoader", "FusedDiTOps", "TiledSampling", "GenerationProbeZeroConditioning", "VAELoader",
        "EmptySD3LatentImage", "KSampler", "VAEDecode", "ImageScale", "TiledVAEEncode", "KSampler",
        "TiledVAEDecode", "SaveImagePNG"])
    edges = links(prompt)
    # the base generation samples the FusedDiTOps model untiled; the refinement the TiledSampling model
    assert (ID["base_sampler"], "model", ID["fused"]) in edges and (ID["refine"], "model", ID["tiled"]) in edges
    assert (ID["tiled"], "model", ID["fused"]) in edges and (ID["fused"], "model", ID["unet"]) in edges
    chain = [("decode", "samples", "base_sampler"), ("scale", "image", "decode"), ("encode", "pixels", "scale"),
             ("refine", "latent_image", "encode"), ("decode_tiled", "samples", "refine"),
             ("save", "images", "decode_tiled")]
    assert {(ID[a], name, ID[b]) for a, name, b in chain} <= edges
    base, refine = prompt[ID["base_sampler"]]["inputs"], prompt[ID["refine"]]["inputs"]
    assert (base["steps"], base["denoise"], base["cfg"], base["sampler_name"], base["scheduler"]) == (
        4, 1.0, 1.0, "euler", "simple")
    assert (refine["steps"], refine["denoise"], refine["seed"]) == (1, 0.3, 7)
    assert prompt[ID["base_latent"]]["inputs"] == {"width": 2048, "height": 2048, "batch_size": 1}
    scale = prompt[ID["scale"]]["inputs"]
    assert (scale["width"], scale["height"], scale["upscale_method"], scale["crop"]) == (
        32768, 18432, "bilinear", "disabled")
    for node in ("encode", "decode_tiled"):                  # the one-pass nodes with their defaults
        assert set(prompt[ID[node]]["inputs"]) == {"pixels" if node == "encode" else "samples", "vae"}
    assert prompt[ID["tiled"]]["inputs"] == {"model": [ID["fused"], 0], **TILED}
    assert prompt[ID["fused"]]["inputs"] == {"model": [ID["unet"], 0], "fp8_linear": True}
    cond = prompt[ID["cond"]]["inputs"]
    assert (cond["tokens"], cond["channels"], cond["pooled"], cond["guidance"]) == (256, 4096, 768, 3.5)


def test_the_users_alternative_is_the_peer_over_stock_comfyui_with_its_tiled_vae_and_save():
    peer = tiled_route.PEERS["tiled-diffusion"]
    prompt = tiled_route.route_prompt((16384, 16384), (2048, 2048), "f", "v", "fp8_e4m3fn", None, TILED, 4, 1, 0.3, 0,
                                      "p", peer=peer, vae_nodes=tiled_route.STOCK_VAE)
    kinds = {node: spec["class_type"] for node, spec in prompt.items()}
    assert "FusedDiTOps" not in kinds.values() and "TiledSampling" not in kinds.values()
    assert (kinds[ID["encode"]], kinds[ID["decode_tiled"]], kinds[ID["save"]]) == (
        "VAEEncodeTiled", "VAEDecodeTiled", "SaveImage")
    assert prompt[ID["refine"]]["inputs"]["model"] == [ID["peer"], 0]
    assert prompt[ID["peer"]]["inputs"]["model"] == [ID["unet"], 0]
    inputs = prompt[ID["decode_tiled"]]["inputs"]
    assert (inputs["tile_size"], inputs["overlap"]) == (1024, 64)
    peer_inputs = prompt[ID["peer"]]["inputs"]
    assert (peer_inputs["tile_width"], peer_inputs["tile_overlap"], peer_inputs["tile_batch_size"]) == (
        TILED["tile_px"], TILED["overlap_px"], TILED["tile_batch"])


def _route_nodes(seconds: dict) -> list:
    return [{"node": ID[key], "class_type": key, "seconds": seconds[role], "ran": True}
            for role, key in tiled_route.ROUTE_NODES.items()]


def test_end_to_end_scales_the_refinement_to_the_templates_steps_and_compares_per_node():
    ours = {"generate": 6.0, "decode_base": 0.5, "upscale": 0.5, "encode": 20.0, "refine": 100.0, "decode": 40.0,
            "save": 10.0}
    theirs = {**ours, "encode": 100.0, "refine": 130.0, "decode": 190.0, "save": 120.0}
    mine = {"role": "route", "size": "32768x18432", "steps": 1, "status": "success", "nodes": _route_nodes(ours)}
    peer = {"role": "peer route", "peer": "tiled-diffusion", "size": "32768x18432", "steps": 1, "status": "success",
            "nodes": _route_nodes(theirs)}
    entry = tiled_route.compare_routes(mine, [peer], 8)
    assert entry["ours"]["seconds"] == 6 + 0.5 + 0.5 + 20 + 100 * 8 + 40 + 10
    assert entry["alternative"]["seconds"] == 6 + 0.5 + 0.5 + 100 + 130 * 8 + 190 + 120
    assert entry["speedup_vs_alternative"] == round(entry["alternative"]["seconds"] / entry["ours"]["seconds"], 4)
    assert entry["speedup_per_node"]["decode"] == round(190 / 40, 4) and "scaled" in entry["note"]
    assert entry["ours"]["save_share"] == round(10 / entry["ours"]["seconds"], 4)
    failed = tiled_route.compare_routes(mine, [{**peer, "status": "error", "failed_at": {"node": "15"}}], 8)
    assert failed["alternative_error"] == {"node": "15"} and "speedup_vs_alternative" not in failed


def test_without_fused_dit_ops_the_tiled_node_takes_the_loaders_model_and_fp8_weights_are_the_loaders():
    prompt = tiled_route.route_prompt((4096, 4096), (2048, 2048), "f", "v", "fp8_e4m3fn", None, TILED, 4, 1, 0.3, 0,
                                      "p")
    assert ID["fused"] not in prompt
    assert prompt[ID["unet"]]["inputs"]["weight_dtype"] == "fp8_e4m3fn"
    assert prompt[ID["tiled"]]["inputs"]["model"] == [ID["unet"], 0]
    assert prompt[ID["base_sampler"]]["inputs"]["model"] == [ID["unet"], 0]


def test_the_refinement_alone_and_the_peer_in_place_of_the_node():
    ours = tiled_route.refine_prompt((8192, 8192), "f", "default", {}, TILED, 3, 0.3, 0, "m")
    links(ours)
    assert ours[ID["refine"]]["inputs"]["model"] == [ID["tiled"], 0]
    assert ours[ID["latent"]]["inputs"] == {"width": 8192, "height": 8192, "batch_size": 1}
    assert ours[ID["save_latent"]]["class_type"] == "SaveLatent"
    peer = tiled_route.refine_prompt((4096, 4096), "f", "default", {}, TILED, 3, 0.3, 0, "p",
                                     tiled_route.PEERS["tiled-diffusion"])
    links(peer)
    assert ID["tiled"] not in peer and peer[ID["refine"]]["inputs"]["model"] == [ID["peer"], 0]
    # ComfyUI-TiledDiffusion takes pixels (it divides by the VAE's 8 itself)
    assert peer[ID["peer"]]["inputs"] == {"model": [ID["fused"], 0], "method": "MultiDiffusion", "tile_width": 1024,
                                          "tile_height": 1024, "tile_overlap": 128, "tile_batch_size": 4}


def test_the_read_back_forces_the_png_to_load_and_says_its_size():
    prompt = tiled_route.readback_prompt("route_00001_.png", True)
    links(prompt)
    assert [prompt[ID[n]]["class_type"] for n in ("load", "size", "show_width", "show_height")] == [
        "LoadImage", "GetImageSize", "PreviewAny", "PreviewAny"]
    assert tiled_route.readback_size({"texts": {ID["show_width"]: ["32768"], ID["show_height"]: ["18432"]}}) == [
        32768, 18432]
    assert tiled_route.readback_size({}) is None
    older = tiled_route.readback_prompt("x.png", False)
    links(older)
    assert [spec["class_type"] for spec in older.values()] == ["LoadImage", "ImageScaleBy", "PreviewImage"]


@pytest.mark.parametrize("line, expected", [
    ("\x1b[32m2026-12-04 12:00:00 [INFO] fused_dit: Tiled Sampling: 777 tiles of 1024 px, overlap 128 px, on a "
     "32768x18432 canvas (21 x 37), 4 per batch, 1.23 GiB of activations a tile (planned: tile, batch); canvas on "
     "the GPU\x1b[0m",
     {"tiles": 777, "tile_px": 1024, "overlap_px": 128, "batch": 4, "canvas": "32768x18432", "grid": "21 x 37",
      "tile_gib": 1.23, "planned": "tile, batch", "canvas_on": "GPU", "untiled": False}),
    ("Tiled Sampling: 777 tiles of 1024 px (overlap 128 px), batch 4, 3.2 s",
     {"tiles": 777, "tile_px": 1024, "overlap_px": 128, "batch": 4, "untiled": False}),
    ("Tiled Sampling: the 256x256 canvas fits one 1024 px tile: the model runs untiled", {"untiled": True}),
])
def test_the_nodes_log_line_gives_its_tiles_and_batch(line, expected):
    found = tiled_route.parse_tiled_lines(f"other line\n{line}\nnext line\n")
    assert len(found) == 1
    assert {k: v for k, v in found[0].items() if k != "line"} == expected
    assert found[0]["line"].startswith(line.split("Tiled Sampling:")[1].strip()[:20])


def test_the_model_loading_lines_are_kept():
    log = "a\nRequested to load Flux\nmodel weight dtype torch.bfloat16\nloaded partially; 20000.0 MB usable\n"
    assert tiled_route.model_load_lines(log) == ["Requested to load Flux", "loaded partially; 20000.0 MB usable"]


def test_the_probes_memory_answer_gives_each_nodes_torch_peak():
    gib = 2 ** 30
    answer = {"cuda": True, "memory_fraction": 0.17, "device_free": 100 * gib, "device_total": 140 * gib,
              "nodes": [{"prompt_id": "p", "node": "15", "max_allocated": 20 * gib, "max_reserved": 22 * gib},
                        {"prompt_id": "p", "node": "16", "max_allocated": 3 * gib, "max_reserved": 22 * gib},
                        {"prompt_id": "q", "node": "15", "max_allocated": 21 * gib, "max_reserved": 21 * gib},
                        {"prompt_id": "p", "node": "1"}],
              "since_last_node": {}}
    found = tiled_route.memory_nodes(answer)
    assert found["15"] == {"torch_peak_allocated_gib": 21.0, "torch_peak_reserved_gib": 22.0}
    assert found["16"]["torch_peak_allocated_gib"] == 3.0 and "1" not in found
    assert found["_device"] == {"cuda": True, "memory_fraction": 0.17, "free_gib": 100.0, "total_gib": 140.0}
    assert tiled_route.memory_nodes(None) == {}
    assert tiled_route.memory_nodes({"cuda": False, "nodes": []})["_device"]["total_gib"] is None


def test_the_probe_source_compiles_and_offers_the_memory_endpoint():
    from benchmarks import comfy_server
    compile(comfy_server.PROBE_SOURCE, "generation_probe.py", "exec")
    for needed in ("/generation_probe/memory", "reset_peak_memory_stats", "set_per_process_memory_fraction",
                   tiled_route.MEMORY_FRACTION_ENV, '"executing"'):
        assert needed in comfy_server.PROBE_SOURCE


def test_the_memory_limit_says_which_limit_held():
    records = [{"nodes": [{"torch_peak_reserved_gib": 20.5, "peak_gpu_used_gib": 26.0}]},
               {"nodes": [{"torch_peak_reserved_gib": 21.0, "peak_gpu_used_gib": None}]}]
    verdict = tiled_route.limit_verdict(records, 24.0, 0.17, "--reserve-vram 115 --fast", 139.8)
    assert (verdict["reserve_vram_gib"], verdict["fraction_gib"]) == (115.0, 23.77)
    assert (verdict["torch_peak_reserved_gib"], verdict["device_peak_used_gib"]) == (21.0, 26.0)
    assert verdict["torch_within"] and not verdict["device_within"] and verdict["held"].startswith("torch's")
    assert tiled_route.limit_verdict([{"nodes": []}], 24.0, None, "--cpu", None)["held"].startswith("not measured")


def options(*argv):
    parser = argparse.ArgumentParser()
    tiled_route.add_arguments(parser)
    parsed = parser.parse_args(["--comfyui", "C", "--work", "W", "--make-checkpoint", "K", "--out", "o.json", *argv])
    return parsed, parser


def test_the_settings_default_to_the_issues_route_and_tiny_to_the_smoke_test():
    found = tiled_route.settings(*options())
    assert found["sizes"] == [(16384, 16384), (32768, 18432)] and found["base"] == (2048, 2048)
    assert found["memory_check"] == (8192, 8192) and found["peer_size"] == (4096, 4096)
    assert found["tiled"] == {"tile_px": 0, "overlap_px": -1, "tile_batch": 0}
    # the peer needs numbers: ours planned gives both 1024 / 128 / 4, side by side
    assert found["peer_tiled"] == {"tile_px": 1024, "overlap_px": 128, "tile_batch": 4}
    found = tiled_route.settings(*options("--tile-px", "768", "--tile-batch", "8", "--memory-check", "",
                                          "--peer", "tiled-diffusion=/tmp/td", "--node-config", '{"fp8_linear": true}'))
    assert found["peer_tiled"] == {"tile_px": 768, "overlap_px": 128, "tile_batch": 8}
    assert found["memory_check"] is None and str(found["peers"]["tiled-diffusion"]) == "/tmp/td"
    assert found["node_config"] == {"fp8_linear": True}
    tiny = tiled_route.settings(*options("--tiny"))
    assert tiny["sizes"] == [(512, 512), (768, 512)] and tiny["base"] == (256, 256)
    assert tiny["tiled"] == tiny["peer_tiled"] == {"tile_px": 256, "overlap_px": 64, "tile_batch": 2}
    for bad in (["--peer", "ultimate=/x"], ["--timing-steps", "3", "1"], ["--sizes", "big"], ["--denoise", "0"]):
        with pytest.raises(SystemExit):
            tiled_route.settings(*options(*bad))


def test_the_node_defaults_come_from_object_info():
    info = {"FusedDiTOps": {"input": {"required": {"model": ["MODEL"], "fp8_linear": ["BOOLEAN", {"default": False}],
                                                   "gate": ["BOOLEAN", {"default": True}]},
                                      "optional": {"attention_mode": [["exact", "fast"], {}]}}}}
    assert tiled_route.node_defaults(info, "FusedDiTOps") == {"fp8_linear": False, "gate": True,
                                                              "attention_mode": "exact"}


def node(node_id, seconds, **more):
    return {"node": node_id, "class_type": "KSampler", "seconds": seconds, "ran": True, **more}


def test_the_summary_gives_steps_memory_and_the_peer_side_by_side():
    refine = ID["refine"]
    log = [{"tiles": 81, "tile_px": 1024, "overlap_px": 128, "batch": 4}]
    big_log = [{"tiles": 777, "tile_px": 1024, "overlap_px": 128, "batch": 4}]
    peaks = {"torch_peak_allocated_gib": 30.0, "torch_peak_reserved_gib": 32.0, "peak_gpu_used_gib": 34.0}
    prompts = [
        {"role": "warm-up", "size": "4096x4096", "steps": 1, "status": "success", "nodes": [node(refine, 9.0)]},
        {"role": "peer", "peer": "tiled-diffusion", "size": "4096x4096", "steps": 1, "status": "success",
         "nodes": [node(refine, 5.0)]},
        {"role": "peer", "peer": "tiled-diffusion", "size": "4096x4096", "steps": 3, "status": "success",
         "nodes": [node(refine, 13.0)]},
        {"role": "ours beside the peer", "size": "4096x4096", "steps": 1, "status": "success",
         "nodes": [node(refine, 4.0)]},
        {"role": "ours beside the peer", "size": "4096x4096", "steps": 3, "status": "success",
         "nodes": [node(refine, 10.0)], "tiled_sampling_log": log},
        {"role": "memory check", "size": "8192x8192", "steps": 1, "status": "success",
         "nodes": [node(refine, 12.0, **peaks)], "tiled_sampling_log": log},
        {"role": "memory check", "size": "8192x8192", "steps": 3, "status": "success",
         "nodes": [node(refine, 30.0, **peaks)], "tiled_sampling_log": log, "device": {"total_gib": 139.8}},
        {"role": "route", "size": "32768x18432", "steps": 1, "status": "success",
         "nodes_in_prompt": {"1": "UNETLoader", refine: "KSampler"},
         "nodes": [node(refine, 90.0, **{**peaks, "torch_peak_reserved_gib": 34.0})], "tiled_sampling_log": big_log,
         "png": {"width_height": [32768, 18432]}},
        {"role": "readback", "size": "32768x18432", "status": "success", "read_width_height": [32768, 18432],
         "nodes": [{"node": ID["load"], "class_type": "LoadImage", "seconds": 19.0, "peak_rss_gib": 28.0}]}]
    report = {"servers": {"route": {"prompts": prompts}}, "timing_steps": [1, 3], "peer_size": "4096x4096",
              "peer_tiled": TILED, "peers": {"tiled-diffusion": {"registered": True, "import_line": "0.1 seconds"}},
              "conditions": "ComfyUI 0.33.0, dynamic", "memory_fraction": None, "server_args": ""}
    summary = tiled_route.summarise(report, argparse.Namespace(limit_gib=24.0))
    route = summary["routes"][0]
    assert route["every_node_ran"] and route["cached_nodes"] == ["1"] and route["tiles"] == 777
    assert route["refine_s_per_step"] == 90.0 and route["s_per_tile_step"] == round(90 / 777, 4)
    assert route["read_back_width_height"] == [32768, 18432] and route["peaks"]["peak_rss_gib"] == 28.0
    memory = summary["memory_check"]
    assert memory["against"] == "32768x18432" and memory["s_per_step"] == 9.0
    assert memory["ratio"]["torch_peak_reserved_gib"] == round(34 / 32, 4)
    assert memory["within_10_percent"] == {"torch_peak_allocated_gib": True, "torch_peak_reserved_gib": True,
                                           "peak_gpu_used_gib": True}
    peer = summary["peer"]["tiled-diffusion"]
    assert (peer["ours_s_per_step"], peer["peer_s_per_step"], peer["speedup"]) == (3.0, 4.0, 1.3333)
    assert "peer_error" not in peer
    assert summary["limit"]["device_total_gib"] == 139.8 and summary["limit"]["device_within"] is False
    assert all(section["conditions"] == "ComfyUI 0.33.0, dynamic"
               for section in (route, memory, peer, summary["limit"]))


def test_a_peer_that_failed_is_recorded_with_its_error():
    failed = {"node": ID["refine"], "class_type": "KSampler", "exception": "RuntimeError: shapes"}
    prompts = [{"role": "peer", "peer": "tiled-diffusion", "size": "4096x4096", "steps": s, "status": "error",
                "failed_at": failed, "nodes": []} for s in (1, 3)]
    report = {"servers": {"route": {"prompts": prompts}}, "timing_steps": [1, 3], "peer_size": "4096x4096",
              "peer_tiled": TILED, "peers": {"tiled-diffusion": {"registered": True}}, "conditions": "c"}
    peer = tiled_route.summarise(report, argparse.Namespace(limit_gib=24.0))["peer"]["tiled-diffusion"]
    assert peer["peer_error"] == [failed, failed] and "speedup" not in peer


def test_every_figure_names_the_release_its_vram_mode_and_the_servers_arguments():
    from benchmarks import comfy_release
    comfyui = comfy_release.Release("0.33.0", "fb7e2de42af54f55a762aefa6b8abc2edb661f75", "2026-08-21", True, True,
                                    True).as_dict()   # as run() records it
    line = tiled_route.conditions({"comfyui": comfyui, "server": {"vram_mode": "dynamic"},
                                   "server_args": "--reserve-vram 116", "memory_fraction": 0.1717,
                                   "weight_dtype": "fp8_e4m3fn", "fused_dit_ops": {"fp8_linear": True},
                                   "gpu": "cuda:0 NVIDIA H200"})
    for said in ("ComfyUI 0.33.0 (fb7e2de4)", "VRAM mode dynamic", "'--reserve-vram 116'", "memory fraction 0.1717",
                 "weight_dtype fp8_e4m3fn", '{"fp8_linear": true}', "NVIDIA H200"):
        assert said in line


def test_on_an_emulated_card_the_device_peaks_are_the_servers_share():
    from benchmarks.card import server_share
    records = [{"nodes": [{"node": "15", "peak_gpu_used_gib": 80.0}, {"node": "16", "peak_gpu_used_gib": None}]}]
    server_share(records, 58.5)
    server_share(records, 58.5)                      # once: a second pass leaves the share as it is
    assert records[0]["nodes"][0] == {"node": "15", "peak_gpu_used_gib": 21.5,
                                      "peak_device_used_gib_with_holder": 80.0}
    assert records[0]["nodes"][1]["peak_gpu_used_gib"] is None
    report = {"comfyui": {"comfyui_version": "0.33.0"}, "server": {"vram_mode": "dynamic"},
              "card": {"card_gib": 22.0, "held_gib": 58.5}}
    assert "a 22.0 GiB card (another process held 58.5 GiB" in tiled_route.conditions(report)


def test_the_native_step_is_stock_comfyui_untiled_and_each_tile_step_is_held_against_it():
    native = tiled_route.native_prompt((1024, 1024), "f", "fp8_e4m3fn", 3, 0, "n")
    links(native)
    kinds = {spec["class_type"] for spec in native.values()}
    assert not kinds & {"FusedDiTOps", "TiledSampling", "TiledDiffusion"}
    assert native[ID["refine"]]["inputs"]["model"] == [ID["unet"], 0]
    assert native[ID["refine"]]["inputs"]["denoise"] == 1.0 and native[ID["refine"]]["inputs"]["steps"] == 3
    assert native[ID["latent"]]["inputs"] == {"width": 1024, "height": 1024, "batch_size": 1}
    refine = ID["refine"]
    prompts = [
        {"role": "native stock", "size": "1024x1024", "steps": 1, "status": "success", "nodes": [node(refine, 1.0)]},
        {"role": "native stock", "size": "1024x1024", "steps": 3, "status": "success", "nodes": [node(refine, 1.4)]},
        {"role": "route", "size": "16384x16384", "steps": 1, "status": "success", "nodes": [node(refine, 20.0)],
         "tiled_sampling_log": [{"tiles": 200, "tile_px": 1024, "overlap_px": 128, "batch": 4}]}]
    report = {"servers": {"route": {"prompts": prompts}}, "timing_steps": [1, 3], "peer_size": "4096x4096",
              "peer_tiled": TILED, "peers": {}, "memory_fraction": None, "server_args": "",
              "fused_dit_ops": {"fp8_linear": True}, "comfyui": {"comfyui_version": "0.33.0"}}
    summary = tiled_route.summarise(report, argparse.Namespace(limit_gib=24.0))
    assert summary["native"]["s_per_step"] == 0.2 and summary["native"]["size"] == "1024x1024"
    assert "FusedDiTOps none" in summary["native"]["conditions"]
    assert summary["routes"][0]["tile_step_vs_native"] == round(0.1 / 0.2, 4)


def test_the_peers_route_runs_at_the_canvases_named_and_native_defaults_to_1024():
    found = tiled_route.settings(*options())
    assert found["native"] == (1024, 1024) and found["peer_sizes"] is None
    found = tiled_route.settings(*options("--peer-sizes", "16384x16384", "--native", ""))
    assert found["peer_sizes"] == [(16384, 16384)] and found["native"] is None
    with pytest.raises(SystemExit):
        tiled_route.settings(*options("--peer-sizes", "8192x8192"))
