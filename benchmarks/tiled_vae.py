"""The one-pass tiled VAE against ComfyUI's own tiled VAE and the untiled VAE, in one release's process (issue 48).

Loads a ComfyUI tree in this process (`comfy.sd.VAE` of the random-weight Flux VAE that `python -m benchmarks
checkpoint --model flux-vae` writes), then at a canvas where the untiled decode fits (4096 by default) decodes one
random latent three ways, each timed on a second call (the first pays cuDNN's and the allocator's warm-up):
  untiled     the VAE's own decoder on the whole latent (first_stage_model.decode; never ComfyUI's OOM fallback)
  comfy       VAEDecodeTiled's call as the route makes it (vae.decode_tiled, tile 1024 px, overlap 64 px) and with
              the node's defaults (512 / 64): three passes of different tiles, averaged
  pack        the TiledVAEDecode node (comfyui_fused_dit.tiled_vae) with its defaults
and the image the untiled decode made is encoded back the same three ways (VAEEncodeTiled's call at 1024 / 64).
Error: the mean and largest absolute difference from the untiled result (image pixels 0..1; latents).

The weights are random: the figures are for time and for how far each tiling departs from the untiled VAE, never
image quality. ComfyUI is imported as its main.py starts it (comfy_release.import_comfyui: cuda_malloc, DynamicVRAM
where the release has it), without its server; ComfyUI's model management loads the VAE as its nodes do.

    python -m benchmarks tiled-vae --comfyui DIR --work /tmp/vae --out tiled-vae-RELEASE.json
"""
from __future__ import annotations

import time
from pathlib import Path

from . import comfy_release, results
from .canvas_pipeline import make_vae, parse_size

REPO_ROOT = Path(__file__).resolve().parents[1]


def add_arguments(parser) -> None:
    parser.add_argument("--comfyui", type=Path, required=True, help="the ComfyUI tree to import")
    parser.add_argument("--source", default="github:jwijaya83/ComfyUI", help="where the tree came from (recorded)")
    parser.add_argument("--work", type=Path, required=True, help="where the random VAE is written")
    parser.add_argument("--size", default="4096x4096", help="WxH of the canvas (the untiled decode must fit)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stages", default="", metavar="WxH",
                        help="also the route's encode, decode and save at WxH, once each: ComfyUI's VAEEncodeTiled, "
                             "VAEDecodeTiled (1024/64) and SaveImage against the pack's nodes; the two PNGs read back")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: the smoke test")
    parser.add_argument("--out", type=Path, required=True)


def import_paths(options) -> list[Path]:
    return [options.comfyui.resolve(), REPO_ROOT / "overlays"]


def _timed(call, sync) -> tuple[object, float]:
    """call()'s result and its seconds on a second call, under torch.inference_mode() as ComfyUI runs its nodes."""
    import torch
    with torch.inference_mode():
        call()                               # warm-up: cuDNN's choices, the allocator's pool
        sync()
        start = time.perf_counter()
        out = call()
        sync()
    return out, round(time.perf_counter() - start, 3)


def _error(got, want) -> dict:
    diff = (got.float().cpu() - want.float().cpu()).abs()
    return {"mean_abs": round(float(diff.mean()), 6), "max_abs": round(float(diff.max()), 5)}


def _once(call, sync) -> tuple[object, float]:
    import torch
    with torch.inference_mode():
        sync()
        start = time.perf_counter()
        out = call()
        sync()
    return out, round(time.perf_counter() - start, 3)


def stages(vae, node, size: str, work: Path, seed: int, sync) -> dict:
    """The route's last three stages at `size`, ComfyUI's nodes against the pack's, each once (seconds), and
    whether the two PNGs read back with the same pixels."""
    import numpy as np
    import torch
    from PIL import Image

    import folder_paths
    import nodes
    from comfyui_fused_dit import save_png

    width, height = parse_size(size)
    out_dir = work / "stages"
    out_dir.mkdir(parents=True, exist_ok=True)
    folder_paths.set_output_directory(str(out_dir))
    generator = torch.Generator().manual_seed(seed)
    latent = torch.randn((1, vae.latent_channels, height // 8, width // 8), generator=generator)
    found = {"size": size}
    image, found["decode_pack_s"] = _once(lambda: node.TiledVAEDecode().decode({"samples": latent}, vae)[0], sync)
    _, found["decode_comfy_s"] = _once(lambda: nodes.VAEDecodeTiled().decode(vae, {"samples": latent}, 1024, 64, 64,
                                                                              8)[0], sync)
    _, found["encode_pack_s"] = _once(lambda: node.TiledVAEEncode().encode(image, vae)[0], sync)
    _, found["encode_comfy_s"] = _once(lambda: nodes.VAEEncodeTiled().encode(vae, image, 1024, 64, 64, 8)[0], sync)
    ours, found["save_pack_s"] = _once(lambda: save_png.SaveImagePNG().save_images(image, "pack"), sync)
    theirs, found["save_comfy_s"] = _once(lambda: nodes.SaveImage().save_images(image, "comfy"), sync)
    Image.MAX_IMAGE_PIXELS = None
    files = [out_dir / answer["ui"]["images"][0]["filename"] for answer in (ours, theirs)]
    found["png_bytes"] = {"pack": files[0].stat().st_size, "comfy": files[1].stat().st_size}
    with Image.open(files[0]) as a, Image.open(files[1]) as b:
        found["same_pixels"] = bool(np.array_equal(np.asarray(a), np.asarray(b)))
    for file in files:
        file.unlink()
    for stage in ("decode", "encode", "save"):
        found[f"{stage}_speedup"] = round(found[f"{stage}_comfy_s"] / found[f"{stage}_pack_s"], 3)
    return found


def run(options, parser) -> int:
    width, height = parse_size(options.size)
    tree = options.comfyui.resolve()
    report = {"benchmark": "tiled-vae", "script": "benchmarks/tiled_vae.py", "date": results.now(),
              "command": results.command_line(), "size": options.size,
              "comfyui": {**comfy_release.read_release(tree).as_dict(), "source": options.source},
              "note": "random-weight Flux VAE: time and departure from the untiled VAE, never image quality"}
    report["vae_file"] = make_vae(tree, options.work / "vae", options.seed, 300)
    device = "cuda" if options.device == "cuda" else "cpu"
    report["started"] = comfy_release.import_comfyui(tree, device, "native" if device == "cpu" else "comfy")
    import torch
    import comfy.model_management as mm
    import comfy.sd
    import comfy.utils
    from comfyui_fused_dit import tiled_vae as node

    vae = comfy.sd.VAE(sd=comfy.utils.load_torch_file(report["vae_file"]["path"]))
    report["gpu"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    report["vae"] = {"dtype": str(vae.vae_dtype), "device": str(vae.device), "output_device": str(vae.output_device)}
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    generator = torch.Generator().manual_seed(options.seed)
    latent = torch.randn((1, vae.latent_channels, height // 8, width // 8), generator=generator)
    mm.load_models_gpu([vae.patcher], memory_required=vae.memory_used_decode((1, 16, 128, 128), vae.vae_dtype))

    def untiled_decode():
        with torch.inference_mode():
            out = vae.first_stage_model.decode(latent.to(vae.device, vae.vae_dtype)).float()
            return vae.process_output(out).cpu().movedim(1, -1)

    def untiled_encode(image):
        with torch.inference_mode():
            pixels = vae.process_input(image.movedim(-1, 1).to(vae.device)).to(vae.vae_dtype)
            return vae.first_stage_model.encode(pixels).float().cpu()

    whole, whole_s = _timed(untiled_decode, sync)
    decode = {"untiled": {"seconds": whole_s}}
    for name, tile, overlap in (("comfy_route_1024_64", 1024, 64), ("comfy_defaults_512_64", 512, 64)):
        got, seconds = _timed(lambda: vae.decode_tiled(latent, tile_x=tile // 8, tile_y=tile // 8,
                                                        overlap=overlap // 8), sync)
        decode[name] = {"seconds": seconds, "error": _error(got, whole)}
    defaults = {name: spec[1]["default"] for name, spec in node.TILE_INPUTS.items()}
    got, seconds = _timed(lambda: node.TiledVAEDecode().decode({"samples": latent}, vae, **defaults)[0], sync)
    decode["pack_defaults"] = {"seconds": seconds, "error": _error(got, whole), "settings": defaults}
    latent_whole, latent_s = _timed(lambda: untiled_encode(whole), sync)
    encode = {"untiled": {"seconds": latent_s}}
    got, seconds = _timed(lambda: vae.encode_tiled(whole, tile_x=1024, tile_y=1024, overlap=64), sync)
    encode["comfy_route_1024_64"] = {"seconds": seconds, "error": _error(got, latent_whole)}
    got, seconds = _timed(lambda: node.TiledVAEEncode().encode(whole, vae, **defaults)[0]["samples"], sync)
    encode["pack_defaults"] = {"seconds": seconds, "error": _error(got, latent_whole), "settings": defaults}
    route = decode["comfy_route_1024_64"]
    report["decode"], report["encode"] = decode, encode
    report["summary"] = {
        "decode_speedup_vs_comfy_route": round(route["seconds"] / decode["pack_defaults"]["seconds"], 3),
        "encode_speedup_vs_comfy_route": round(encode["comfy_route_1024_64"]["seconds"]
                                               / encode["pack_defaults"]["seconds"], 3),
        "decode_error_within_comfy_route": decode["pack_defaults"]["error"]["mean_abs"]
        <= route["error"]["mean_abs"],
        "decode_error_within_comfy_defaults": decode["pack_defaults"]["error"]["mean_abs"]
        <= decode["comfy_defaults_512_64"]["error"]["mean_abs"],
        "encode_error_within_comfy_route": encode["pack_defaults"]["error"]["mean_abs"]
        <= encode["comfy_route_1024_64"]["error"]["mean_abs"]}
    results.write_json(report, options.out)
    print(report["summary"], flush=True)
    if options.stages:
        report["stages"] = stages(vae, node, options.stages, options.work, options.seed, sync)
        results.write_json(report, options.out)
        print(report["stages"], flush=True)
    return 0
