"""The pack's model table (overlays/fused_dit/models.json) against a real ComfyUI release's own code, on the CPU.

    python -m benchmarks validate model-table --comfyui .realcomfy/0.33.0 --deps DIR \
        [--into benchmarks/results/overlay-eras.json]

The report goes into that results file (the real trees' checks) under the key `model_table`; the folder's cap on
files (tests/test_benchmarks.py) keeps it out of a file of its own.

For each entry the node tiles: the release's own diffusion model class is built at full size on the meta device (no
memory, no weights) from the constructor arguments the released checkpoint gives (ARGUMENTS below, each from the
model's published config); its state dict's names and shapes go through the release's comfy/model_detection.py
(model_config_from_unet), as a checkpoint's would; and what ComfyUI makes of it is held against the table: the
supported_models class it picks, unet_config["image_model"] and the width key the table recognises it by, the latent
format's channels and factor, the model's patch, its parameter count (within 5%: the table's are published rounded
counts) and width. Packages the release needs that the CPU environment lacks (transformers, torchvision, ...) are
stubbed: only the diffusion model classes, comfy.model_detection, supported_models and latent_formats run.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import json
import sys
import types
from pathlib import Path

from . import models, results
from .eras import ERAS_EXPANDED_DEPTH as INTO_DEPTH

REPO = Path(__file__).resolve().parent.parent
TABLE = REPO / "overlays" / "fused_dit" / "models.json"
PARAMETER_TOLERANCE = 0.05
KEY = "model_table"
# packages comfy's import chain names that these checks never call (text encoders, audio, video, the server)
STUBBED_ROOTS = ("transformers", "tokenizers", "sentencepiece", "aiohttp", "av", "torchvision", "torchaudio",
                 "kornia", "spandrel", "scipy", "alembic", "sqlalchemy", "requests", "pydantic", "trimesh",
                 "soundfile", "simpleeval", "blake3", "ftfy", "regex")

FLUX_DEV = dict(in_channels=16, out_channels=16, vec_in_dim=768, context_in_dim=4096, hidden_size=3072,
                mlp_ratio=4.0, num_heads=24, depth=19, depth_single_blocks=38, axes_dim=[16, 56, 56], theta=10000,
                patch_size=2, qkv_bias=True, guidance_embed=True, txt_ids_dims=[])
WAN = dict(model_type="t2v", patch_size=(1, 2, 2), text_len=512, freq_dim=256, text_dim=4096, window_size=(-1, -1),
           qk_norm=True, cross_attn_norm=True, eps=1e-6)
# Kandinsky 5's text side and patch, shared by the Lite image and video models (kandinskylab/kandinsky-5 configs);
# Video Pro's time_dim and text blocks are its own
KANDINSKY5 = dict(in_visual_dim=16, out_visual_dim=16, in_text_dim=3584, in_text_dim2=768, time_dim=512,
                  patch_size=(1, 2, 2), num_text_blocks=2)
# key -> (module, class, constructor arguments at full size, the supported_models class ComfyUI must pick, source)
ARGUMENTS = {
    "flux-dev": ("comfy.ldm.flux.model", "Flux", FLUX_DEV, "Flux",
                 "black-forest-labs/FLUX.1-dev transformer/config.json"),
    "flux2-dev": ("comfy.ldm.flux.model", "Flux", models.FLUX2_DEV,
        "Flux2", "black-forest-labs/FLUX.2-dev transformer/config.json (8 double, 48 single, 48 heads, Mistral 3 "
                 "24B's three 5120-wide layers as context)"),
    "chroma": ("comfy.ldm.chroma.model", "Chroma", dict(
        in_channels=64, out_channels=64, context_in_dim=4096, hidden_size=3072, mlp_ratio=4.0, num_heads=24,
        depth=19, depth_single_blocks=38, axes_dim=[16, 56, 56], theta=10000, patch_size=2, qkv_bias=True,
        in_dim=64, out_dim=3072, hidden_dim=5120, n_layers=5, txt_ids_dims=[], vec_in_dim=None),
        "Chroma", "lodestones/Chroma1-HD (FLUX.1-schnell's blocks, a 5-layer guidance approximator)"),
    "qwen-image": ("comfy.ldm.qwen_image.model", "QwenImageTransformer2DModel", dict(
        patch_size=2, in_channels=64, out_channels=16, num_layers=60, attention_head_dim=128,
        num_attention_heads=24, joint_attention_dim=3584, pooled_projection_dim=768, axes_dims_rope=(16, 56, 56)),
        "QwenImage", "Qwen/Qwen-Image transformer/config.json"),
    "z-image": ("comfy.ldm.lumina.model", "NextDiT", models.Z_IMAGE, "ZImage", "Tongyi-MAI/Z-Image-Turbo transformer/config.json"),
    "lumina2": ("comfy.ldm.lumina.model", "NextDiT", dict(
        patch_size=2, in_channels=16, dim=2304, n_layers=26, n_refiner_layers=2, n_heads=24, n_kv_heads=8,
        ffn_dim_multiplier=4.0, qk_norm=True, cap_feat_dim=2304, axes_dims=[32, 32, 32], axes_lens=[300, 512, 512],
        rope_theta=10000.0), "Lumina2", "Alpha-VLLM/Lumina-Image-2.0 transformer/config.json"),
    "sd3.5-large": ("comfy.ldm.modules.diffusionmodules.mmdit", "OpenAISignatureMMDITWrapper", dict(
        input_size=None, patch_size=2, in_channels=16, out_channels=16, depth=38, adm_in_channels=2048,
        context_embedder_config={"target": "torch.nn.Linear", "params": {"in_features": 4096,
                                                                         "out_features": 2432}},
        pos_embed_max_size=192, num_patches=36864, qk_norm="rms", pos_embed_scaling_factor=None,
        x_block_self_attn_layers=[]), "SD3", "stabilityai/stable-diffusion-3.5-large transformer/config.json"),
    "hidream-i1": ("comfy.ldm.hidream.model", "HiDreamImageTransformer2DModel", dict(
        patch_size=2, in_channels=16, out_channels=16, num_layers=16, num_single_layers=32, attention_head_dim=128,
        num_attention_heads=20, caption_channels=[4096, 4096], text_emb_dim=2048, num_routed_experts=4,
        num_activated_experts=2, axes_dims_rope=(64, 32, 32), max_resolution=(128, 128),
        llama_layers=list(range(32)) + [31] * 16), "HiDream", "HiDream-ai/HiDream-I1-Full transformer/config.json"),
    "hunyuan-image-2.1": ("comfy.ldm.hunyuan_video.model", "HunyuanVideo", dict(
        in_channels=64, out_channels=64, vec_in_dim=None, context_in_dim=3584, hidden_size=3584, mlp_ratio=4.0,
        num_heads=28, depth=20, depth_single_blocks=40, axes_dim=[64, 64], theta=256, patch_size=[1, 1],
        qkv_bias=True, guidance_embed=True, byt5=True, meanflow=False, use_cond_type_embedding=False,
        vision_in_dim=None, meanflow_sum=False), "HunyuanImage21",
        "tencent/HunyuanImage-2.1 dit config (hidden 3584, 28 heads, 20 double and 40 single blocks, patch 1)"),
    "wan-14b": ("comfy.ldm.wan.model", "WanModel", dict(
        WAN, in_dim=16, dim=5120, ffn_dim=13824, out_dim=16, num_heads=40, num_layers=40), "WAN21_T2V",
        "Wan-AI/Wan2.1-T2V-14B config.json"),
    "wan2.2-5b": ("comfy.ldm.wan.model", "WanModel", dict(
        WAN, in_dim=48, dim=3072, ffn_dim=14336, out_dim=48, num_heads=24, num_layers=30), "WAN22_T2V",
        "Wan-AI/Wan2.2-TI2V-5B config.json"),
    "kandinsky5-image": ("comfy.ldm.kandinsky5.model", "Kandinsky5", dict(
        KANDINSKY5, model_dim=2560, ff_dim=10240, visual_embed_dim=64, num_visual_blocks=50, axes_dims=(32, 48, 48),
        rope_scale_factor=(1.0, 1.0, 1.0)), "Kandinsky5Image", "kandinskylab/kandinsky-5 configs/config_t2i.yaml"),
    "kandinsky5-video": ("comfy.ldm.kandinsky5.model", "Kandinsky5", dict(
        KANDINSKY5, model_dim=1792, ff_dim=7168, visual_embed_dim=(16 + 16 + 1) * 4, num_visual_blocks=32,
        axes_dims=(16, 24, 24)), "Kandinsky5",
        "kandinskylab/kandinsky-5 configs/k5_lite_t2v_10s_sft_sd.yaml (visual_cond: latent, image and mask in)"),
    "kandinsky5-video-pro": ("comfy.ldm.kandinsky5.model", "Kandinsky5", dict(
        KANDINSKY5, time_dim=1024, num_text_blocks=4, model_dim=4096, ff_dim=16384,
        visual_embed_dim=(16 + 16 + 1) * 4, num_visual_blocks=60, axes_dims=(32, 48, 48)), "Kandinsky5",
        "kandinskylab/kandinsky-5 configs/k5_pro_t2v_5s_sft_sd.yaml (visual_cond: latent, image and mask in)"),
}


def add_arguments(parser) -> None:
    parser.add_argument("--comfyui", type=Path, required=True, help="a real ComfyUI tree (.realcomfy/0.33.0)")
    parser.add_argument("--into", type=Path, default=None,
                        help=f"a results file to write the report into, under the key {KEY!r}")
    parser.add_argument("--deps", type=Path, default=None,
                        help="a folder of the release's packages the environment lacks (pip install --target DIR "
                             "comfy-kitchen comfy-aimdo einops psutil safetensors tqdm)")


def import_paths(options) -> list[Path]:
    return [options.comfyui.resolve(), *([options.deps.resolve()] if options.deps else [])]


class _StubType(type):
    """A stand-in class for a name of a stubbed package: any attribute is another, calling it makes an instance."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _StubType(name, (), {})

    def __call__(cls, *args, **kwargs):
        return type.__call__(cls)


class _Stubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in STUBBED_ROOTS:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = lambda name: _StubType(name, (), {})
        return module

    def exec_module(self, module) -> None:
        pass


def import_comfy():
    """comfy's model classes, detection and formats, on the CPU, with the stubs in place."""
    sys.meta_path.insert(0, _Stubs())
    sys.argv = [sys.argv[0], "--cpu"]
    import comfy.options
    comfy.options.enable_args_parsing()
    import comfy.model_detection
    import comfy.ops
    return comfy


def check_entry(comfy, key: str, entry: dict) -> dict:
    """One entry against the release: what ComfyUI makes of the model's weights, and what differs from the table."""
    import torch
    module_name, class_name, arguments, expected_class, source = ARGUMENTS[key]
    model_class = getattr(importlib.import_module(module_name), class_name)
    model = model_class(**arguments, device="meta", dtype=torch.bfloat16, operations=comfy.ops.disable_weight_init)
    state = model.state_dict()
    config = comfy.model_detection.model_config_from_unet(state, "")
    patch = getattr(model, "patch_size", None)
    patch = patch[-1] if isinstance(patch, (list, tuple)) else patch
    parameters = sum(t.numel() for t in model.parameters())
    found = {"supported_models": type(config).__name__ if config else None,
             "model_class": f"{module_name}.{class_name}",
             "image_model": config.unet_config.get("image_model") if config else None,
             "config": {k: config.unet_config.get(k) for k in entry["comfyui"]["config"]} if config else {},
             "latent_channels": config.latent_format.latent_channels if config else None,
             "latent_factor": config.latent_format.spacial_downscale_ratio if config else None,
             "patch": patch, "parameters": parameters, "arguments_from": source}
    want = entry["comfyui"]
    differs = [what for what, mine, theirs in (
        ("supported_models", expected_class, found["supported_models"]),
        ("image_model", want["image_model"], found["image_model"]),
        ("config", want["config"], found["config"]),
        ("latent_channels", want["latent_channels"], found["latent_channels"]),
        ("latent_factor", want["latent_factor"], found["latent_factor"]),
        ("patch", want["patch"], patch),
        ("vae factor", entry["vae"]["factor"], found["latent_factor"]),
        ("vae channels", entry["vae"]["channels"], found["latent_channels"])) if mine != theirs]
    ratio = parameters / entry["parameters"]
    if abs(ratio - 1) > PARAMETER_TOLERANCE:
        differs.append(f"parameters ({parameters} counted, {entry['parameters']} in the table)")
    return {"model": key, "name": entry["name"], "found": found, "table_parameters": entry["parameters"],
            "parameters_ratio": round(ratio, 4), "differs": differs, "agrees": not differs}


def run(options, parser) -> int:
    table = json.loads(TABLE.read_text(encoding="utf-8"))
    command = results.command_line()          # before import_comfy sets ComfyUI's own arguments
    comfy = import_comfy()
    version = (options.comfyui / "comfyui_version.py").read_text().split('"')[1]
    checked = []
    for key, entry in table.items():
        if key not in ARGUMENTS:
            checked.append({"model": key, "name": entry["name"], "agrees": None,
                            "differs": ["not built: not a model the node tiles (no ComfyUI recognition in the table)"]})
            continue
        try:
            checked.append(check_entry(comfy, key, entry))
        except Exception as exc:      # one model's failure is a row of the report, not the end of it
            checked.append({"model": key, "name": entry["name"], "agrees": False,
                            "differs": [f"not built: {type(exc).__name__}: {exc}"]})
        row = checked[-1]
        print(f"{key:20s} {'agrees' if row['agrees'] else 'DIFFERS: ' + '; '.join(row['differs'])}")
    report = {"script": command, "date": results.now(), "comfyui": version,
              "table": "overlays/fused_dit/models.json", "device": "meta (CPU, no weights)",
              "parameter_tolerance": PARAMETER_TOLERANCE, "models": checked}
    if options.into:
        whole = json.loads(options.into.read_text(encoding="utf-8")) if options.into.is_file() else {}
        whole[KEY] = report
        results.write_json(whole, options.into, expanded_depth=INTO_DEPTH)
    return 0 if all(row["agrees"] is not False for row in checked) else 1
