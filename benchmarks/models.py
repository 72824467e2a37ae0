"""How a model is built and loaded: seeded random weights of a release's own model class, loaded as UNETLoader loads.

Flux-dev (12B), Wan 2.1 T2V 14B, Qwen-Image (20B) and Qwen-Image 2.1 (7B; trees that have it) at full size (or shrunk to what ComfyUI's model detection still
recognises, --tiny), built with the release's own diffusion model class, in the key format of the released
checkpoint files, written as safetensors (`checkpoint`) or handed over as a state dict, and loaded by
comfy.sd.load_diffusion_model(_state_dict) inside torch.inference_mode() as ComfyUI's executor does; with the inputs
KSampler gets and its sampling call. The weights are random: speed, memory and which code ran, never image quality.

    python -m benchmarks checkpoint --comfyui DIR --model flux-dev --dir CKPT_DIR [--tiny]
writes the file a UNETLoader reads (once; its name carries the key format), and prints `CHECKPOINT {json}`;
`--model flux-vae` writes Flux's VAE (BFL's ae.safetensors keys) for a VAELoader, checked through the release's own
comfy.sd.VAE.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib
import json
import math
import os
import time
from pathlib import Path

from . import comfy_release

REPO = Path(__file__).resolve().parent.parent
# how the weights were loaded: as ComfyUI does (UNETLoader and load_models_gpu inside torch.inference_mode(), so
# they are inference tensors), or outside it (--load-outside-inference-mode)
WEIGHTS_LOADED = {False: "in inference_mode (as ComfyUI)", True: "outside inference_mode (not as ComfyUI)"}
SAMPLER = {"sampler_name": "euler", "scheduler": "simple", "cfg": 1.0, "denoise": 1.0}


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    key: str
    family: str            # "flux" | "wan" | "qwen_image"
    full: dict             # constructor arguments of ComfyUI's diffusion model class at full size
    tiny: dict             # the same, shrunk to what ComfyUI's model detection still recognises
    resolutions: tuple     # (height, width) or (height, width, frames)
    tiny_resolutions: tuple
    text_tokens: int       # T5 tokens for Flux (FluxTokenizer min_length), umT5 tokens for Wan, Qwen2.5-VL for Qwen
    tiny_text_tokens: int
    model_class: str = ""  # the comfy.model_base class ComfyUI's detection must pick for these weights
    # run only when --resolutions names them (applier budget's validation points, issue 30: a Flux-dev 4096 step
    # takes ~10 s on an H200, Wan's 81 frames ~4 s; a run of the defaults stays as long as it was)
    on_request: tuple = ()
    # issue 50's tiled refinement: the model's key in the pack's table (overlays/fused_dit/models.json), whose
    # tiling.tile_px TiledSampling is given, and the canvases the tiled configs run at (they run there only)
    table_key: str = ""
    tiled_resolutions: tuple = ()
    tiny_tiled_resolutions: tuple = ()
    # how the checkpoint stores its matrices (the other tensors are bf16): FLUX.2 [dev]'s 32B in bf16 (64 GB) fits
    # neither the card's route nor the machine's disk beside another model, so its file is fp8 as Comfy-Org's is
    storage: str = "bfloat16"
    # the matrices in ComfyUI's quantized-checkpoint format (each Linear's weight with its `weight_scale` and a
    # `comfy_quant` JSON naming the format, as Comfy-Org's fp8mixed files are): ComfyUI then builds its mixed-precision
    # ops, which multiply in FP8 on a card with FP8 compute; without it a fp8 file is cast to bf16 per layer
    quantized: bool = False


FLUX_DEV = dict(in_channels=16, out_channels=16, vec_in_dim=768, context_in_dim=4096, hidden_size=3072,
                mlp_ratio=4.0, num_heads=24, depth=19, depth_single_blocks=38, axes_dim=[16, 56, 56], theta=10000,
                patch_size=2, qkv_bias=True, guidance_embed=True)
WAN21_T2V_14B = dict(model_type="t2v", patch_size=(1, 2, 2), text_len=512, in_dim=16, dim=5120, ffn_dim=13824,
                     freq_dim=256, text_dim=4096, out_dim=16, num_heads=40, num_layers=40, window_size=(-1, -1),
                     qk_norm=True, cross_attn_norm=True, eps=1e-6)
# Qwen-Image (Qwen/Qwen-Image, 20B; Comfy-Org's qwen_image_bf16.safetensors): what ComfyUI's detection yields for the
# released weights (model_detection: image_model "qwen_image", in_channels = img_in.weight's 64 = 16 latent channels x
# 2 x 2, num_layers = the 60 transformer_blocks; supported_models.QwenImage adds nothing), the rest being
# QwenImageTransformer2DModel's defaults, which match the release's transformer config. Every argument here exists
# in every release from 0.3.64 to 0.33.0; default_ref_method and use_additional_t_cond (there from 0.8.0 on) stay
# default: detection sets them only for the Edit-2511 and Layered models, from keys the text-to-image file lacks.
QWEN_IMAGE = dict(image_model="qwen_image", patch_size=2, in_channels=64, out_channels=16, num_layers=60,
                  attention_head_dim=128, num_attention_heads=24, joint_attention_dim=3584, pooled_projection_dim=768,
                  axes_dims_rope=(16, 56, 56))
# Qwen-Image's text context: ComfyUI's QwenImageTokenizer wraps the prompt in its chat template and the text encoder
# cuts the template off (QwenImageTEModel.encode_token_weights), with no padding and no attention mask for a single
# prompt; the Qwen-Image release's own example prompt (the coffee-shop sign of its README) gives 115 tokens there
# (a one-line prompt such as "A cat holding a sign that says hello world" gives 14)
QWEN_IMAGE_TEXT_TOKENS = 115
# Qwen-Image 2.1 (Qwen/Qwen-Image-2.1; Comfy-Org's qwen_image_2.1_bf16.safetensors), in the newest Comfy-Org/ComfyUI
# files public code search holds (0.38.x): comfy/ldm/qwen_image21/model.py's QwenImage21Transformer2DModel, a
# single-stream DiT whose block loop is the one the release puts under its model compiler (make_prefetch_queue,
# malloc_graph_begin, prefetch_queue_pop(..., malloc_scope="block"), malloc_graph_end). Its defaults are the
# released model: 32 blocks of 32 heads x 128 (4096 wide), a SwiGLU MLP of ratio 3 with gate and up fused in one
# GEMM, Qwen3-VL 8B's 4096-wide text, 64 latent channels at 1/16 of the image and no patchify
# (latent_formats.QwenImage21); about 7.1B parameters, 14 GB in bf16. Model detection (the "Qwen Image 2.1" entry of
# model_detection.py) reads every argument here from the weights (img_in, proj_out, the number of
# transformer_blocks, attn.norm_q, txt_in.text_norm, img_mlp.gate_up); axes_dims_rope stays default (16, 56, 56),
# which fixes the head at 128, so the tiny model keeps the head and loses heads, depth and text width.
QWEN_IMAGE21 = dict(in_channels=64, out_channels=64, num_layers=32, attention_head_dim=128, num_attention_heads=32,
                    context_in_dim=4096, mlp_ratio=3, fused_mlp=True)
QWEN_IMAGE21_TINY = {**QWEN_IMAGE21, "num_layers": 2, "num_attention_heads": 2, "context_in_dim": 256}
# FLUX.2 [dev] (black-forest-labs/FLUX.2-dev transformer/config.json: 8 double and 48 single blocks of 48 heads x
# 128, mlp_ratio 3 with a gated SiLU MLP, 128 latent channels at 1/16, patch 1, Mistral 3 24B's three 5120-wide
# layers as context); ComfyUI's flux2 detection branch sets the rest from the presence of
# double_stream_modulation_img (global modulation, no biases) and reads hidden_size from img_in and context width
# from txt_in, heads = hidden / 128. 32.2B parameters (counted in overlay-eras.json model_table).
FLUX2_DEV = dict(FLUX_DEV, in_channels=128, out_channels=128, vec_in_dim=None, context_in_dim=15360, hidden_size=6144,
                 mlp_ratio=3.0, num_heads=48, depth=8, depth_single_blocks=48, axes_dim=[32, 32, 32, 32], theta=2000,
                 patch_size=1, qkv_bias=False, txt_ids_dims=[3], global_modulation=True, mlp_silu_act=True,
                 ops_bias=False)
# Z-Image-Turbo (Tongyi-MAI/Z-Image-Turbo transformer/config.json) on comfy.ldm.lumina.model.NextDiT: ComfyUI's
# lumina2 branch names it Z-Image only at dim 3840 (and sets heads, rope and modulation from that), reads the depth
# and Qwen3 4B's 2560-wide context from the weights; the refiners' depth (2) is the class default
Z_IMAGE = dict(patch_size=2, in_channels=16, dim=3840, n_layers=30, n_refiner_layers=2, n_heads=30, n_kv_heads=30,
               ffn_dim_multiplier=8.0 / 3.0, qk_norm=True, cap_feat_dim=2560, axes_dims=[32, 48, 48],
               axes_lens=[1536, 512, 512], rope_theta=256.0, z_image_modulation=True, time_scale=1000.0,
               pad_tokens_multiple=32)
TILED_CANVASES = ((4096, 4096), (8192, 8192))
TINY_TILED_CANVASES = ((512, 512),)
MODELS = {
    # ComfyUI's Flux detection fixes hidden 3072 / 24 heads, so the tiny Flux only loses depth
    "flux-dev": ModelSpec("flux-dev", "flux", FLUX_DEV, {**FLUX_DEV, "depth": 1, "depth_single_blocks": 1},
                          ((1024, 1024), (2048, 2048)), ((64, 64),), 256, 8, "Flux", ((4096, 4096),)),
    # Wan's detection reads dim (heads = dim // 128), ffn_dim and the depth from the weights
    "wan2.1-t2v-14b": ModelSpec("wan2.1-t2v-14b", "wan", WAN21_T2V_14B,
                                {**WAN21_T2V_14B, "dim": 256, "ffn_dim": 512, "num_heads": 2, "num_layers": 1},
                                ((480, 832, 33),), ((64, 64, 5),), 512, 8, "WAN21", ((480, 832, 81),)),
    # Qwen-Image's detection reads in_channels and the depth only: the tiny Qwen-Image only loses depth
    "qwen-image": ModelSpec("qwen-image", "qwen_image", QWEN_IMAGE, {**QWEN_IMAGE, "num_layers": 1},
                            ((1024, 1024),), ((64, 64),), QWEN_IMAGE_TEXT_TOKENS, 8, "QwenImage", ((2048, 2048),),
                            "qwen-image", TILED_CANVASES, TINY_TILED_CANVASES),
    # the text context: Qwen-Image's token count for the same prompt (Qwen-Image 2.1's Qwen3-VL template was not
    # run here); 1024x1024 is 64x64 latent tokens
    "qwen-image-2.1": ModelSpec("qwen-image-2.1", "qwen_image21", QWEN_IMAGE21, QWEN_IMAGE21_TINY,
                                ((1024, 1024),), ((64, 64),), QWEN_IMAGE_TEXT_TOKENS, 8, "QwenImage21"),
    # issue 50's models. FLUX.2's detection takes heads from the width (hidden / 128): the tiny one is 2 heads wide,
    # one block of each kind, a 256-wide context; its text is padded to 512 tokens by model_base.Flux2 in any case
    "flux2-dev": ModelSpec("flux2-dev", "flux2", FLUX2_DEV,
                           {**FLUX2_DEV, "hidden_size": 256, "num_heads": 2, "depth": 1, "depth_single_blocks": 1,
                            "context_in_dim": 256},
                           ((1024, 1024), (2048, 2048)), ((64, 64),), 512, 8, "Flux2", (), "flux2-dev",
                           TILED_CANVASES, TINY_TILED_CANVASES, storage="float8_e4m3fn", quantized=True),
    # Z-Image is named only at its full width (see Z_IMAGE): the tiny one keeps it and loses depth (one block
    # beside the two noise and two context refiners)
    "z-image": ModelSpec("z-image", "lumina2", Z_IMAGE, {**Z_IMAGE, "n_layers": 1}, ((1024, 1024), (2048, 2048)),
                         ((64, 64),), 512, 8, "Lumina2", (), "z-image", TILED_CANVASES, TINY_TILED_CANVASES),
    # Wan 2.2 A14B: two experts (high and low noise), each of Wan 2.1 T2V 14B's shape, which ComfyUI loads as
    # WAN21_T2V; one expert is measured (a step runs one of them). Its tiled canvases are stills (one frame): a tile
    # carries every frame, so a video canvas multiplies each tile's tokens by its latent frames
    "wan2.2-t2v-14b": ModelSpec("wan2.2-t2v-14b", "wan", WAN21_T2V_14B,
                                {**WAN21_T2V_14B, "dim": 256, "ffn_dim": 512, "num_heads": 2, "num_layers": 1},
                                ((480, 832, 81),), ((64, 64, 5),), 512, 8, "WAN21", (), "wan-14b",
                                ((4096, 4096, 1), (8192, 8192, 1)), ((512, 512, 1),)),
}
# the models a command runs when --models names none (issue 50's are named: each is tens of GB)
DEFAULT_MODELS = ("flux-dev", "wan2.1-t2v-14b", "qwen-image", "qwen-image-2.1")


def resolution_name(resolution: tuple) -> str:
    return "x".join(str(v) for v in resolution)



class ModelUnavailable(Exception):
    """This ComfyUI release has no code for the model (its runs are recorded as skipped, with this reason)."""


# the models a release may lack: family -> (package under comfy.ldm, class, name in the skip reason)
OPTIONAL_MODELS = {"qwen_image": ("qwen_image", "QwenImageTransformer2DModel", "Qwen-Image"),
                   "qwen_image21": ("qwen_image21", "QwenImage21Transformer2DModel", "Qwen-Image 2.1")}


def diffusion_model_class(spec: ModelSpec):
    if spec.family in ("flux", "flux2"):
        from comfy.ldm.flux.model import Flux
        return Flux
    if spec.family == "lumina2":
        from comfy.ldm.lumina.model import NextDiT
        return NextDiT
    if spec.family in OPTIONAL_MODELS:
        package, name, label = OPTIONAL_MODELS[spec.family]
        module = f"comfy.ldm.{package}.model"
        try:
            return getattr(importlib.import_module(module), name)
        except ModuleNotFoundError as error:
            if error.name not in (module.rsplit(".", 1)[0], module):
                raise
            raise ModelUnavailable(f"this ComfyUI release has no {label} model (no {error.name})") from None
    from comfy.ldm.wan.model import WanModel
    return WanModel


def constructor_arguments(spec: ModelSpec, tiny: bool) -> dict:
    """The arguments of this release's diffusion model class (Flux: txt_ids_dims where FluxParams has it)."""
    arguments = spec.tiny if tiny else spec.full
    if spec.family in ("flux", "flux2"):
        from comfy.ldm.flux.model import FluxParams
        arguments = comfy_release.flux_arguments(arguments, {f.name for f in dataclasses.fields(FluxParams)})
    return arguments


# ----------------------------------------------------------------- Qwen-Image 2.1 on a tree that predates it
# The assembled newest tree carries comfy/ldm/qwen_image21/model.py, but its model_detection.py, supported_models.py,
# model_base.py and latent_formats.py can be older than the Qwen-Image 2.1 entries (the newest of those files import
# model packages the rest of the tree lacks). There the weights still go through the release's own loader
# (comfy.sd.load_diffusion_model_state_dict: its dtype choice, DynamicVRAM, ModelPatcherDynamic, weight loading),
# and only the step that names the model is bridged: for weights with Qwen-Image 2.1's keys that the tree's
# detection does not name, model_config_from_unet returns a config of the project's own (below), built on the tree's
# own supported_models.QwenImage and model_base.QwenImage around the release's QwenImage21Transformer2DModel. The
# run's setup record says which route loaded it (`model_route`).
QWEN_IMAGE21_KEYS = ("txt_in.text_norm.weight", "modulation.1.weight", "transformer_blocks.0.attn.norm_q.weight",
                     "img_in.weight", "proj_out.weight")
QWEN_IMAGE21_BRIDGE = {
    "why": "the tree's model detection does not name Qwen-Image 2.1",
    # what the bridge gives the model in place of the newest files' QwenImage21 entries
    "unet_config": "the arguments the weights were built from (benchmarks/models.py), image_model qwen_image21",
    "latent_format": "64 channels at 1/16, no scaling (the newest latent_formats.QwenImage21's shape; its per-channel "
                     "mean and std are not applied: random weights, speed only)",
    "sampling_settings": {"multiplier": 1.0, "shift": 0.69},
    "memory_usage_factor": 6.0,
    "model_base": "the tree's model_base.QwenImage with unet_model=QwenImage21Transformer2DModel; the prefix K/V "
                  "cache switched per sampling run as the newest model_base.QwenImage21 switches it (on while a "
                  "patcher with no hook patches runs the model)",
    "not_covered": "model_base.QwenImage21.get_dynamic_vram__units (ModelPatcherDynamic.load asks for it: without "
                   "it the blocks load in size order and get no _v_block, which only model_prefetch's CUDA-graph "
                   "path uses; Qwen-Image 2.1's own block loop hands prefetch_queue_pop no core, so the release "
                   "captures no CUDA graph either way) and extra_conds' image_slots (no reference images here)",
}


def qwen_image21_bridge(spec: "ModelSpec", tiny: bool):
    """A context in which the tree's model_config_from_unet names Qwen-Image 2.1 weights its detection does not
    know (no-op on a tree whose detection has the entry); yields a dict that says whether the bridge was used."""
    import comfy.latent_formats
    import comfy.model_base
    import comfy.model_detection
    import comfy.supported_models
    from comfy.ldm.qwen_image21.model import QwenImage21Transformer2DModel

    class Latent(comfy.latent_formats.LatentFormat):
        latent_channels = 64
        spacial_downscale_ratio = 16

    class QwenImage21(comfy.model_base.QwenImage):
        """The bridge's stand-in for the newest model_base.QwenImage21 (named as it is, so a run checks one name
        whichever route loaded the model; `model_route` and `model_base_class` in the setup record tell them
        apart)."""
        def __init__(self, model_config, model_type=comfy.model_base.ModelType.FLUX, device=None):
            super().__init__(model_config, model_type, device=device, unet_model=QwenImage21Transformer2DModel)

        @property
        def current_patcher(self):
            return self.__dict__.get("_bridge_patcher")

        @current_patcher.setter
        def current_patcher(self, patcher):
            self.__dict__["_bridge_patcher"] = patcher
            diffusion_model = self.__dict__.get("_modules", {}).get("diffusion_model")
            if diffusion_model is not None:
                diffusion_model.current_patcher = patcher
                diffusion_model.reset_prefix_cache(patcher is not None and not patcher.hook_patches)

    class Config(comfy.supported_models.QwenImage):
        unet_config = {"image_model": "qwen_image21"}
        sampling_settings = dict(QWEN_IMAGE21_BRIDGE["sampling_settings"])
        memory_usage_factor = QWEN_IMAGE21_BRIDGE["memory_usage_factor"]
        latent_format = Latent

        def get_model(self, state_dict, prefix="", device=None):
            return QwenImage21(self, device=device)

    original = comfy.model_detection.model_config_from_unet
    used = {"model_route": "the tree's model detection"}

    def named(state_dict, unet_key_prefix, *args, **kwargs):
        config = original(state_dict, unet_key_prefix, *args, **kwargs)
        ours = all(unet_key_prefix + k in state_dict for k in QWEN_IMAGE21_KEYS)
        if ours and (config is None or config.unet_config.get("image_model") != "qwen_image21"):
            used.update(model_route="bridge (the tree's loader; the model named by benchmarks/models.py)",
                        bridge=QWEN_IMAGE21_BRIDGE)
            return Config({"image_model": "qwen_image21", **constructor_arguments(spec, tiny)})
        return config

    @contextlib.contextmanager
    def bridged():
        comfy.model_detection.model_config_from_unet = named
        try:
            yield used
        finally:
            comfy.model_detection.model_config_from_unet = original
    return bridged()


def checkpoint_shapes(spec: ModelSpec, tiny: bool) -> dict:
    """{key: shape} of this release's model (built on the meta device), keys spelt as the released checkpoint
    files spell them (comfy_release.checkpoint_key), which the release's own loader then converts."""
    import torch
    import comfy.ops
    # under DynamicVRAM (comfy.memory_management.aimdo_enabled) ComfyUI's Linear creates no weight until a state
    # dict is loaded into it, so the model that names the weights is built the legacy way
    with comfy_release.eager_weights(), torch.device("meta"):
        model = diffusion_model_class(spec)(**constructor_arguments(spec, tiny),
                                            operations=comfy.ops.disable_weight_init, device="meta",
                                            dtype=torch.bfloat16)
    shapes = {comfy_release.checkpoint_key(name, spec.family): tuple(t.shape)
              for name, t in model.state_dict().items()}
    del model
    return shapes


def random_state_dict(spec: ModelSpec, tiny: bool, seed: int, device: str) -> dict:
    """Seeded random weights with the names and shapes of the release's checkpoint (checkpoint_shapes): bf16, the
    matrices in the spec's storage dtype (FLUX.2: float8_e4m3fn in ComfyUI's quantized format, as Comfy-Org's
    fp8mixed file: ComfyUI's mixed-precision ops multiply them in FP8 on a card with FP8 compute)."""
    return random_tensors(checkpoint_shapes(spec, tiny), seed, device, matrices=spec.storage,
                          quantized=spec.quantized)


def random_tensors(shapes: dict, seed: int, device: str, dtype: str = "bfloat16", matrices: str = "",
                   quantized: bool = False) -> dict:
    """Seeded random weights of these names and shapes (2-D ones in `matrices` where given; `quantized`: each such
    weight scaled to the format's range, with its `weight_scale` and `comfy_quant` beside it, ComfyUI's format).

    Scales keep activations finite through the whole depth: matrices and convolutions ~ N(0, 1/fan_in), norm
    scales near 1, biases and Wan's modulation tables small. Tensors are drawn on `device` and returned on the CPU."""
    import torch
    state = {}
    for index, (name, shape) in enumerate(sorted(shapes.items())):
        generator = torch.Generator(device=device).manual_seed(seed * 100003 + index)
        noise = torch.randn(shape, generator=generator, device=device, dtype=torch.float32)
        leaf = name.rsplit(".", 1)[-1]
        if "modulation" in name and len(shape) != 2:
            # Wan's modulation tables; Qwen-Image 2.1's shared modulation is a Linear and drawn as one
            noise *= 0.1
        elif len(shape) >= 2:
            noise /= math.sqrt(math.prod(shape[1:]))
        elif leaf in ("scale", "weight"):
            noise = 1.0 + 0.1 * noise
        else:
            noise *= 0.05
        stored = matrices if matrices and len(shape) == 2 else dtype
        if quantized and stored == matrices and leaf == "weight":
            prefix = name[:-len("weight")]
            scale = noise.abs().amax().clamp(min=1e-12) / torch.finfo(getattr(torch, matrices)).max
            noise /= scale
            state[prefix + "weight_scale"] = scale.float().cpu().reshape(())
            state[prefix + "comfy_quant"] = torch.tensor(list(json.dumps({"format": matrices}).encode("utf-8")),
                                                         dtype=torch.uint8)
        state[name] = noise.to(getattr(torch, stored)).cpu().contiguous()
        del noise
    return state


def checkpoint_path(directory: Path, spec: ModelSpec, tiny: bool, seed: int) -> Path:
    """The file's name carries a tag of its key format, so releases that spell keys alike share one file."""
    tag = comfy_release.key_format_tag(checkpoint_shapes(spec, tiny))
    stored = ("" if spec.storage == "bfloat16" else f"-{spec.storage}") + ("-quantized" if spec.quantized else "")
    return directory / f"{spec.key}{'-tiny' if tiny else ''}{stored}-random-seed{seed}-keys{tag}.safetensors"


def ensure_checkpoint(directory: Path, spec: ModelSpec, tiny: bool, seed: int, device: str) -> tuple[Path, float]:
    """The random-weight safetensors file a UNETLoader would read (written once); seconds spent writing it."""
    from safetensors.torch import save_file
    path = checkpoint_path(directory, spec, tiny, seed)
    if path.exists():
        return path, 0.0
    started = time.perf_counter()
    directory.mkdir(parents=True, exist_ok=True)
    state = random_state_dict(spec, tiny, seed, device)
    partial = path.with_suffix(".partial")
    save_file(state, str(partial), metadata={"note": "seeded random weights (benchmarks/models.py)"})
    del state
    partial.replace(path)
    # written back to disk before anything is timed: the kernel's write-back of tens of GB takes host CPU for a
    # minute after the write, and a host-bound step (DynamicVRAM) measured meanwhile ran 2x slower (Qwen-Image)
    os.sync()
    return path, time.perf_counter() - started



# ------------------------------------------------------------------------------------------------- the Flux VAE
# BFL's ae.safetensors, Flux-dev's VAE: the SD family's KL autoencoder with 16 latent channels (ch 128, ch_mult
# 1,2,4,4, 2 res blocks, no quant convs), keys "encoder.*" and "decoder.*", float32. ComfyUI's VAE (comfy/sd.py)
# builds an AutoencodingEngine of comfy.ldm.modules.diffusionmodules.model's Encoder and Decoder for a file whose
# decoder.conv_in takes 16 channels and that has no post_quant_conv: the same module, built here, names the keys.
FLUX_VAE = dict(double_z=True, z_channels=16, resolution=256, in_channels=3, out_ch=3, ch=128, ch_mult=[1, 2, 4, 4],
                num_res_blocks=2, attn_resolutions=[], dropout=0.0)
VAE_KEY = "flux-vae"


def flux_vae_shapes() -> dict:
    import torch
    from comfy.ldm.models.autoencoder import AutoencodingEngine
    blocks = "comfy.ldm.modules.diffusionmodules.model."
    with comfy_release.eager_weights(), torch.device("meta"):
        model = AutoencodingEngine(
            regularizer_config={"target": "comfy.ldm.models.autoencoder.DiagonalGaussianRegularizer"},
            encoder_config={"target": blocks + "Encoder", "params": FLUX_VAE},
            decoder_config={"target": blocks + "Decoder", "params": FLUX_VAE})
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def ensure_flux_vae(directory: Path, seed: int, device: str) -> tuple[Path, float, dict]:
    """The random-weight Flux VAE file a VAELoader reads (written once); seconds spent writing it; and what the
    release's own comfy.sd.VAE makes of it (its model class, latent channels, keys it lacks or does not use)."""
    import comfy.sd
    from safetensors.torch import load_file, save_file
    shapes = flux_vae_shapes()
    path = directory / f"{VAE_KEY}-random-seed{seed}-keys{comfy_release.key_format_tag(shapes)}.safetensors"
    started = time.perf_counter()
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        save_file(random_tensors(shapes, seed, device, "float32"), str(partial),
                  metadata={"note": "seeded random weights (benchmarks/models.py)"})
        partial.replace(path)
    wrote = time.perf_counter() - started
    state = load_file(str(path))
    vae = comfy.sd.VAE(sd=dict(state))
    loaded = set(vae.first_stage_model.state_dict())
    recognised = {"vae_class": type(vae.first_stage_model).__name__, "latent_channels": vae.latent_channels,
                  "parameters": sum(t.numel() for t in state.values()),
                  "missing_keys": sorted(loaded - set(state))[:5], "unused_keys": sorted(set(state) - loaded)[:5]}
    if recognised["latent_channels"] != 16 or recognised["missing_keys"] or recognised["unused_keys"]:
        raise RuntimeError(f"ComfyUI's VAE did not take {path.name} as Flux's VAE: {recognised}")
    return path, wrote, recognised


def inputs_for(spec: ModelSpec, resolution: tuple, tiny: bool, seed: int):
    """Empty latent (EmptySD3LatentImage / EmptyHunyuanLatentVideo shapes), KSampler's noise, and random text
    conditioning of the encoders' shapes (Flux: T5 tokens + CLIP pooled + guidance 3.5; Wan: umT5 tokens; Qwen-Image:
    Qwen2.5-VL's last hidden states, 3584 wide, nothing else: QwenImage.extra_conds takes c_crossattn, and an
    attention_mask only where the encoder padded, which one prompt never is)."""
    import torch
    import comfy.sample
    tokens = spec.tiny_text_tokens if tiny else spec.text_tokens
    generator = torch.Generator().manual_seed(seed + 7)
    if spec.family == "flux":
        height, width = resolution
        latent = torch.zeros(1, 16, height // 8, width // 8)
        context = torch.randn(1, tokens, 4096, generator=generator)
        pooled = torch.randn(1, 768, generator=generator)
        positive = [[context, {"pooled_output": pooled, "guidance": 3.5}]]
    elif spec.family == "flux2":
        # EmptyFlux2LatentImage's 128 channels at 1/16; Mistral 3's three stacked layers (15360 wide) as the context,
        # no pooled vector (model_base.Flux2 pads the context to 512 tokens), guidance 3.5 as FluxGuidance gives it
        height, width = resolution
        latent = torch.zeros(1, 128, height // 16, width // 16)
        context = torch.randn(1, tokens, (spec.tiny if tiny else spec.full)["context_in_dim"], generator=generator)
        positive = [[context, {"guidance": 3.5}]]
    elif spec.family == "lumina2":
        # Z-Image: EmptySD3LatentImage's 16 channels at 1/8; Qwen3 4B's hidden states (2560 wide) as the caption,
        # no attention mask for one prompt (model_base.Lumina2 then counts the caption's tokens itself)
        height, width = resolution
        latent = torch.zeros(1, 16, height // 8, width // 8)
        context = torch.randn(1, tokens, (spec.tiny if tiny else spec.full)["cap_feat_dim"], generator=generator)
        positive = [[context, {}]]
    elif spec.family == "qwen_image21":
        # Qwen-Image 2.1's empty latent: 64 channels at 1/16, no frame axis (latent_formats.QwenImage21); Qwen3-VL
        # 8B's hidden states as the context (QwenImage21 takes c_crossattn as Qwen-Image does)
        height, width = resolution
        latent = torch.zeros(1, 64, height // 16, width // 16)
        context_width = (spec.tiny if tiny else spec.full)["context_in_dim"]
        context = torch.randn(1, tokens, context_width, generator=generator)
        positive = [[context, {}]]
    elif spec.family == "qwen_image":
        height, width = resolution
        # EmptySD3LatentImage's [1, 16, H/8, W/8] as KSampler hands it on (comfy.sample.fix_empty_latent_channels
        # adds a frame axis for Qwen-Image's Wan21 latent format, before KSampler prepares the noise)
        latent = torch.zeros(1, 16, 1, height // 8, width // 8)
        context = torch.randn(1, tokens, 3584, generator=generator)
        positive = [[context, {}]]
    else:
        height, width, frames = resolution
        latent = torch.zeros(1, 16, (frames - 1) // 4 + 1, height // 8, width // 8)
        context = torch.randn(1, tokens, 4096, generator=generator)
        positive = [[context, {}]]
    noise = comfy.sample.prepare_noise(latent, seed)
    return latent, noise, positive


def sample(model, noise, latent, positive, steps, seed, callback=None):
    import comfy.sample
    latent = comfy.sample.fix_empty_latent_channels(model, latent)
    return comfy.sample.sample(model, noise, steps, SAMPLER["cfg"], SAMPLER["sampler_name"], SAMPLER["scheduler"],
                               positive, positive, latent, denoise=SAMPLER["denoise"], callback=callback,
                               disable_pbar=True, seed=seed)



def weight_dtype_of(diffusion_model) -> str:
    """The dtype most of the model's parameters are stored in (the first parameter can be a small fp32 one)."""
    counts: dict = {}
    for parameter in diffusion_model.parameters():
        counts[parameter.dtype] = counts.get(parameter.dtype, 0) + parameter.numel()
    return str(max(counts, key=counts.get)).replace("torch.", "")


def linear_class_of(diffusion_model) -> str | None:
    import torch
    for module in diffusion_model.modules():
        if isinstance(module, torch.nn.Linear):
            return f"{type(module).__module__}.{type(module).__qualname__}"
    return None



def synchronize(device: str) -> None:
    if device == "cuda":
        import torch
        torch.cuda.synchronize()



def free_memory() -> None:
    gc.collect()
    import torch
    if torch.cuda.is_available():
        import comfy.model_management
        comfy.model_management.soft_empty_cache()
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------ the commands' arguments
def add_model_arguments(parser, *, models: str, steps: int, warmup_steps: int, comfyui_required: bool = True):
    """The arguments of every command that starts a release and samples its models (generation, step-profile)."""
    parser.add_argument("--comfyui", type=Path, required=comfyui_required,
                        help="a ComfyUI checkout (its comfy/ package is imported)")
    parser.add_argument("--models", default=models, help=f"comma list of {', '.join(MODELS)}")
    parser.add_argument("--resolutions", default="", help="comma list to keep, e.g. 1024x1024,480x832x33")
    parser.add_argument("--steps", type=int, default=steps, help=f"timed sampling steps (default {steps})")
    parser.add_argument("--warmup-steps", type=int, default=warmup_steps,
                        help=f"steps of the warm-up call (default {warmup_steps})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true",
                        help="shrunk models and images for a CPU smoke test of the whole path")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--allocator", choices=("comfy", "native"), default="comfy",
                        help="comfy: import main.py's cuda_malloc (cudaMallocAsync where ComfyUI enables it)")
    parser.add_argument("--disable-dynamic-vram", action="store_true",
                        help="main.py's flag: the legacy ModelPatcher even where the release starts DynamicVRAM")
    parser.add_argument("--out", type=Path, required=True, help="the JSON to write")


def check_model_arguments(options, parser) -> None:
    """The comma lists as lists and sets, the device resolved (auto: CUDA where /dev/nvidia0 exists, unless
    --tiny); parser.error for an unknown model or fewer than 2 timed steps."""
    options.models = [m for m in options.models.split(",") if m]
    unknown = [m for m in options.models if m not in MODELS]
    if unknown:
        parser.error(f"unknown models {unknown}; known: {', '.join(MODELS)}")
    options.resolutions = {r for r in options.resolutions.split(",") if r}
    if options.steps < 2:
        parser.error("--steps must be at least 2 (the first timed step is reported apart)")
    if options.device == "auto":
        options.device = "cpu" if options.tiny or not Path("/dev/nvidia0").exists() else "cuda"


def resolutions_of(spec: ModelSpec, options) -> list[tuple]:
    """The model's resolutions (--tiny: its tiny ones), those named in --resolutions where it names any; its
    on_request ones only where --resolutions names them."""
    if options.tiny:
        resolutions = spec.tiny_resolutions
    else:
        resolutions = spec.resolutions + tuple(r for r in spec.on_request if resolution_name(r) in options.resolutions)
    return [r for r in resolutions if not options.resolutions or resolution_name(r) in options.resolutions]


def check_device(device: str) -> None:
    """After ComfyUI is imported (torch with it): --device cuda needs a CUDA device torch can see."""
    import torch
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda but torch sees no CUDA device")


def import_paths(options) -> list[Path]:
    """The checkout and the overlay pack (fused_dit, comfyui_fused_dit), in front of everything else."""
    return [options.comfyui.resolve(), REPO / "overlays"] if options.comfyui else []


# ---------------------------------------------------------------------------------------------- loading
class Loader:
    """One process's loaded model, as UNETLoader hands it on; options: tiny, seed, save_checkpoint, work_dir,
    load_outside_inference_mode."""

    def __init__(self, options, device: str):
        self.options = options
        self.device = device
        self.loaded: tuple | None = None        # (model key, load key)
        self.patcher = None
        self.state_cache: dict = {}             # model key -> CPU state dict, when there is no checkpoint dir
        self.setup: list[dict] = []             # checkpoint writes and loads, with seconds

    def model_options(self, weights: str) -> dict:
        import torch
        return {"dtype": torch.float8_e4m3fn} if weights == "fp8_e4m3fn" else {}

    def load(self, spec: ModelSpec, run):
        """The ModelPatcher UNETLoader would return for this run's weights (reused between runs); run.load_key is
        (weights, --fast fp8_matrix_mult)."""
        import torch
        wanted = (spec.key, run.load_key)
        if self.loaded == wanted:
            return self.patcher
        self.unload()
        if self.options.load_outside_inference_mode:
            # not what ComfyUI does: weights loaded and moved to the GPU with autograd's bookkeeping (as a script
            # that builds the model itself would), so code that needs ordinary tensors can be measured
            import comfy.model_management
            patcher = self._load(spec, run, wanted)
            if self.device == "cuda":
                comfy.model_management.load_models_gpu([patcher])
            return patcher
        # UNETLoader runs inside the executor's torch.inference_mode(): the weights are inference tensors
        with torch.inference_mode():
            return self._load(spec, run, wanted)

    def _load(self, spec: ModelSpec, run, wanted: tuple):
        import comfy.sd
        from comfy.cli_args import PerformanceFeature, args
        weights, fast = run.load_key
        # the CLI's --fast fp8_matrix_mult: comfy.ops.pick_operations reads it when the model is built
        args.fast = {PerformanceFeature.Fp8MatrixMultiplication} if fast else set()
        started = time.perf_counter()
        record = {"model": spec.key, "weights": weights, "fast": sorted(f.value for f in args.fast)}
        if self.options.save_checkpoint:
            path, wrote = ensure_checkpoint(self.options.work_dir, spec, self.options.tiny, self.options.seed,
                                            self.device)
            record.update({"checkpoint": path.name, "checkpoint_bytes": path.stat().st_size,
                           "write_s": round(wrote, 1), "loader": "comfy.sd.load_diffusion_model"})
            loaded = time.perf_counter()
            with self.naming(spec) as route:
                self.patcher = comfy.sd.load_diffusion_model(str(path), model_options=self.model_options(weights))
        else:
            if spec.key not in self.state_cache:
                self.state_cache[spec.key] = random_state_dict(spec, self.options.tiny, self.options.seed,
                                                               self.device)
            record.update({"loader": "comfy.sd.load_diffusion_model_state_dict",
                           "build_s": round(time.perf_counter() - started, 1)})
            loaded = time.perf_counter()
            # a shallow copy: ComfyUI pops the keys it loads out of the dict it is given
            with self.naming(spec) as route:
                self.patcher = comfy.sd.load_diffusion_model_state_dict(dict(self.state_cache[spec.key]),
                                                                        model_options=self.model_options(weights))
        if self.patcher is None:
            raise RuntimeError(f"ComfyUI did not recognise the {spec.key} weights")
        detected = type(self.patcher.model).__name__
        if spec.model_class and detected != spec.model_class:
            raise RuntimeError(f"ComfyUI detected the {spec.key} weights as {detected}, not {spec.model_class} "
                               f"(route: {route.get('model_route', 'model detection')})")
        record.update(route)
        record["model_base_class"] = f"{type(self.patcher.model).__module__}.{type(self.patcher.model).__qualname__}"
        diffusion_model = self.patcher.model.diffusion_model
        record.update({"load_s": round(time.perf_counter() - loaded, 1),
                       "model_class": type(self.patcher.model).__name__,
                       "diffusion_model_class": f"{type(diffusion_model).__module__}.{type(diffusion_model).__name__}",
                       "parameters": sum(p.numel() for p in diffusion_model.parameters()),
                       "weight_dtype": weight_dtype_of(diffusion_model),
                       "training_mode_after_load": diffusion_model.training,
                       "linear_class": linear_class_of(diffusion_model)})
        self.setup.append(record)
        print(f"loaded {spec.key} {weights}{' --fast fp8_matrix_mult' if fast else ''} "
              f"in {record['load_s']} s", flush=True)
        self.loaded = wanted
        return self.patcher

    def naming(self, spec: ModelSpec):
        """Where the model is named: the tree's detection, bridged for Qwen-Image 2.1 where it predates it."""
        if spec.family == "qwen_image21":
            return qwen_image21_bridge(spec, self.options.tiny)
        return contextlib.nullcontext({})

    def unload(self):
        import comfy.model_management
        if self.patcher is None:
            return
        comfy.model_management.unload_all_models()
        self.patcher = None
        self.loaded = None
        free_memory()


# --------------------------------------------------------------------------------------- the checkpoint command
def add_arguments(parser) -> None:
    parser.add_argument("--comfyui", type=Path, required=True,
                        help="a ComfyUI checkout (its model classes name the keys)")
    parser.add_argument("--model", choices=(*MODELS, VAE_KEY), default="flux-dev",
                        help=f"a diffusion model, or {VAE_KEY}: Flux's VAE (BFL's ae.safetensors keys; --tiny "
                             "does not apply)")
    parser.add_argument("--dir", type=Path, required=True, help="where the file is written (or found)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true", help="the shrunk model (CPU smoke tests)")


def run(options, parser) -> int:
    # the model is only built on the meta device to name the weights: ComfyUI is imported as for the CPU (no
    # comfy-aimdo, no CUDA allocator set-up); the random numbers are drawn on the GPU where there is one
    comfy_release.import_comfyui(options.comfyui.resolve(), "cpu", "native")
    import torch
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if options.model == VAE_KEY:
        path, seconds, recognised = ensure_flux_vae(options.dir, options.seed, device)
        print("CHECKPOINT " + json.dumps({"path": str(path), "write_s": round(seconds, 1), "drawn_on": device,
                                          "comfy_sd_vae": recognised}))
        return 0
    path, seconds = ensure_checkpoint(options.dir, MODELS[options.model], options.tiny, options.seed, device)
    print("CHECKPOINT " + json.dumps({"path": str(path), "write_s": round(seconds, 1), "drawn_on": device}))
    return 0
