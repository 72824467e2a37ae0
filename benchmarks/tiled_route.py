"""The tiled 32K route through a real ComfyUI server (issue 37): the pack's TiledSampling node as a user runs it.

One copy of a release (--comfyui DIR, copied into --work) gets the catalog's comfyui/max-resolution and
comfyui/pil-pixel-limit through `python -m applier apply`, the pack through `python -m applier overlay install`, the
probe custom node of comfy_server.py (a zero text conditioning, so no text encoder is needed; torch's CUDA peaks per
node behind GET /generation_probe/memory), random-weight Flux-dev (`python -m benchmarks checkpoint`, UNETLoader's
format) and Flux's VAE; it is started as its main.py starts by default (DynamicVRAM through comfy-aimdo on an NVIDIA
GPU; --server-args adds flags; --memory-fraction F makes the probe call torch.cuda.set_per_process_memory_fraction).
The peer, ComfyUI-TiledDiffusion (--peer tiled-diffusion=DIR), is copied into custom_nodes/ at run time.

Prompts of ComfyUI's own nodes, in its API format, in this order:
  warm-up   the refinement below at --peer-size, --timing-steps LOW: the model's loading, the FP8 quantisation and
            the kernels' first launches happen here, so no later figure holds them;
  peer      at --peer-size, the refinement with TiledDiffusion (MultiDiffusion) and with TiledSampling, both given the
            same tile, overlap and batch (--peer-tile/--peer-overlap/--peer-batch), each at LOW and HIGH steps:
            seconds per step = the difference of the KSampler node's seconds over the difference of steps;
  native    stock ComfyUI untiled at --native WxH (UNETLoader -> KSampler, no FusedDiTOps, denoise 1.0) at LOW and
            HIGH steps: the native stock step a tile-step is held against (issue 48: at most 0.70x of it);
  memory    the refinement at --memory-check WxH (EmptySD3LatentImage -> KSampler with the TiledSampling model,
            denoise --denoise) at LOW and HIGH steps: its peaks against the largest route's, and a clean seconds per
            tile and step;
  route     per --sizes WxH, the issue's route as ONE prompt:
              UNETLoader -> FusedDiTOps (--node-config; --no-fused: none) -> TiledSampling (--tile-px, --overlap-px,
              --tile-batch; 0/-1/0: planned by the node); GenerationProbeZeroConditioning -> positive, negative;
              EmptySD3LatentImage --base -> KSampler (the FusedDiTOps model, untiled; --base-steps, euler, simple,
              cfg 1.0, denoise 1.0) -> VAEDecode -> ImageScale (WxH, bilinear, crop disabled) -> VAEEncodeTiled
              (1024, 64, 64, 8) -> KSampler (the TiledSampling model, --steps, --denoise) -> VAEDecodeTiled
              (1024, 64, 64, 8) -> SaveImage
            and the peer's route at the --peer-sizes canvases (default every one of --sizes);
            then LoadImage of that PNG -> GetImageSize -> PreviewAny (width, height): the PNG reads back at WxH.
KSampler with denoise d < 1 builds int(steps / d) schedule steps and runs the last `steps`: --steps is what runs.

Per node: seconds (the websocket's "executing" messages), its progress events (the node's bar counts tiles x steps),
the peaks while it ran of the server's RSS and of the device's memory in use (nvidia-smi, the whole device), and
torch's own peak allocated and reserved (the probe, read where the executor moves to the next node). Per sampling
run the node's "Tiled Sampling:" log line (tiles, tile, overlap, batch). The refinement KSampler's seconds per step
in a route is its node seconds / --steps: that includes the sampler's set-up for the canvas (noise, the canvas on
the GPU or the host) but no model loading or FP8 quantisation, which the warm-up paid. Every figure names the
release, its VRAM mode, the server's arguments and the memory limits (`conditions`); `limit` says whether the
run stayed within --limit-gib (24: an RTX 4090's card) by torch's peak reserved and by the device's use.

--card-gib G runs the server on a G GiB card for real: another process holds the rest of the device's free memory
(benchmarks/card.py), so comfy-aimdo, torch and ComfyUI meet that card's limit; the device peaks are then the
server's share (nvidia-smi's sample less the holder's).

The weights are random: the figures are for time, memory and which code ran, never image quality.

    python -m benchmarks tiled-route --comfyui DIR --work /tmp/route --make-checkpoint /tmp/ckpt \\
        --peer tiled-diffusion=/tmp/ComfyUI-TiledDiffusion --out tiled-route-RELEASE.json
    python -m benchmarks tiled-route --comfyui DIR --work W --make-checkpoint C --tiny --server-args=--cpu --out O
        # CPU smoke test of the plumbing: tiny Flux, 512 px canvases from a 256 px base, 256 px tiles
On the device machine: COMMAND=tiled-route scripts/comfy_server_for_device.sh (benchmarks/README.md).
"""
from __future__ import annotations

import contextlib
import json
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
from pathlib import Path

from . import comfy_release, results
from .card import Ballast, server_share
from .canvas_pipeline import (PATCHES, PromptCutOff, apply_patches, gib, link, make_vae, max_of, parse_size,
                              png_size, prepare, run_prompt, serve, server_log)
from .comfy_server import (REPO_ROOT, MODELS, custom_node_import, http_json, install_overlay, log_lines,
                           make_checkpoint, make_venv, link_checkpoint, write_probe)
from .workflow_api import to_prompt

NOTE = ("Weights are seeded random numbers (Flux-dev and Flux's VAE in the release's key format): the figures are "
        "for time, memory and which code ran, never image quality.")
VAE_TILING = {"tile_size": 1024, "overlap": 64, "temporal_size": 64, "temporal_overlap": 8}
SAMPLER = {"sampler_name": "euler", "scheduler": "simple", "cfg": 1.0}
PEERS = {"tiled-diffusion": {"folder": "ComfyUI-TiledDiffusion", "class_type": "TiledDiffusion",
                             "method": "MultiDiffusion"}}
TINY = {"sizes": "512x512,768x512", "base": "256x256", "memory_check": "384x384", "peer_size": "512x512",
        "native": "256x256", "tile": (256, 64, 2)}
PEER_DEFAULT_TILE = (1024, 128, 4)   # the peer needs numbers: where ours is planned (0/-1/0), these for both
MEMORY_FRACTION_ENV = "GENERATION_PROBE_MEMORY_FRACTION"
# node ids of the prompts: the model chain, then each part
ID = {"unet": "1", "fused": "2", "tiled": "3", "cond": "4", "vae": "5", "peer": "6",
      "base_latent": "10", "base_sampler": "11", "decode": "12", "scale": "13", "encode": "14", "refine": "15",
      "decode_tiled": "16", "save": "17", "latent": "20", "save_latent": "22",
      "load": "30", "size": "31", "show_width": "32", "show_height": "33"}


# ------------------------------------------------------------------------------------------------- prompts
def model_chain(checkpoint: str, weight_dtype: str, fused: dict | None, tiled: dict, peer: dict | None = None
                ) -> tuple[dict, list, list]:
    """UNETLoader -> [FusedDiTOps] -> TiledSampling (or the peer's node); the zero conditioning and the VAE.
    (nodes, the untiled model's output, the tiled model's output)."""
    nodes = {ID["unet"]: {"class_type": "UNETLoader",
                          "inputs": {"unet_name": checkpoint, "weight_dtype": weight_dtype}},
             ID["cond"]: {"class_type": "GenerationProbeZeroConditioning",
                          "inputs": {key: MODELS["flux-dev"][key] for key in ("tokens", "pooled", "guidance")}
                          | {"channels": 4096}}}
    model = [ID["unet"], 0]
    if fused is not None:
        nodes[ID["fused"]] = {"class_type": "FusedDiTOps", "inputs": {"model": model, **fused}}
        model = [ID["fused"], 0]
    if peer is None:
        nodes[ID["tiled"]] = {"class_type": "TiledSampling", "inputs": {"model": model, **tiled}}
        return nodes, model, [ID["tiled"], 0]
    nodes[ID["peer"]] = {"class_type": peer["class_type"], "inputs": {
        "model": model, "method": peer["method"], "tile_width": tiled["tile_px"], "tile_height": tiled["tile_px"],
        "tile_overlap": tiled["overlap_px"], "tile_batch_size": tiled["tile_batch"]}}
    return nodes, model, [ID["peer"], 0]


EXAMPLE_WORKFLOW = REPO_ROOT / "overlays" / "comfyui_fused_dit" / "example_workflows" / "make_a_32k_image_flux.json"


def workflow_prompt(workflow: dict, object_info: dict, checkpoint: str, vae: str, weight_dtype: str,
                    fused: dict | None, base: tuple, size: tuple, base_steps: int, steps: int) -> dict:
    """The pack's example workflow as the server's front end would queue it (workflow_api.to_prompt with the server's
    own object_info), then fitted to this run: its model and VAE files, the zero conditioning in place of the text
    encoders (DualCLIPLoader and CLIPTextEncode: no text encoder weights here), the base and canvas sizes and step
    counts given, FusedDiTOps' inputs where a node config is given. Every other node and input is the template's."""
    prompt = to_prompt(workflow, object_info)
    zero = {key: MODELS["flux-dev"][key] for key in ("tokens", "pooled", "guidance")} | {"channels": 4096}
    for node_id, node in list(prompt.items()):
        kind, inputs = node["class_type"], node["inputs"]
        if kind == "DualCLIPLoader":
            del prompt[node_id]
        elif kind == "CLIPTextEncode":
            prompt[node_id] = {"class_type": "GenerationProbeZeroConditioning", "inputs": dict(zero)}
        elif kind == "UNETLoader":
            inputs.update(unet_name=checkpoint, weight_dtype=weight_dtype)
        elif kind == "VAELoader":
            inputs["vae_name"] = vae
        elif kind == "EmptySD3LatentImage":
            inputs.update(width=base[0], height=base[1])
        elif kind == "ImageScale":
            inputs.update(width=size[0], height=size[1])
        elif kind == "KSampler":
            inputs["steps"] = steps if inputs["denoise"] < 1 else base_steps
        elif kind == "FusedDiTOps" and fused is not None:
            inputs.update(fused)
    return prompt


def ksampler(model: list, latent: list, steps: int, denoise: float, seed: int) -> dict:
    return {"class_type": "KSampler", "inputs": {"model": model, "seed": seed, "steps": steps, **SAMPLER,
                                                 "positive": [ID["cond"], 0], "negative": [ID["cond"], 0],
                                                 "latent_image": latent, "denoise": denoise}}


# the route's encode, decode and save: the pack's one-pass nodes, or ComfyUI's own (the peer's route, and ours
# with --stock-vae)
PACK_VAE = {"encode": "TiledVAEEncode", "decode": "TiledVAEDecode", "save": "SaveImagePNG"}
STOCK_VAE = {"encode": "VAEEncodeTiled", "decode": "VAEDecodeTiled", "save": "SaveImage"}


def route_prompt(size: tuple, base: tuple, checkpoint: str, vae: str, weight_dtype: str, fused: dict | None,
                 tiled: dict, base_steps: int, steps: int, denoise: float, seed: int, prefix: str,
                 peer: dict | None = None, vae_nodes: dict = PACK_VAE) -> dict:
    """The issue's route as one prompt: generate at `base`, upscale to `size` (W, H), encode, refine tiled, decode,
    save. With `peer`, the peer's node in place of TiledSampling over the loader's model (stock ComfyUI)."""
    (width, height), (base_width, base_height) = size, base
    nodes, untiled, tiled_model = model_chain(checkpoint, weight_dtype, fused, tiled, peer)
    vae_inputs = VAE_TILING if vae_nodes["encode"] == STOCK_VAE["encode"] else {}
    nodes.update({
        ID["vae"]: {"class_type": "VAELoader", "inputs": {"vae_name": vae}},
        ID["base_latent"]: {"class_type": "EmptySD3LatentImage",
                            "inputs": {"width": base_width, "height": base_height, "batch_size": 1}},
        ID["base_sampler"]: ksampler(untiled, [ID["base_latent"], 0], base_steps, 1.0, seed),
        ID["decode"]: {"class_type": "VAEDecode",
                       "inputs": {"samples": [ID["base_sampler"], 0], "vae": [ID["vae"], 0]}},
        ID["scale"]: {"class_type": "ImageScale", "inputs": {"image": [ID["decode"], 0], "upscale_method": "bilinear",
                                                             "width": width, "height": height, "crop": "disabled"}},
        ID["encode"]: {"class_type": vae_nodes["encode"],
                       "inputs": {"pixels": [ID["scale"], 0], "vae": [ID["vae"], 0], **vae_inputs}},
        ID["refine"]: ksampler(tiled_model, [ID["encode"], 0], steps, denoise, seed),
        ID["decode_tiled"]: {"class_type": vae_nodes["decode"],
                             "inputs": {"samples": [ID["refine"], 0], "vae": [ID["vae"], 0], **vae_inputs}},
        ID["save"]: {"class_type": vae_nodes["save"],
                     "inputs": {"images": [ID["decode_tiled"], 0], "filename_prefix": prefix}}})
    return nodes


def refine_prompt(size: tuple, checkpoint: str, weight_dtype: str, fused: dict | None, tiled: dict, steps: int,
                  denoise: float, seed: int, prefix: str, peer: dict | None = None) -> dict:
    """The refinement alone: EmptySD3LatentImage WxH -> KSampler (the TiledSampling model, or the peer's) ->
    SaveLatent (an output, so the server runs it)."""
    width, height = size
    nodes, _, tiled_model = model_chain(checkpoint, weight_dtype, fused, tiled, peer)
    nodes.update({
        ID["latent"]: {"class_type": "EmptySD3LatentImage", "inputs": {"width": width, "height": height,
                                                                       "batch_size": 1}},
        ID["refine"]: ksampler(tiled_model, [ID["latent"], 0], steps, denoise, seed),
        ID["save_latent"]: {"class_type": "SaveLatent", "inputs": {"samples": [ID["refine"], 0],
                                                                   "filename_prefix": prefix}}})
    return nodes


def native_prompt(size: tuple, checkpoint: str, weight_dtype: str, steps: int, seed: int, prefix: str) -> dict:
    """Stock ComfyUI untiled: EmptySD3LatentImage WxH -> KSampler (the loader's model, denoise 1.0) -> SaveLatent;
    its KSampler has the refinement's id, so per_step reads it as it reads a refinement."""
    width, height = size
    nodes, untiled, _ = model_chain(checkpoint, weight_dtype, None, {})
    nodes.pop(ID["tiled"])
    nodes.update({
        ID["latent"]: {"class_type": "EmptySD3LatentImage", "inputs": {"width": width, "height": height,
                                                                       "batch_size": 1}},
        ID["refine"]: ksampler(untiled, [ID["latent"], 0], steps, 1.0, seed),
        ID["save_latent"]: {"class_type": "SaveLatent", "inputs": {"samples": [ID["refine"], 0],
                                                                   "filename_prefix": prefix}}})
    return nodes


def readback_prompt(image: str, get_size: bool) -> dict:
    """LoadImage of the route's PNG; GetImageSize -> PreviewAny (its width and height come back in the history)
    where the release has both, else ImageScaleBy 0.01 -> PreviewImage. Either forces the whole PNG to be read."""
    nodes = {ID["load"]: {"class_type": "LoadImage", "inputs": {"image": image}}}
    if get_size:
        nodes.update({ID["size"]: {"class_type": "GetImageSize", "inputs": {"image": [ID["load"], 0]}},
                      ID["show_width"]: {"class_type": "PreviewAny", "inputs": {"source": [ID["size"], 0]}},
                      ID["show_height"]: {"class_type": "PreviewAny", "inputs": {"source": [ID["size"], 1]}}})
    else:
        nodes.update({ID["size"]: {"class_type": "ImageScaleBy", "inputs": {
                          "image": [ID["load"], 0], "upscale_method": "bilinear", "scale_by": 0.01}},
                      ID["show_width"]: {"class_type": "PreviewImage", "inputs": {"images": [ID["size"], 0]}}})
    return nodes


# ------------------------------------------------------------------------------------------------- parsing
TILED_LINE = "Tiled Sampling:"
_FIELDS = {   # each read alone, so both spellings of the line parse: "(overlap 128 px), batch 4" and
    # ", overlap 128 px, on a 32768x18432 canvas (21 x 37), 4 per batch, 1.23 GiB of activations a tile"
    "tiles": (r"(\d+) tiles? of", int), "tile_px": (r"tiles? of (\d+) px", int),
    "overlap_px": (r"overlap (\d+) px", int), "batch": (r"(?:batch (\d+)|(\d+) per batch)", int),
    "canvas": (r"on an? (\d+x\d+) canvas", str), "grid": (r"canvas \((\d+ x \d+)\)", str),
    "tile_gib": (r"([\d.]+) GiB of activations", float), "planned": (r"\(planned: ([^)]*)\)", str),
    "canvas_on": (r"canvas on the (\w+)", str)}


def parse_tiled_lines(log_text: str) -> list[dict]:
    """The node's "Tiled Sampling:" lines in a stretch of the server's log: each with what it says (tiles, tile_px,
    overlap_px, batch, and canvas, grid, tile_gib, planned, canvas_on where said); `untiled` where it ran the
    model whole, and the line itself."""
    found = []
    for line in log_lines(log_text):
        if TILED_LINE not in line:
            continue
        text = line.split(TILED_LINE, 1)[1].strip()
        entry: dict = {"line": text}
        for name, (pattern, kind) in _FIELDS.items():
            match = re.search(pattern, text)
            if match:
                entry[name] = kind(next(group for group in match.groups() if group is not None))
        entry["untiled"] = "tiles" not in entry and ("untiled" in text or "fits one" in text)
        found.append(entry)
    return found


LOAD_MARKERS = ("Requested to load", "loaded completely", "loaded partially", "lowvram", "Unloaded", "offload")


def model_load_lines(log_text: str) -> list[str]:
    """What ComfyUI said of loading models in a stretch of its log (a full canvas's memory estimate can make it
    load the model partially: the tiled refinement should load it as a tile needs)."""
    return [line for line in log_lines(log_text) if any(marker in line for marker in LOAD_MARKERS)][:20]


def memory_nodes(answer: dict | None) -> dict:
    """/generation_probe/memory's answer as {node id: {"torch_peak_allocated_gib", "torch_peak_reserved_gib"}} (the
    highest where a node ran twice), plus the device's free/total and the memory fraction, under "_device"."""
    if not answer:
        return {}
    found: dict = {}
    for entry in answer.get("nodes", []):
        node = str(entry.get("node"))
        if "max_allocated" not in entry:
            continue
        seen = found.setdefault(node, {"torch_peak_allocated_gib": 0.0, "torch_peak_reserved_gib": 0.0})
        seen["torch_peak_allocated_gib"] = max(seen["torch_peak_allocated_gib"], gib(entry["max_allocated"]))
        seen["torch_peak_reserved_gib"] = max(seen["torch_peak_reserved_gib"], gib(entry["max_reserved"]))
    found["_device"] = {"cuda": answer.get("cuda"), "memory_fraction": answer.get("memory_fraction"),
                        "free_gib": gib(answer.get("device_free")), "total_gib": gib(answer.get("device_total"))}
    return found


def node_of(record: dict, node_id: str) -> dict:
    return next((n for n in record.get("nodes", []) if n["node"] == node_id), {})


def per_step(low: dict, high: dict, low_steps: int, high_steps: int) -> float | None:
    """Seconds per step of the refinement KSampler from two runs at two step counts (set-up cancels)."""
    a, b = node_of(low, ID["refine"]).get("seconds"), node_of(high, ID["refine"]).get("seconds")
    if a is None or b is None or high_steps <= low_steps:
        return None
    return round((b - a) / (high_steps - low_steps), 4)


def peaks(record: dict, node_id: str) -> dict:
    node = node_of(record, node_id)
    return {key: node.get(key) for key in ("torch_peak_allocated_gib", "torch_peak_reserved_gib",
                                           "peak_gpu_used_gib", "peak_rss_gib")}


def ratio(a, b):
    return round(a / b, 4) if a is not None and b else None


def limit_verdict(records: list[dict], limit_gib: float, fraction: float | None, server_args: str,
                  total_gib: float | None) -> dict:
    """Whether the run stayed within limit_gib: by torch's peak reserved (what set_per_process_memory_fraction
    bounds) and by the device's use (nvidia-smi, every allocation of the process: comfy-aimdo's, cuBLAS's, the
    context), over every node of every prompt; which limit held."""
    nodes = [n for r in records for n in r.get("nodes", [])]
    reserved = [n["torch_peak_reserved_gib"] for n in nodes if n.get("torch_peak_reserved_gib") is not None]
    device = [n["peak_gpu_used_gib"] for n in nodes if n.get("peak_gpu_used_gib") is not None]
    reserve = re.search(r"--reserve-vram[= ]([\d.]+)", server_args)
    top_reserved, top_device = (max(reserved) if reserved else None), (max(device) if device else None)
    verdict = {"limit_gib": limit_gib, "reserve_vram_gib": float(reserve.group(1)) if reserve else None,
               "memory_fraction": fraction, "fraction_gib": round(fraction * total_gib, 2)
               if fraction and total_gib else None, "device_total_gib": total_gib,
               "torch_peak_reserved_gib": top_reserved, "device_peak_used_gib": top_device,
               "torch_within": None if top_reserved is None else top_reserved <= limit_gib,
               "device_within": None if top_device is None else top_device <= limit_gib}
    if verdict["device_within"]:
        verdict["held"] = "the whole device stayed within the limit (nvidia-smi)"
    elif verdict["torch_within"]:
        verdict["held"] = ("torch's allocator stayed within the limit; the device used more (allocations outside "
                           "torch's pool: comfy-aimdo, cuBLAS workspaces, the CUDA context)")
    elif top_reserved is None and top_device is None:
        verdict["held"] = "not measured (no CUDA device)"
    else:
        verdict["held"] = "neither: the run used more than the limit"
    return verdict


# ------------------------------------------------------------------------------------------------- command
def add_arguments(parser) -> None:
    parser.add_argument("--comfyui", type=Path, required=True, help="the ComfyUI release to copy and run")
    parser.add_argument("--source", default="github:jwijaya83/ComfyUI", help="where the tree came from (recorded)")
    parser.add_argument("--work", type=Path, required=True, help="where the copy and the VAE go")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--checkpoint", type=Path, help="the random-weight Flux-dev safetensors file")
    which.add_argument("--make-checkpoint", type=Path, metavar="DIR",
                       help="write it (`python -m benchmarks checkpoint`) into DIR, or reuse the one there")
    parser.add_argument("--tiny", action="store_true",
                        help="tiny Flux (with --make-checkpoint), canvases of a few hundred pixels, 256 px tiles: the "
                             "CPU smoke test")
    parser.add_argument("--weight-dtype", default="default",
                        choices=("default", "fp8_e4m3fn", "fp8_e4m3fn_fast", "fp8_e5m2"),
                        help="UNETLoader's weight_dtype (fp8_e4m3fn for the 24 GiB run)")
    parser.add_argument("--node-config", default="{}",
                        help="FusedDiTOps inputs as JSON (or a file of it) over the node's defaults from /object_info")
    parser.add_argument("--no-fused", action="store_true", help="no FusedDiTOps: UNETLoader -> TiledSampling")
    parser.add_argument("--tile-px", type=int, default=None, help="TiledSampling tile_px (0: planned; --tiny: 256)")
    parser.add_argument("--overlap-px", type=int, default=None, help="overlap_px (-1: planned; --tiny: 64)")
    parser.add_argument("--tile-batch", type=int, default=None, help="tile_batch (0: planned; --tiny: 2)")
    parser.add_argument("--sizes", default=None, help="route canvases WxH,... (default 16384x16384,32768x18432)")
    parser.add_argument("--base", default=None, help="WxH of the first generation (default 2048x2048)")
    parser.add_argument("--base-steps", type=int, default=4)
    parser.add_argument("--steps", type=int, default=1, help="steps the route's refinement runs (default 1)")
    parser.add_argument("--denoise", type=float, default=0.3)
    parser.add_argument("--timing-steps", type=int, nargs=2, default=(1, 3), metavar=("LOW", "HIGH"),
                        help="the step counts of the warm-up/peer/memory prompts (seconds per step by difference)")
    parser.add_argument("--workflow", nargs="?", const=str(EXAMPLE_WORKFLOW), default=None, metavar="FILE",
                        help="also queue a saved workflow (default: the pack's example, make_a_32k_image_flux.json) "
                             "through object_info as the front end does, at the first of --sizes")
    parser.add_argument("--memory-check", default=None,
                        help="WxH of the refinement-only prompt compared with the largest route (default 8192x8192; "
                             "'' for none)")
    parser.add_argument("--peer", action="append", default=[], metavar="NAME=DIR",
                        help=f"a peer custom node folder, copied into custom_nodes/ ({', '.join(PEERS)})")
    parser.add_argument("--peer-size", default=None, help="WxH of the side-by-side (default 4096x4096)")
    parser.add_argument("--peer-sizes", default=None, metavar="WxH,...",
                        help="the --sizes canvases the peer's route runs at (default every one)")
    parser.add_argument("--native", default=None, metavar="WxH",
                        help="the stock untiled step a tile-step is held against (default 1024x1024; '' none)")
    parser.add_argument("--peer-tile", type=int, default=None, help="tile px of both, side by side")
    parser.add_argument("--peer-overlap", type=int, default=None, help="overlap px of both, side by side")
    parser.add_argument("--peer-batch", type=int, default=None, help="tile batch of both, side by side")
    parser.add_argument("--no-side-by-side", dest="side_by_side", action="store_false",
                        help="no refinement-only side by side at --peer-size (the peer's whole route still runs)")
    parser.add_argument("--no-readback", dest="readback", action="store_false",
                        help="no LoadImage of the route's PNG")
    parser.add_argument("--stock-vae", action="store_true",
                        help="our route with ComfyUI's VAEEncodeTiled, VAEDecodeTiled and SaveImage (as issue 37's)")
    parser.add_argument("--template-steps", type=int, default=8,
                        help="the refinement steps of the template: each route's end to end is scaled to these")
    parser.add_argument("--memory-fraction", type=float, default=None,
                        help="the probe calls torch.cuda.set_per_process_memory_fraction(F) at import")
    parser.add_argument("--card-gib", type=float, default=None, metavar="G",
                        help="a G GiB card: another process holds the rest of the device's free memory while the "
                             "server runs (benchmarks/card.py); device peaks are the server's share")
    parser.add_argument("--limit-gib", type=float, default=24.0, help="the memory limit judged (an RTX 4090: 24)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--port", type=int, default=8188 + 37)
    parser.add_argument("--server-args", default="", help="more main.py arguments, e.g. '--cpu', '--reserve-vram 115'")
    parser.add_argument("--startup-timeout", type=float, default=180)
    parser.add_argument("--checkpoint-timeout", type=float, default=300)
    parser.add_argument("--prompt-timeout", type=float, default=1200)
    parser.add_argument("--out", type=Path, required=True)


def settings(options, parser) -> dict:
    """The run's settings from the arguments (--tiny's defaults where an argument is not given)."""
    tiny = options.tiny
    tile = TINY["tile"] if tiny else (0, -1, 0)
    pick = lambda given, full, small: given if given is not None else (small if tiny else full)  # noqa: E731
    try:
        found = {
            "sizes": [parse_size(s) for s in pick(options.sizes, "16384x16384,32768x18432", TINY["sizes"]).split(",")
                      if s],
            "base": parse_size(pick(options.base, "2048x2048", TINY["base"])),
            "memory_check": optional_size(pick(options.memory_check, "8192x8192", TINY["memory_check"])),
            "peer_size": parse_size(pick(options.peer_size, "4096x4096", TINY["peer_size"])),
            "native": optional_size(pick(options.native, "1024x1024", TINY["native"])),
            "peer_sizes": None if options.peer_sizes is None else
            [parse_size(s) for s in options.peer_sizes.split(",") if s],
            "tiled": {"tile_px": pick(options.tile_px, tile[0], tile[0]),
                      "overlap_px": pick(options.overlap_px, tile[1], tile[1]),
                      "tile_batch": pick(options.tile_batch, tile[2], tile[2])}}
    except ValueError as error:
        parser.error(f"a size is WxH: {error}")
    ours = found["tiled"]
    default_peer = [value if value not in (0, -1) else fallback
                    for value, fallback in zip(ours.values(), TINY["tile"] if tiny else PEER_DEFAULT_TILE)]
    found["peer_tiled"] = {"tile_px": pick(options.peer_tile, default_peer[0], default_peer[0]),
                           "overlap_px": pick(options.peer_overlap, default_peer[1], default_peer[1]),
                           "tile_batch": pick(options.peer_batch, default_peer[2], default_peer[2])}
    peers = {}
    for text in options.peer:
        name, _, folder = text.partition("=")
        if name not in PEERS or not folder:
            parser.error(f"--peer NAME=DIR with NAME one of {', '.join(PEERS)}: {text!r}")
        peers[name] = Path(folder)
    found["peers"] = peers
    try:
        found["node_config"] = json.loads(Path(options.node_config).read_text()
                                          if Path(options.node_config).is_file() else options.node_config)
    except (json.JSONDecodeError, OSError) as error:
        parser.error(f"--node-config: {error}")
    if not found["sizes"]:
        parser.error("--sizes names no canvas")
    if found["peer_sizes"] is not None and not set(found["peer_sizes"]) <= set(found["sizes"]):
        parser.error("--peer-sizes names a canvas --sizes does not")
    low, high = options.timing_steps
    if not 1 <= low < high:
        parser.error("--timing-steps LOW HIGH needs 1 <= LOW < HIGH")
    if not 0.0 < options.denoise <= 1.0 or options.steps < 1 or options.base_steps < 1:
        parser.error("--steps and --base-steps need 1 or more, --denoise 0 < d <= 1")
    return found


def optional_size(text: str) -> tuple | None:
    """WxH as (W, H); '' (the option given empty): None, that part of the run left out."""
    return parse_size(text) if text else None


def node_defaults(info: dict, node: str) -> dict:
    """Each input's default from /object_info (V1: [type, {default}]; a list of choices: its first without one)."""
    found = {}
    for group in ("required", "optional"):
        for name, spec in (info.get(node, {}).get("input", {}).get(group) or {}).items():
            options = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
            if "default" in options:
                found[name] = options["default"]
            elif isinstance(spec[0], list) and spec[0]:
                found[name] = spec[0][0]
    found.pop("model", None)
    return found


def conditions(report: dict) -> str:
    """What every figure was measured under, in one line."""
    server = report.get("server") or {}
    comfyui = report.get("comfyui") or {}
    fused = report.get("fused_dit_ops")
    return (f"ComfyUI {comfyui.get('comfyui_version')} ({(comfyui.get('commit') or '')[:8]}), VRAM mode "
            f"{server.get('vram_mode')}, server args {report.get('server_args')!r}, memory fraction "
            f"{report.get('memory_fraction')}, UNETLoader weight_dtype {report.get('weight_dtype')}, FusedDiTOps "
            f"{json.dumps(fused, sort_keys=True) if fused is not None else 'none'}, gpu {report.get('gpu')}"
            + (f", a {card['card_gib']} GiB card (another process held {card['held_gib']} GiB; device peaks are the "
               "server's share)" if (card := report.get("card")) else ""))


def run(options, parser) -> int:
    source = options.comfyui.resolve()
    if not (source / "main.py").exists():
        parser.error(f"{source} has no main.py")
    if options.checkpoint is not None and not options.checkpoint.exists():
        parser.error(f"{options.checkpoint} does not exist")
    if options.tiny and options.make_checkpoint is None:
        parser.error("--tiny needs --make-checkpoint")
    setup = settings(options, parser)
    low, high = options.timing_steps
    release = comfy_release.read_release(source)
    report = {"benchmark": "tiled-route", "script": "benchmarks/tiled_route.py", "note": NOTE, "date": results.now(),
              "command": results.command_line(), "gpu": None,
              "comfyui": {**release.as_dict(), "source": options.source}, "patches": list(PATCHES),
              "server_args": options.server_args, "memory_fraction": options.memory_fraction,
              "weight_dtype": options.weight_dtype, "tiny": options.tiny,
              "route": {"sizes": ["%dx%d" % s for s in setup["sizes"]], "base": "%dx%d" % setup["base"],
                        "base_steps": options.base_steps, "steps": options.steps, "denoise": options.denoise,
                        "schedule_steps": int(options.steps / options.denoise), "sampler": SAMPLER,
                        "vae_tiling": VAE_TILING, "tiled_sampling": setup["tiled"]},
              "timing_steps": [low, high], "memory_check_size": "%dx%d" % setup["memory_check"]
              if setup["memory_check"] else None,
              "peer_size": "%dx%d" % setup["peer_size"], "peer_tiled": setup["peer_tiled"],
              "native_size": "%dx%d" % setup["native"] if setup["native"] else None,
              "peer_sizes": None if setup["peer_sizes"] is None else ["%dx%d" % s for s in setup["peer_sizes"]],
              "servers": {}}
    work = options.work.resolve()
    work.mkdir(parents=True, exist_ok=True)

    def write():
        results.write_json(report, options.out)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated (SIGTERM)"))
    try:
        checkpoint = options.checkpoint
        if options.make_checkpoint is not None:
            report["checkpoint"] = make_checkpoint(source, options.make_checkpoint, "flux-dev", options.seed,
                                                   options.tiny, options.checkpoint_timeout)
            checkpoint = Path(report["checkpoint"]["path"])
            print(f"checkpoint {checkpoint.name}: {report['checkpoint']['seconds']} s", flush=True)
        report["vae"] = make_vae(source, work / "vae", options.seed, 300)
        vae = Path(report["vae"]["path"])
        tree = prepare(source, work / "route", vae)
        python = make_venv(tree)
        report["apply"] = apply_patches(tree, python)
        report["install"] = install_overlay(tree, python)
        print(f"apply: exit {report['apply']['returncode']}, overlay install: exit "
              f"{report['install']['returncode']}", flush=True)
        write_probe(tree)
        checkpoint_name = link_checkpoint(tree, checkpoint)
        report["peers"] = {}
        for name, folder in setup["peers"].items():
            target = tree / "custom_nodes" / PEERS[name]["folder"]
            shutil.copytree(folder, target, dirs_exist_ok=True)
            revision = target / "REVISION"
            report["peers"][name] = {"folder": PEERS[name]["folder"], "revision": revision.read_text().split()
                                     if revision.exists() else None}
    except (Exception, SystemExit) as error:   # noqa: BLE001 - recorded
        report["error"] = f"{type(error).__name__}: {error}"
        write()
        print(report["error"], flush=True)
        return 1
    write()
    log_path = server_log(options.out, "route")
    env = {MEMORY_FRACTION_ENV: str(options.memory_fraction)} if options.memory_fraction else {}

    def prompts(base, monitor, client_id, record):
        record["prompts"] = []
        report["server"] = {"vram_mode": record["server_start"]["vram_mode"],
                            "vram_mode_reason": record["server_start"]["vram_mode_reason"]}
        stats = http_json(f"{base}/system_stats") or {}
        devices = stats.get("devices") or [{}]
        report["gpu"] = devices[0].get("name")
        info = {}
        for node in ("FusedDiTOps", "TiledSampling", "GetImageSize", "PreviewAny",
                     *(PEERS[name]["class_type"] for name in setup["peers"])):
            try:
                info.update(http_json(f"{base}/object_info/{node}") or {})
            except urllib.error.HTTPError:
                pass
        lines = log_lines(log_path.read_text(errors="replace"))
        report["nodes_registered"] = {node: node in info for node in ("FusedDiTOps", "TiledSampling")}
        report["tiled_sampling_inputs"] = info.get("TiledSampling", {}).get("input")
        for name in setup["peers"]:
            timed, errors = custom_node_import(lines, PEERS[name]["folder"])
            report["peers"][name].update({"registered": PEERS[name]["class_type"] in info,
                                          "import_line": timed["import"], "errors": errors[:5]})
        fused = None if options.no_fused else {**node_defaults(info, "FusedDiTOps"), **setup["node_config"]}
        report["fused_dit_ops"] = fused
        report["max_resolution"] = record.get("empty_latent_width_max")
        report["conditions"] = conditions(report)
        print(f"nodes {report['nodes_registered']}, peers "
              f"{ {n: p.get('registered') for n, p in report['peers'].items()} }; {report['conditions']}", flush=True)
        write()
        get_size = "GetImageSize" in info and "PreviewAny" in info
        dtype, seed, denoise = options.weight_dtype, options.seed, options.denoise

        def one(name, prompt, **extra):
            offset, cut = log_path.stat().st_size, None
            try:
                found = run_prompt(base, monitor, client_id, name, prompt, options.prompt_timeout)
            except PromptCutOff as error:
                found, cut = error.record, error
            memory = memory_nodes(_memory(base))
            with open(log_path, errors="replace") as log:
                log.seek(offset)
                said = log.read()
            found["tiled_sampling_log"] = parse_tiled_lines(said)
            found["model_load_log"] = model_load_lines(said)
            found.update(extra, device=memory.pop("_device", None))
            for node in found.get("nodes", []):
                node.update(memory.get(node["node"], {}))
            record["prompts"].append(found)
            write()
            refine = node_of(found, ID["refine"])
            problem = found.get("failed_at") or found.get("refused_by") or found.get("error")
            print(f"{name}: {found.get('status') or 'refused'} {found.get('execution_s')} s; refine "
                  f"{refine.get('seconds')} s, torch peak {refine.get('torch_peak_reserved_gib')} GiB reserved, "
                  f"device {refine.get('peak_gpu_used_gib')} GiB; "
                  f"{[t['line'] for t in found['tiled_sampling_log']][:2]}{'; ' + str(problem) if problem else ''}",
                  flush=True)
            if cut is not None:
                raise cut
            return found

        _memory(base)   # start the peaks afresh
        if options.workflow:
            workflow = json.loads(Path(options.workflow).read_text(encoding="utf-8"))
            prompt = workflow_prompt(workflow, http_json(f"{base}/object_info") or {}, checkpoint_name, vae.name,
                                     dtype, fused, setup["base"], setup["sizes"][0], options.base_steps,
                                     options.steps)
            found = one("workflow", prompt, role="example workflow", size="%dx%d" % setup["sizes"][0],
                        workflow=Path(options.workflow).name)
            found["every_node_ran"] = bool(found.get("nodes")) and all(n.get("ran") for n in found["nodes"])
        tiled, peer_tiled = setup["tiled"], setup["peer_tiled"]
        peer_size = setup["peer_size"]
        # another seed: the server would answer the same prompt later from its cache
        one("warm-up", refine_prompt(peer_size, checkpoint_name, dtype, fused, peer_tiled, low, denoise, seed + 1,
                                     "tiled_route/warmup"), role="warm-up", size="%dx%d" % peer_size, steps=low)
        for name, spec in ((n, PEERS[n]) for n in setup["peers"]):
            if report["peers"][name]["registered"] and not options.side_by_side:
                # the stock chain's own loading, paid before its route as ours is by the warm-up above
                one(f"peer warm-up {name}", refine_prompt(peer_size, checkpoint_name, dtype, None, peer_tiled, low,
                                                          denoise, seed + 3, "tiled_route/peer_warmup", spec),
                    role="peer warm-up", peer=name, size="%dx%d" % peer_size, steps=low)
            if not report["peers"][name]["registered"] or not options.side_by_side:
                continue
            for steps in (low, high):
                one(f"peer {name} {steps}", refine_prompt(peer_size, checkpoint_name, dtype, fused, peer_tiled, steps,
                                                          denoise, seed, f"tiled_route/peer_{steps}", spec),
                    role="peer", peer=name, size="%dx%d" % peer_size, steps=steps)
        if setup["peers"] and options.side_by_side:
            for steps in (low, high):
                one(f"ours {steps}", refine_prompt(peer_size, checkpoint_name, dtype, fused, peer_tiled, steps, denoise,
                                                   seed, f"tiled_route/ours_{steps}"),
                    role="ours beside the peer", size="%dx%d" % peer_size, steps=steps)
        if setup["native"]:
            for steps in (low, high):
                one(f"native {steps}", native_prompt(setup["native"], checkpoint_name, dtype, steps, seed + 4,
                                                     f"tiled_route/native_{steps}"),
                    role="native stock", size="%dx%d" % setup["native"], steps=steps)
        if setup["memory_check"]:
            for steps in (low, high):
                one(f"memory {steps}", refine_prompt(setup["memory_check"], checkpoint_name, dtype, fused, tiled, steps,
                                                     denoise, seed, f"tiled_route/memory_{steps}"),
                    role="memory check", size="%dx%d" % setup["memory_check"], steps=steps)
        vae_nodes = STOCK_VAE if options.stock_vae else PACK_VAE
        peer_routes = [(n, PEERS[n]) for n in setup["peers"] if report["peers"][n]["registered"]]
        for size in setup["sizes"]:
            label = "%dx%d" % size
            route = one(f"route {label}", route_prompt(size, setup["base"], checkpoint_name, vae.name, dtype, fused,
                                                       tiled, options.base_steps, options.steps, denoise, seed,
                                                       f"tiled_route/route_{label}", vae_nodes=vae_nodes),
                        role="route", size=label, steps=options.steps)
            saved = (route.get("outputs") or {}).get(ID["save"]) or []
            if saved:
                path = tree / "output" / saved[0]
                route["png"] = {"file": path.name, "bytes": path.stat().st_size, "width_height": png_size(path)}
                if options.readback:
                    link(path, tree / "input" / path.name)
                    back = one(f"readback {label}", readback_prompt(path.name, get_size), role="readback",
                               size=label)
                    back["read_width_height"] = readback_size(back)
                    write()
                for done in (path, tree / "input" / path.name):   # a 32K PNG is large, the disk is not
                    done.unlink(missing_ok=True)
            beside = setup["peer_sizes"] is None or size in setup["peer_sizes"]
            for name, spec in (peer_routes if beside else ()):
                # the user's alternative: the peer over stock ComfyUI (no FusedDiTOps), ComfyUI's tiled VAE and
                # SaveImage, the same fp8-stored weights, tile, overlap and batch
                theirs = one(f"peer route {name} {label}",
                             route_prompt(size, setup["base"], checkpoint_name, vae.name, dtype, None, peer_tiled,
                                          options.base_steps, options.steps, denoise, seed + 2,
                                          f"tiled_route/peer_{name}_{label}", peer=spec, vae_nodes=STOCK_VAE),
                             role="peer route", peer=name, size=label, steps=options.steps)
                for output in (theirs.get("outputs") or {}).get(ID["save"]) or []:
                    (tree / "output" / output).unlink(missing_ok=True)

    try:
        with (Ballast(options.card_gib) if options.card_gib else contextlib.nullcontext()) as card:
            report["card"] = card
            serve("route", tree, python, options, report, write, prompts, env)
    except RuntimeError as error:      # the holder did not start: recorded, nothing ran
        report["error"] = f"card: {error}"
    if report.get("card"):
        server_share(report["servers"].get("route", {}).get("prompts", []), report["card"]["held_gib"])
    report["summary"] = summarise(report, options)
    write()
    print(json.dumps(report["summary"], indent=1))
    print(f"wrote {options.out}")
    return 0 if "error" not in report and not report["servers"].get("route", {}).get("error") else 1


def _memory(base: str) -> dict | None:
    try:
        return http_json(f"{base}/generation_probe/memory")
    except (urllib.error.URLError, OSError, ValueError):
        return None


def readback_size(record: dict) -> list | None:
    """[width, height] PreviewAny showed (its text in the history's outputs), None where it did not run."""
    texts = record.get("texts") or {}
    try:
        return [int(texts[ID["show_width"]][0]), int(texts[ID["show_height"]][0])]
    except (KeyError, IndexError, TypeError, ValueError):
        return None


def summarise(report: dict, options) -> dict:
    """Per route: every node ran, seconds per node, the refinement's seconds per step and per tile and step, its
    tiles and batch, the peaks, the PNG read back; the memory check; the peer side by side; the memory limit."""
    prompts = report["servers"].get("route", {}).get("prompts", [])
    cond = report.get("conditions") or conditions(report)
    out: dict = {"conditions": cond, "routes": [], "memory_check": None, "peer": {}, "native": None, "limit": None}
    low, high = report["timing_steps"]
    native = [p for p in prompts if p.get("role") == "native stock"]
    native_s = per_step(native[0], native[-1], low, high) if len(native) == 2 else None
    if native:
        out["native"] = {"conditions": conditions({**report, "fused_dit_ops": None}) + ", untiled",
                         "size": native[-1]["size"], "s_per_step": native_s,
                         "error": next((p.get("failed_at") or p.get("refused_by") for p in native
                                        if p.get("status") != "success"), None)}

    def tiled_log(record):
        lines = [t for t in record.get("tiled_sampling_log", []) if "tiles" in t]
        return lines[-1] if lines else None

    for route in (p for p in prompts if p.get("role") == "route"):
        back = next((p for p in prompts if p.get("role") == "readback" and p.get("size") == route["size"]), {})
        refine = node_of(route, ID["refine"])
        logged = tiled_log(route)
        seconds = refine.get("seconds")
        step_s = round(seconds / route["steps"], 3) if seconds is not None else None
        tile_step = ratio(step_s, logged and logged.get("tiles"))
        out["routes"].append({
            "size": route["size"], "conditions": cond, "status": route.get("status"),
            "every_node_ran": bool(route.get("nodes")) and route.get("status") == "success"
            and back.get("status") == "success",
            "cached_nodes": [n for n in route.get("nodes_in_prompt", {}) if n not in
                             {x["node"] for x in route.get("nodes", [])}],
            "seconds_per_node": {f"{n['node']} {n['class_type']}": n["seconds"]
                                 for n in route.get("nodes", []) + back.get("nodes", [])},
            "refine_steps": route["steps"], "refine_s_per_step": step_s,
            "refine_s_per_step_note": "the KSampler node's seconds / steps: the sampler's set-up for the canvas "
                                      "included; loading and FP8 quantisation were paid by the warm-up",
            "tiles": logged and logged.get("tiles"), "tile_px": logged and logged.get("tile_px"),
            "overlap_px": logged and logged.get("overlap_px"), "batch": logged and logged.get("batch"),
            "s_per_tile_step": tile_step, "tile_step_vs_native": ratio(tile_step, native_s),
            "refine_peaks": peaks(route, ID["refine"]),
            "peaks": {"torch_peak_reserved_gib": _top(route, "torch_peak_reserved_gib"),
                      "device_peak_used_gib": _top(route, "peak_gpu_used_gib"),
                      "peak_rss_gib": _top([route, back], "peak_rss_gib")},
            "png": route.get("png"), "read_back_width_height": back.get("read_width_height"),
            "error": route.get("failed_at") or route.get("refused_by") or back.get("failed_at"),
            "end_to_end": compare_routes(route, [p for p in prompts if p.get("role") == "peer route"
                                                 and p.get("size") == route["size"]],
                                         getattr(options, "template_steps", 8))})
    memory = [p for p in prompts if p.get("role") == "memory check"]
    largest = max((r for r in prompts if r.get("role") == "route" and r.get("status") == "success"),
                  key=lambda r: parse_size(r["size"])[0] * parse_size(r["size"])[1], default=None)
    if memory:
        mine = peaks(memory[-1], ID["refine"])
        theirs = peaks(largest, ID["refine"]) if largest else {}
        logged = tiled_log(memory[-1])
        step_s = per_step(memory[0], memory[-1], low, high) if len(memory) == 2 else None
        tile_step = ratio(step_s, logged and logged.get("tiles"))
        out["memory_check"] = {
            "conditions": cond, "size": memory[-1]["size"], "against": largest and largest["size"],
            "peaks": mine, "against_peaks": theirs,
            "same_tiles": {"memory": logged and {k: logged.get(k) for k in ("tile_px", "overlap_px", "batch")},
                           "route": (lambda t: t and {k: t.get(k) for k in ("tile_px", "overlap_px", "batch")})(
                               tiled_log(largest) if largest else None)},
            "ratio": {key: ratio(theirs.get(key), mine.get(key)) for key in mine if key != "peak_rss_gib"},
            "s_per_step": step_s, "tiles": logged and logged.get("tiles"),
            "s_per_tile_step": tile_step, "tile_step_vs_native": ratio(tile_step, native_s)}
        out["memory_check"]["within_10_percent"] = {
            key: None if value is None else abs(value - 1.0) <= 0.10
            for key, value in out["memory_check"]["ratio"].items()}
    ours = [p for p in prompts if p.get("role") == "ours beside the peer"]
    for name in report.get("peers", {}):
        theirs = [p for p in prompts if p.get("peer") == name]
        entry = {"conditions": cond, "size": report["peer_size"], "tiled": report["peer_tiled"],
                 "registered": report["peers"][name].get("registered"),
                 "import_line": report["peers"][name].get("import_line")}
        if len(theirs) == 2 and len(ours) == 2:
            mine_s, their_s = per_step(ours[0], ours[1], low, high), per_step(theirs[0], theirs[1], low, high)
            entry.update({"ours_s_per_step": mine_s, "peer_s_per_step": their_s,
                          "speedup": ratio(their_s, mine_s), "ours_log": tiled_log(ours[-1])})
        errors = [p.get("failed_at") or p.get("refused_by") for p in theirs if p.get("status") != "success"]
        if errors or not entry["registered"]:
            entry["peer_error"] = errors or report["peers"][name].get("errors") or "not registered"
        out["peer"][name] = entry
    device = next((p["device"] for p in prompts if p.get("device")), {}) or {}
    out["limit"] = {"conditions": cond, **limit_verdict(prompts, options.limit_gib, report.get("memory_fraction"),
                                                        report.get("server_args") or "", device.get("total_gib"))}
    return out


# the route's nodes that make the image (the loaders and the zero conditioning are cached after the first prompt)
ROUTE_NODES = {"generate": "base_sampler", "decode_base": "decode", "upscale": "scale", "encode": "encode",
               "refine": "refine", "decode": "decode_tiled", "save": "save"}


def route_seconds(record: dict, template_steps: int) -> dict | None:
    """A route's seconds per node (named by role, with the node's class), its refinement's seconds per step, and
    its end to end with the refinement scaled from the steps it ran to the template's; None where a node did not
    run."""
    found = {role: node_of(record, ID[key]) for role, key in ROUTE_NODES.items()}
    if any(node.get("seconds") is None for node in found.values()):
        return None
    per_step = found["refine"]["seconds"] / record["steps"]
    total = sum(node["seconds"] for node in found.values()) + per_step * (template_steps - record["steps"])
    return {"seconds_per_node": {role: {"class_type": node["class_type"], "seconds": node["seconds"]}
                                 for role, node in found.items()},
            "refine_s_per_step": round(per_step, 3), "seconds": round(total, 2),
            "save_share": round(found["save"]["seconds"] / total, 4)}


def compare_routes(ours: dict, theirs: list, template_steps: int) -> dict | None:
    """Our route against the user's alternative (the peer's route) at one canvas: both routes' seconds per node,
    end to end with the template's refinement steps, and the ratios."""
    mine = route_seconds(ours, template_steps)
    if mine is None:
        return None
    entry = {"template_steps": template_steps, "timed_steps": ours["steps"],
             "note": (f"timed with {ours['steps']} refinement step(s); the refinement's seconds per step scaled to "
                      f"the template's {template_steps}" if ours["steps"] != template_steps else
                      "timed with the template's steps"), "ours": mine}
    other = next((route_seconds(r, template_steps) for r in theirs if r.get("status") == "success"), None)
    if other is not None:
        nodes = lambda side, role: side["seconds_per_node"][role]["seconds"]  # noqa: E731
        entry.update({"alternative": other, "peer": theirs[0].get("peer"),
                      "speedup_vs_alternative": ratio(other["seconds"], mine["seconds"]),
                      "speedup_per_node": {role: ratio(nodes(other, role), nodes(mine, role)) for role in ROUTE_NODES}})
    elif theirs:
        entry["alternative_error"] = theirs[0].get("failed_at") or theirs[0].get("refused_by") or "did not finish"
    return entry


def _top(records, key):
    records = records if isinstance(records, list) else [records]
    values = [n.get(key) for r in records for n in r.get("nodes", []) if n.get(key) is not None]
    return max(values) if values else None
