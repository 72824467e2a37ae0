#!/usr/bin/env python3
"""Whole-generation benchmark: what a ComfyUI user gets from the fused_dit overlays, through ComfyUI's own code.

Given a ComfyUI checkout (--comfyui DIR), it starts that release the way its main.py does
(benchmarks/comfy_release.py: cuda_malloc, and DynamicVRAM with comfy-aimdo and ModelPatcherDynamic where the
release has it, unless --disable-dynamic-vram), builds seeded random weights for Flux-dev (12B), Wan 2.1 T2V 14B and
Qwen-Image (20B) at full size with that release's own model classes, in the key format of the released checkpoint
files, loads them the way UNETLoader does (comfy.sd.load_diffusion_model from a safetensors file with
--save-checkpoint, else comfy.sd.load_diffusion_model_state_dict; model_options {"dtype": torch.float8_e4m3fn} for fp8
weights), and samples with comfy.sample.sample (KSampler's call: euler, simple, cfg 1.0, so one model forward per
step) under torch.inference_mode(), as ComfyUI's executor runs a prompt. The model stays in the mode the release
leaves it in (0.3.64: training; since 0.3.65 BaseModel.__init__ calls .eval()); a run spec ending in ":eval" calls
.eval() and requires_grad_(False) first.

Configs (the MODEL a workflow hands to KSampler):
    stock            UNETLoader's model as loaded
    overlay          the pack's Fused DiT Ops node (norm_rope, adaln, gate), FP8 off
    overlay_fp8      the same node with fp8_linear on (fp8_weights "replace", the default: FP8 codes in the
                     Linears' place through ComfyUI's object patches)
    overlay_fp8_alongside  the same with fp8_weights "alongside" (codes beside the bf16 weights)
    comfy_fp8        UNETLoader weight_dtype fp8_e4m3fn (ComfyUI stores FP8, casts per layer)
    comfy_fp8_fast   the same with `--fast fp8_matrix_mult` (comfy.cli_args.args.fast set as the CLI would)
    compile          ComfyUI's TorchCompileModel node (comfy_api.torch_helpers.set_torch_compile_wrapper, inductor)
    overlay_compile  the Fused DiT Ops node, then TorchCompileModel
    overlay_compile_allops  the same with every fused op kept as a custom op under compile (by default the ops
                     that Inductor fuses as well itself are left to it: fused_dit.integration.compiled)
    overlay_attention  the node with its attention family alone (issue 21)
    overlay_all      the node with every exact family it offers (attention included where it has one), FP8 off
    overlay_all_fp8  the same with fp8_linear on (fp8_weights "replace")
    overlay_all_fp8_alongside  the same with fp8_weights "alongside" (under DynamicVRAM: the codes of resident
                     weights kept between calls instead of quantised per call)
    overlay_all_compile  overlay_all, then TorchCompileModel (the attention family steps aside while Dynamo
                     traces: the compiled graph keeps the release's SDPA order)
    comfy_sage       what `--use-sage-attention` selects: ComfyUI's attention_sage bound as optimized_attention in
                     every loaded comfy module for the run (the flag binds it so at import); needs sageattention
A family the node does not offer is recorded in the run (families_absent); a config none of whose families
exists is recorded as skipped, not run.
A run spec is CONFIG[@WEIGHTS][:eval], e.g. `overlay_fp8@fp8_e4m3fn` (the node's FP8 on ComfyUI's fp8 weights) or
`comfy_fp8_fast:eval`.

Models (--models): flux-dev (1024x1024, 2048x2048; T5 256 tokens + CLIP pooled, guidance 3.5), wan2.1-t2v-14b
(480x832, 33 frames; umT5 512 tokens) and qwen-image (1024x1024; 115 Qwen2.5-VL tokens, no pooled vector, no
guidance; the 16-channel EmptySD3LatentImage latent with the frame axis ComfyUI adds for its Wan21 latent format).
Qwen-Image's ComfyUI detection reads only in_channels and the depth from the weights (hidden 3072 = 24 x 128 and the
text width 3584 are the class's defaults), so its --tiny model only loses depth, as Flux's does. A release without
a model's code (comfy/ldm/qwen_image) records that model's runs as skipped, with the reason.

Per run: comfyui_version and vram_mode (dynamic / legacy); s_per_step (median of the timed call's steps after its
first, each closed by a CUDA synchronise in the sampler's callback, after a warm-up call), the first call's seconds
(compilation, FP8 quantisation), peak GPU memory of the timed call (torch's allocator; under DynamicVRAM
comfy-aimdo holds the weights outside it, so device_used_peak_gib, the device's memory in use sampled at every
step, is recorded too); from the warm-up call (compile configs and --count profiler: a separate one-step call) the
FP8 GEMMs per step (torch._scaled_mm and torch.nn.functional.scaled_mm calls) and the SDPA backend each torch
scaled_dot_product_attention call took (torch._fused_sdp_choice under the caller's backend priority); and the
output latent's relative error against stock bf16.
The weights are random: the figures are for speed, memory and which code ran, never image quality.

Each run is in its own try/except (its error is recorded), memory is freed between runs, and the JSON is written
after every run, so a call cut off by a time limit still leaves what it measured.

Examples:
    python benchmarks/generation.py --comfyui DIR --tiny --out /tmp/generation-tiny.json        # CPU smoke test
    python benchmarks/generation.py --comfyui DIR --models flux-dev --work-dir /tmp/gen --save-checkpoint \\
        --configs stock,overlay,overlay_fp8,overlay_all_fp8,comfy_fp8_fast --out /tmp/gen-flux.json
    python benchmarks/generation.py --combine A.json B.json --out benchmarks/results/generation-0.33.0.json
One current file per ComfyUI release: benchmarks/results/generation-<release>.json (combine keys every run by its
comfyui_version, so each speedup is against its own release's stock).
On the device machine: scripts/comfy_kitchen_for_device.sh --kit, then scripts/generation_for_device.sh.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import json
import logging
import math
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))   # results_io, comfy_release, also when imported from elsewhere
import comfy_release  # noqa: E402
import generation_configs  # noqa: E402
from generation_configs import (COMPILE_CONFIGS, CONFIGS, FP8_WEIGHT_CONFIGS, build_config,  # noqa: E402,F401
                                release_config, set_ops_under_compile)

WEIGHTS = ("bf16", "fp8_e4m3fn")
NOTE = ("Weights are seeded random numbers, not trained ones: the figures are for speed, memory and which code "
        "ran (FP8 GEMM counts), never for image quality. rel_err_vs_stock compares output latents with the stock "
        "bf16 run of the same model, resolution and seed.")
# how the weights were loaded: as ComfyUI does (UNETLoader and load_models_gpu inside torch.inference_mode(), so
# they are inference tensors), or outside it (--load-outside-inference-mode)
WEIGHTS_LOADED = {False: "in inference_mode (as ComfyUI)", True: "outside inference_mode (not as ComfyUI)"}
SAMPLER = {"sampler_name": "euler", "scheduler": "simple", "cfg": 1.0, "denoise": 1.0}
# a run's model_mode: the mode the release's loader leaves the model in, or "eval" forced by a ":eval" run spec
# (earlier files said "train" for the first: 0.3.64 leaves its models in training mode)
AS_LOADED = "as loaded"
# the ComfyUI this process imported and how it was started (import_comfyui): one per process, as in ComfyUI
STARTED: dict = {}


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
MODELS = {
    # ComfyUI's Flux detection fixes hidden 3072 / 24 heads, so the tiny Flux only loses depth
    "flux-dev": ModelSpec("flux-dev", "flux", FLUX_DEV, {**FLUX_DEV, "depth": 1, "depth_single_blocks": 1},
                          ((1024, 1024), (2048, 2048)), ((64, 64),), 256, 8, "Flux"),
    # Wan's detection reads dim (heads = dim // 128), ffn_dim and the depth from the weights
    "wan2.1-t2v-14b": ModelSpec("wan2.1-t2v-14b", "wan", WAN21_T2V_14B,
                                {**WAN21_T2V_14B, "dim": 256, "ffn_dim": 512, "num_heads": 2, "num_layers": 1},
                                ((480, 832, 33),), ((64, 64, 5),), 512, 8, "WAN21"),
    # Qwen-Image's detection reads in_channels and the depth only: the tiny Qwen-Image only loses depth
    "qwen-image": ModelSpec("qwen-image", "qwen_image", QWEN_IMAGE, {**QWEN_IMAGE, "num_layers": 1},
                            ((1024, 1024),), ((64, 64),), QWEN_IMAGE_TEXT_TOKENS, 8, "QwenImage"),
}


def resolution_name(resolution: tuple) -> str:
    return "x".join(str(v) for v in resolution)


@dataclasses.dataclass(frozen=True)
class RunSpec:
    config: str
    weights: str
    eval_mode: bool

    @property
    def name(self) -> str:
        default = "fp8_e4m3fn" if self.config in FP8_WEIGHT_CONFIGS else "bf16"
        return self.config + ("" if self.weights == default else f"@{self.weights}") + (":eval" if self.eval_mode else "")

    @property
    def load_key(self) -> tuple:
        """What the ModelPatcher is loaded as: (weights, --fast fp8_matrix_mult)."""
        return self.weights, self.config == "comfy_fp8_fast"


def parse_run_spec(text: str) -> RunSpec:
    """CONFIG[@WEIGHTS][:eval] -> RunSpec; a clear ValueError for anything else."""
    body, _, mode = text.partition(":")
    if mode not in ("", "eval"):
        raise ValueError(f"run spec {text!r}: the only mode suffix is ':eval'")
    config, _, weights = body.partition("@")
    if config not in CONFIGS:
        raise ValueError(f"run spec {text!r}: unknown config {config!r}; known: {', '.join(CONFIGS)}")
    weights = weights or ("fp8_e4m3fn" if config in FP8_WEIGHT_CONFIGS else "bf16")
    if weights not in WEIGHTS:
        raise ValueError(f"run spec {text!r}: unknown weights {weights!r}; known: {', '.join(WEIGHTS)}")
    if config in FP8_WEIGHT_CONFIGS and weights != "fp8_e4m3fn":
        raise ValueError(f"run spec {text!r}: {config} is ComfyUI's fp8 weight path; it has no {weights} form")
    return RunSpec(config, weights, mode == "eval")


# ---------------------------------------------------------------------------------------------- ComfyUI setup
def import_comfyui(checkout: Path, device: str, allocator: str, disable_dynamic_vram: bool = False) -> dict:
    """Put the checkout and the repo's overlays/ on sys.path and import ComfyUI the way its main.py starts it
    (comfy_release.start: cuda_malloc, comfy-aimdo and ModelPatcherDynamic where the release has them); returns
    the release as its files describe it and how it was started (comfyui_version, vram_mode, ...).

    Must run before torch is imported: main.py's cuda_malloc step sets PYTORCH_CUDA_ALLOC_CONF
    (backend:cudaMallocAsync on a supported GPU) and comfy-aimdo initialises before anything imports torch."""
    if not (checkout / "comfy" / "sd.py").exists():
        raise SystemExit(f"{checkout} is not a ComfyUI checkout (no comfy/sd.py)")
    sys.path[:0] = [str(checkout), str(REPO_ROOT / "overlays")]
    release = comfy_release.read_release(checkout)
    started = comfy_release.start(checkout, release, device, allocator, disable_dynamic_vram)
    import comfy.sample  # noqa: F401
    import comfy.sd  # noqa: F401
    STARTED.clear()
    STARTED.update({**release.as_dict(), **started, "sdpa_priority": sdpa_priority(),
                    "comfy_kitchen": comfy_kitchen()})
    return dict(STARTED)


def sdpa_priority() -> list[str] | None:
    """The SDPA backend order ComfyUI's comfy.ops sets around its attention calls on this machine (None: none)."""
    import comfy.ops
    priority = getattr(comfy.ops, "SDPA_BACKEND_PRIORITY", None)
    return None if priority is None else [getattr(b, "name", str(b)) for b in priority]


def comfy_kitchen() -> dict | None:
    """comfy-kitchen as this ComfyUI uses it (comfy.quant_ops.ck): version and the backends it lists."""
    quant_ops = sys.modules.get("comfy.quant_ops")
    ck = getattr(quant_ops, "ck", None) if quant_ops is not None else None
    if ck is None:
        return None
    try:
        from importlib.metadata import version
        ck_version = version("comfy-kitchen")
    except Exception:
        ck_version = getattr(ck, "__version__", None)
    try:
        backends = {str(name): {key: value for key, value in info.items() if key != "capabilities"}
                    if isinstance(info, dict) else str(info) for name, info in ck.list_backends().items()}
    except Exception as error:
        backends = {"error": f"{type(error).__name__}: {error}"}
    return {"version": ck_version, "backends": backends}


def environment(device: str, comfyui: dict) -> dict:
    import torch
    import fused_dit
    if device == "cuda":
        import results_io
        env = results_io.environment()
        env["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2 ** 30, 1)
    else:
        env = {"gpu": None, "torch": torch.__version__, "python": platform.python_version(),
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        try:
            import triton
            env["triton"] = triton.__version__
        except ImportError:
            env["triton"] = None
    env.update({"device": device, "comfyui": comfyui, "fused_dit": fused_dit.__version__,
                "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")})
    return env


# ------------------------------------------------------------------------------------------- random weights
class ModelUnavailable(Exception):
    """This ComfyUI release has no code for the model (its runs are recorded as skipped, with this reason)."""


def diffusion_model_class(spec: ModelSpec):
    if spec.family == "flux":
        from comfy.ldm.flux.model import Flux
        return Flux
    if spec.family == "qwen_image":
        try:
            from comfy.ldm.qwen_image.model import QwenImageTransformer2DModel
        except ModuleNotFoundError as error:
            if error.name not in ("comfy.ldm.qwen_image", "comfy.ldm.qwen_image.model"):
                raise
            raise ModelUnavailable(f"this ComfyUI release has no Qwen-Image model (no {error.name})") from None
        return QwenImageTransformer2DModel
    from comfy.ldm.wan.model import WanModel
    return WanModel


def constructor_arguments(spec: ModelSpec, tiny: bool) -> dict:
    """The arguments of this release's diffusion model class (Flux: txt_ids_dims where FluxParams has it)."""
    arguments = spec.tiny if tiny else spec.full
    if spec.family == "flux":
        from comfy.ldm.flux.model import FluxParams
        arguments = comfy_release.flux_arguments(arguments, {f.name for f in dataclasses.fields(FluxParams)})
    return arguments


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
    """Seeded random bf16 weights with the names and shapes of the release's checkpoint (checkpoint_shapes).

    Scales keep activations finite through the whole depth: matrices ~ N(0, 1/fan_in), norm scales near 1,
    biases and Wan's modulation tables small. Tensors are drawn on `device` and returned on the CPU."""
    import torch
    shapes = checkpoint_shapes(spec, tiny)
    state = {}
    for index, (name, shape) in enumerate(sorted(shapes.items())):
        generator = torch.Generator(device=device).manual_seed(seed * 100003 + index)
        noise = torch.randn(shape, generator=generator, device=device, dtype=torch.float32)
        leaf = name.rsplit(".", 1)[-1]
        if "modulation" in name:
            noise *= 0.1
        elif len(shape) >= 2:
            noise /= math.sqrt(math.prod(shape[1:]))
        elif leaf in ("scale", "weight"):
            noise = 1.0 + 0.1 * noise
        else:
            noise *= 0.05
        state[name] = noise.to(torch.bfloat16).cpu().contiguous()
        del noise
    return state


def checkpoint_path(directory: Path, spec: ModelSpec, tiny: bool, seed: int) -> Path:
    """The file's name carries a tag of its key format, so releases that spell keys alike share one file."""
    tag = comfy_release.key_format_tag(checkpoint_shapes(spec, tiny))
    return directory / f"{spec.key}{'-tiny' if tiny else ''}-random-seed{seed}-keys{tag}.safetensors"


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
    save_file(state, str(partial), metadata={"note": "seeded random weights (benchmarks/generation.py)"})
    del state
    partial.replace(path)
    # written back to disk before anything is timed: the kernel's write-back of tens of GB takes host CPU for a
    # minute after the write, and a host-bound step (DynamicVRAM) measured meanwhile ran 2x slower (Qwen-Image)
    os.sync()
    return path, time.perf_counter() - started


# ----------------------------------------------------------------------------------------------- the session
class Session:
    """One process's models, stock references and results."""

    def __init__(self, options, device: str):
        self.options = options
        self.device = device
        self.loaded: tuple | None = None        # (model key, load key)
        self.patcher = None
        self.state_cache: dict = {}             # model key -> CPU state dict, when there is no checkpoint dir
        self.references: dict = {}              # (model, resolution) -> stock output latent (CPU fp32)
        self.timings: dict = {}                 # (model, resolution) -> stock s_per_step
        self.setup: list[dict] = []             # checkpoint writes and loads, with seconds

    # ---- loading
    def model_options(self, weights: str) -> dict:
        import torch
        return {"dtype": torch.float8_e4m3fn} if weights == "fp8_e4m3fn" else {}

    def load(self, spec: ModelSpec, run: RunSpec):
        """The ModelPatcher UNETLoader would return for this run's weights (reused between runs)."""
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

    def _load(self, spec: ModelSpec, run: RunSpec, wanted: tuple):
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
            self.patcher = comfy.sd.load_diffusion_model(str(path), model_options=self.model_options(weights))
        else:
            if spec.key not in self.state_cache:
                self.state_cache[spec.key] = random_state_dict(spec, self.options.tiny, self.options.seed,
                                                               self.device)
            record.update({"loader": "comfy.sd.load_diffusion_model_state_dict",
                           "build_s": round(time.perf_counter() - started, 1)})
            loaded = time.perf_counter()
            # a shallow copy: ComfyUI pops the keys it loads out of the dict it is given
            self.patcher = comfy.sd.load_diffusion_model_state_dict(dict(self.state_cache[spec.key]),
                                                                    model_options=self.model_options(weights))
        if self.patcher is None:
            raise RuntimeError(f"ComfyUI did not recognise the {spec.key} weights")
        detected = type(self.patcher.model).__name__
        if spec.model_class and detected != spec.model_class:
            raise RuntimeError(f"ComfyUI detected the {spec.key} weights as {detected}, not {spec.model_class}")
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

    def unload(self):
        import comfy.model_management
        if self.patcher is None:
            return
        comfy.model_management.unload_all_models()
        self.patcher = None
        self.loaded = None
        free_memory()

    # ---- one run
    def run(self, spec: ModelSpec, resolution: tuple, run: RunSpec) -> dict:
        import torch
        record = {"model": spec.key, "resolution": resolution_name(resolution), "weights": run.weights,
                  "config": run.config, "model_mode": "eval" if run.eval_mode else AS_LOADED, "run": run.name,
                  "weights_loaded": WEIGHTS_LOADED[self.options.load_outside_inference_mode],
                  "comfyui_version": STARTED.get("comfyui_version"), "vram_mode": STARTED.get("vram_mode"),
                  "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        patched = None
        was_training = None
        captured = CapturedLog()
        try:
            diffusion_model_class(spec)   # ModelUnavailable where the release has no code for this model
            base = self.load(spec, run)
            record["model_patcher"] = type(base).__name__
            patched, details = build_config(run.config, base)
            record.update(details)
            diffusion_model = base.model.diffusion_model
            was_training = diffusion_model.training
            if run.eval_mode:   # what BaseModel.__init__ does since 0.3.65
                base.model.requires_grad_(False)
                base.model.eval()
            record["training_mode"] = diffusion_model.training
            latent, noise, positive = inputs_for(spec, resolution, self.options.tiny, self.options.seed)
            steps, warmup = self.options.steps, self.options.warmup_steps
            # eager configs are probed during the warm-up call (FP8 GEMMs and SDPA backends per step); a compiled
            # graph's calls never reach the Python functions the probes wrap, so compile configs get a separate
            # one-step call after the timed one, as --count profiler does
            # (only its last step: the attention family measures the SDPA backends in its first step, so with it on
            # the warm-up takes two steps)
            probe_warmup = self.options.count == "wrapper" and run.config not in COMPILE_CONFIGS
            if probe_warmup and (record.get("node_inputs") or {}).get("attention"):
                warmup = max(warmup, 2)
            with torch.inference_mode():
                started = time.perf_counter()
                gate = ProbeGate(open=warmup == 1)

                def opened(step, *_):
                    gate.open = gate.open or step == warmup - 2
                warm = lambda: sample(patched, noise, latent, positive, warmup, self.options.seed,  # noqa: E731
                                      callback=opened)
                if probe_warmup:
                    with SdpaProbe(gate) as sdpa:
                        record["fp8_linear_calls"] = count_scaled_mm(warm, gate)
                    record["sdpa_backends"] = sdpa.counts
                    record["sdpa_backend"] = sdpa.main_backend()
                    record["probed"] = "the warm-up call's last step"
                else:
                    warm()
                synchronize(self.device)
                record["first_call_s"] = round(time.perf_counter() - started, 3)
                record["first_call_steps"] = warmup
                reset_peak(self.device)
                record["gpu_allocated_before_gib"] = allocated_gib(self.device)
                marks: list[float] = []
                used: list = []

                def step_done(*_):
                    synchronize(self.device)
                    marks.append(time.perf_counter())
                    used.append(device_used_gib(self.device))
                started = time.perf_counter()
                out = sample(patched, noise, latent, positive, steps, self.options.seed, callback=step_done)
                synchronize(self.device)
                total = time.perf_counter() - started
                record["peak_gib"], record["peak_reserved_gib"] = peak_gib(self.device)
                record["device_used_after_gib"] = device_used_gib(self.device)
                record["device_used_peak_gib"] = max((u for u in used if u is not None), default=None)
                steps_s = [b - a for a, b in zip([started] + marks[:-1], marks)]
                record["step_times_s"] = [round(s, 4) for s in steps_s]
                record["steps"] = steps
                record["first_step_s"] = round(steps_s[0], 4) if steps_s else None
                later = steps_s[1:] or steps_s
                record["s_per_step"] = round(statistics.median(later), 4) if later else round(total / steps, 4)
                record["call_s"] = round(total, 3)
                one_step = lambda: sample(patched, noise, latent, positive, 1, self.options.seed)  # noqa: E731
                if self.options.count == "profiler":
                    with SdpaProbe() as sdpa:
                        calls = count_calls(one_step)
                    record["sdpa_backends"], record["sdpa_backend"] = sdpa.counts, sdpa.main_backend()
                    record["fp8_linear_calls"] = (calls.pop("aten::_scaled_mm", 0)
                                                  + calls.pop("aten::_scaled_mm_v2", 0))
                    record["custom_op_calls"] = calls
                    record["probed"] = "a separate one-step call (torch.profiler)"
                elif not probe_warmup:
                    record["fp8_linear_calls"] = count_scaled_mm(one_step)
                    record["probed"] = "a separate one-step call (SDPA backends not seen under compile)"
                record["fp8_linear_calls_counted_by"] = self.options.count
                if run.config in COMPILE_CONFIGS:
                    record["dynamo"] = dynamo_counters()
            out = out.float().cpu()
            record["output_finite"] = bool(torch.isfinite(out).all())
            record["output_rms"] = float(out.pow(2).mean().sqrt())
            self.compare_with_stock(spec, resolution, run, out, record)
        except (generation_configs.ConfigSkipped, ModelUnavailable) as reason:
            record["skipped"] = str(reason)
            print(f"  {run.name}: skipped ({reason})", flush=True)
        except Exception as error:   # one config's failure must not lose the others
            record["error"] = f"{type(error).__name__}: {error}"
            record["traceback"] = traceback.format_exc()[-4000:]
            print(f"  {run.name}: {record['error']}", flush=True)
        finally:
            record["overlay_log"] = captured.close()
            release_config(patched, self.patcher)
            if run.eval_mode and was_training and self.patcher is not None:
                self.patcher.model.train()
            del patched
            if run.config in COMPILE_CONFIGS:
                import torch._dynamo
                torch._dynamo.reset()
                set_ops_under_compile(None)
            free_memory()
        return record

    def compare_with_stock(self, spec, resolution, run, out, record):
        import torch
        key = (spec.key, resolution_name(resolution))
        reference_file = None
        if self.options.work_dir:
            reference_file = (self.options.work_dir /
                              f"stock-{STARTED.get('comfyui_version')}-{spec.key}{'-tiny' if self.options.tiny else ''}"
                              f"-{key[1]}-seed{self.options.seed}-steps{self.options.steps}.pt")
        if is_reference(record):
            self.references[key] = out
            self.timings[key] = record["s_per_step"]
            if reference_file is not None:
                torch.save({"latent": out, "s_per_step": record["s_per_step"]}, reference_file)
        elif key not in self.references and reference_file is not None and reference_file.exists():
            saved = torch.load(reference_file)
            self.references[key], self.timings[key] = saved["latent"], saved["s_per_step"]
        reference = self.references.get(key)
        if reference is None:
            record["rel_err_vs_stock"] = None
            record["bit_identical_to_stock"] = None
        else:
            record["rel_err_vs_stock"] = float((out - reference).norm() / reference.norm().clamp_min(1e-30))
            record["bit_identical_to_stock"] = bool(torch.equal(out, reference))
        stock = self.timings.get(key)
        record["speedup_vs_stock"] = round(stock / record["s_per_step"], 3) if stock else None


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


@dataclasses.dataclass
class ProbeGate:
    """Whether the probes count now (the sampler's callback opens it before the step to be counted)."""
    open: bool = True


class SdpaProbe:
    """Counts, per SDPA backend, the torch scaled_dot_product_attention calls made while it is open and its gate
    is: each call's backend is torch._fused_sdp_choice on the call's own inputs, inside whatever backend priority
    the caller (ComfyUI's comfy.ops) set around it, i.e. the backend that call runs. Calls that never reach torch's
    Python function (sage attention, a compiled graph) are not seen."""

    def __init__(self, gate: ProbeGate | None = None):
        self.gate = gate or ProbeGate()

    def __enter__(self):
        import torch
        self.counts: dict = {}
        self.functional = torch.nn.functional
        self.original = self.functional.scaled_dot_product_attention
        original = self.original

        def probed(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *args, **kwargs):
            if not self.gate.open:
                return original(query, key, value, attn_mask, dropout_p, is_causal, *args, **kwargs)
            name = "unknown"
            try:
                options = {k: kwargs[k] for k in ("scale", "enable_gqa") if k in kwargs}
                name = comfy_release.sdpa_backend_name(torch._fused_sdp_choice(
                    query, key, value, attn_mask, dropout_p, is_causal, **options))
            except Exception:   # the choice is a record; the call itself must run as it would
                pass
            self.counts[name] = self.counts.get(name, 0) + 1
            return original(query, key, value, attn_mask, dropout_p, is_causal, *args, **kwargs)
        self.functional.scaled_dot_product_attention = probed
        return self

    def __exit__(self, *exc):
        self.functional.scaled_dot_product_attention = self.original
        return False

    def main_backend(self) -> str | None:
        return comfy_release.main_backend(self.counts)


def count_scaled_mm(call, gate: ProbeGate | None = None) -> int:
    """FP8 GEMMs in one call, by wrapping the Python attributes they are called through: torch._scaled_mm
    (ComfyUI 0.3's fp8_linear, the overlay's FP8 linears) and torch.nn.functional.scaled_mm (torch >= 2.10's
    scaled-mm API, which comfy-kitchen's QuantizedTensor calls from ComfyUI 0.8 on); a call made inside another
    counted call counts once. A compiled graph's own extern calls are not seen: use --count profiler."""
    import torch
    owners = [(torch, "_scaled_mm")]
    if hasattr(torch.nn.functional, "scaled_mm"):
        owners.append((torch.nn.functional, "scaled_mm"))
    originals = [(owner, name, getattr(owner, name)) for owner, name in owners]
    calls = [0]
    depth = [0]

    def counting(original):
        def counted(*args, **kwargs):
            calls[0] += depth[0] == 0 and (gate is None or gate.open)
            depth[0] += 1
            try:
                return original(*args, **kwargs)
            finally:
                depth[0] -= 1
        return counted
    for owner, name, original in originals:
        setattr(owner, name, counting(original))
    try:
        call()
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)
    return calls[0]


def count_calls(call) -> dict:
    """aten::_scaled_mm and custom-op (namespace::name outside aten/prim) calls in one call, from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        call()
    counts = {}
    for event in profiler.key_averages():
        name = event.key
        if name in ("aten::_scaled_mm", "aten::_scaled_mm_v2") or (
                "::" in name and not name.startswith(("aten::", "prim::", "cuda", "c10d", "Torch-Compiled"))):
            counts[name] = counts.get(name, 0) + event.count
    return counts


def dynamo_counters() -> dict:
    """Graphs Dynamo compiled and graph breaks it took since the last reset (torch._dynamo.utils.counters)."""
    from torch._dynamo.utils import counters
    breaks = counters.get("graph_break", {})
    return {"unique_graphs": counters.get("stats", {}).get("unique_graphs", 0),
            "graph_breaks": sum(breaks.values()),
            "graph_break_reasons": sorted(breaks, key=breaks.get, reverse=True)[:8]}


class CapturedLog(logging.Handler):
    """The fused_dit logger's distinct messages during one run (which backend each op took, why FP8 declined)."""

    LIMIT = 30

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []
        self.logger = logging.getLogger("fused_dit")
        self.previous_level = self.logger.level
        self.logger.addHandler(self)
        self.logger.setLevel(logging.INFO)

    def emit(self, record):
        message = record.getMessage()
        if message not in self.messages and len(self.messages) < self.LIMIT:
            self.messages.append(message)

    def close(self) -> list[str]:
        self.logger.removeHandler(self)
        self.logger.setLevel(self.previous_level)
        super().close()
        return self.messages


def synchronize(device: str) -> None:
    if device == "cuda":
        import torch
        torch.cuda.synchronize()


def reset_peak(device: str) -> None:
    if device == "cuda":
        import torch
        torch.cuda.reset_peak_memory_stats()


def allocated_gib(device: str):
    if device != "cuda":
        return None
    import torch
    return round(torch.cuda.memory_allocated() / 2 ** 30, 2)


def peak_gib(device: str):
    if device != "cuda":
        return None, None
    import torch
    return (round(torch.cuda.max_memory_allocated() / 2 ** 30, 2),
            round(torch.cuda.max_memory_reserved() / 2 ** 30, 2))


def device_used_gib(device: str):
    """Memory in use on the whole device (cudaMemGetInfo), whatever the allocator reports."""
    if device != "cuda":
        return None
    import torch
    free, total = torch.cuda.mem_get_info()
    return round((total - free) / 2 ** 30, 2)


def free_memory() -> None:
    gc.collect()
    import torch
    if torch.cuda.is_available():
        import comfy.model_management
        comfy.model_management.soft_empty_cache()
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------------- reports
def model_mode(run: dict) -> str:
    """A run's model_mode, with earlier files' "train" read as AS_LOADED (what it meant: the loader's mode)."""
    mode = run.get("model_mode", AS_LOADED)
    return AS_LOADED if mode == "train" else mode


def is_reference(run: dict) -> bool:
    """The run every speedup of its model and resolution is taken against: stock, bf16, as loaded."""
    return run["config"] == "stock" and run["weights"] == "bf16" and model_mode(run) == AS_LOADED


def run_key(run: dict) -> tuple:
    return (run.get("comfyui_version"), run["model"], run["resolution"], run["weights"], run["config"],
            model_mode(run), run.get("weights_loaded", WEIGHTS_LOADED[False]), run.get("vram_mode"))


def reference_group(run: dict) -> tuple:
    """What a run's speedup is taken against: the stock run of the same release, model, resolution, way of
    loading the weights and VRAM mode (DynamicVRAM and --disable-dynamic-vram are two different stocks)."""
    return (run.get("comfyui_version"), run["model"], run["resolution"],
            run.get("weights_loaded", WEIGHTS_LOADED[False]), run.get("vram_mode"))


def combine(reports: list[dict]) -> dict:
    """One report from several calls' reports: later runs replace earlier ones with the same key. A run's speedup
    is against the stock run of its own call where that call has one (timings of two calls differ by more than
    some overlays gain), else against the newest stock of its group; `speedup_reference` says which. Runs of a
    report that is itself combined keep the speedup and reference they were given there."""
    combined = dict(reports[-1])
    runs: dict = {}          # run key -> (run, its own call's stock or None, keeps the speedup it has)
    for report in reports:
        version = ((report.get("environment") or {}).get("comfyui") or {}).get("comfyui_version")
        normalised = [{**run, "model_mode": model_mode(run)} for run in report["runs"]]
        for run in normalised:
            run.setdefault("comfyui_version", version)
        own_stock = {reference_group(r): r for r in normalised if is_reference(r) and r.get("s_per_step")}
        for run in normalised:
            kept = "calls" in report and (run.get("speedup_reference") or run.get("speedup_vs_stock") is not None)
            runs[run_key(run)] = (run, own_stock.get(reference_group(run)), kept)
    newest = {reference_group(r): r for r, _, _ in runs.values() if is_reference(r) and r.get("s_per_step")}
    for run, stock, kept in runs.values():
        if kept:
            continue
        if stock is not None:
            run["speedup_reference"] = f"stock of its own call ({stock['s_per_step']} s/step, {stock.get('date')})"
        else:
            stock = newest.get(reference_group(run))
            if stock is not None:
                run["speedup_reference"] = (f"newest stock of its group ({stock['s_per_step']} s/step, "
                                            f"{stock.get('date')})")
        reference = stock and stock.get("s_per_step")
        run["speedup_vs_stock"] = (round(reference / run["s_per_step"], 3)
                                   if reference and run.get("s_per_step") else None)
    combined["runs"] = [run for run, _, _ in runs.values()]
    # a report that is itself combined brings its own calls along
    combined["calls"] = [call for r in reports for call in (r.get("calls") or [
        {"environment": r.get("environment"), "settings": r.get("settings"), "setup": r.get("setup")}])]
    return combined


def write_report(report: dict, out: Path) -> None:
    """The JSON with this machine's folders as placeholders (results_io: REPO, TMP, HOME), replaced atomically."""
    import results_io
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(out.suffix + ".partial")
    partial.write_text(results_io.dumps(results_io.scrub(report)) + "\n")
    partial.replace(out)


def plan(options) -> list[tuple[ModelSpec, tuple, RunSpec]]:
    """(model, resolution, run) in an order that loads each model's weights once: by model, by what is loaded
    (bf16, fp8, fp8 with --fast), stock first within each."""
    runs = [parse_run_spec(text) for text in options.configs]
    order = {key: index for index, key in enumerate(
        (("bf16", False), ("fp8_e4m3fn", False), ("fp8_e4m3fn", True)))}
    planned = []
    for model_key in options.models:
        spec = MODELS[model_key]
        resolutions = spec.tiny_resolutions if options.tiny else spec.resolutions
        if options.resolutions:
            resolutions = [r for r in resolutions if resolution_name(r) in options.resolutions]
        for load_key in sorted({r.load_key for r in runs}, key=order.get):
            group = sorted((r for r in runs if r.load_key == load_key),
                           key=lambda r: (r.config != "stock", r.eval_mode, CONFIGS.index(r.config)))
            for resolution in resolutions:
                for run in group:
                    if options.skip and f"{model_key}/{resolution_name(resolution)}/{run.name}" in options.skip:
                        continue
                    planned.append((spec, resolution, run))
    return planned


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--comfyui", type=Path, help="a ComfyUI checkout (its comfy/ package is imported)")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma list of {', '.join(MODELS)}")
    parser.add_argument("--configs", default=",".join(CONFIGS),
                        help="comma list of run specs CONFIG[@WEIGHTS][:eval]; configs: " + ", ".join(CONFIGS))
    parser.add_argument("--resolutions", default="", help="comma list to keep, e.g. 1024x1024,480x832x33")
    parser.add_argument("--skip", default="", help="comma list of MODEL/RESOLUTION/RUN to leave out")
    parser.add_argument("--steps", type=int, default=4, help="timed sampling steps (default 4)")
    parser.add_argument("--warmup-steps", type=int, default=2, help="steps of the warm-up call (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true",
                        help="shrunk models and images for a CPU smoke test of the whole path")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--allocator", choices=("comfy", "native"), default="comfy",
                        help="comfy: import main.py's cuda_malloc (cudaMallocAsync where ComfyUI enables it)")
    parser.add_argument("--work-dir", type=Path,
                        help="keeps the stock latents (and with --save-checkpoint the weights) for later calls")
    parser.add_argument("--save-checkpoint", action="store_true",
                        help="write the random weights as safetensors in --work-dir and load them from the file "
                             "(comfy.sd.load_diffusion_model, UNETLoader's call); else from the state dict")
    parser.add_argument("--load-outside-inference-mode", action="store_true",
                        help="load the weights and move them to the GPU outside torch.inference_mode() (NOT as "
                             "ComfyUI does; recorded as weights_loaded in every run)")
    parser.add_argument("--count", choices=("wrapper", "profiler"), default="wrapper",
                        help="how FP8 GEMMs are counted in a separate one-step call: a wrapper around "
                             "torch._scaled_mm (default), or torch.profiler (also counts fused_dit custom ops and "
                             "compiled graphs' calls; on the H200 it was seen to slow later overlay runs)")
    parser.add_argument("--disable-dynamic-vram", action="store_true",
                        help="main.py's flag: the legacy ModelPatcher even where the release starts DynamicVRAM")
    parser.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                        help="start no run after this many seconds (the runs left are recorded as skipped), so a "
                             "call under a time limit ends with its JSON written")
    parser.add_argument("--out", type=Path, required=True, help="the JSON to write")
    parser.add_argument("--combine", type=Path, nargs="+", help="merge these reports into --out and exit")
    parser.add_argument("--note", action="append", default=[], help="with --combine: a sentence for the notes")
    options = parser.parse_args(argv)

    if options.combine:
        reports = [json.loads(path.read_text()) for path in options.combine]
        combined = combine(reports)
        combined["notes"] = options.note
        write_report(combined, options.out)
        print(f"wrote {options.out}")
        return 0
    if options.comfyui is None:
        parser.error("--comfyui DIR is required (or --combine)")
    options.models = [m for m in options.models.split(",") if m]
    unknown = [m for m in options.models if m not in MODELS]
    if unknown:
        parser.error(f"unknown models {unknown}; known: {', '.join(MODELS)}")
    options.configs = [c for c in options.configs.split(",") if c]
    options.resolutions = {r for r in options.resolutions.split(",") if r}
    options.skip = {s for s in options.skip.split(",") if s}
    try:
        planned = plan(options)
    except ValueError as error:
        parser.error(str(error))
    if options.save_checkpoint and not options.work_dir:
        parser.error("--save-checkpoint needs --work-dir")
    if options.work_dir:
        options.work_dir.mkdir(parents=True, exist_ok=True)
    if options.steps < 2:
        parser.error("--steps must be at least 2 (the first timed step is reported apart)")

    device = options.device
    if device == "auto":
        device = "cpu" if options.tiny or not Path("/dev/nvidia0").exists() else "cuda"
    began = time.perf_counter()
    comfyui = import_comfyui(options.comfyui.resolve(), device, options.allocator, options.disable_dynamic_vram)
    import torch
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda but torch sees no CUDA device")
    report = {"benchmark": "generation", "script": "benchmarks/generation.py", "note": NOTE,
              "environment": environment(device, comfyui),
              "settings": {"steps": options.steps, "warmup_steps": options.warmup_steps, "seed": options.seed,
                           "tiny": options.tiny, **SAMPLER, "allocator": options.allocator,
                           "disable_dynamic_vram": options.disable_dynamic_vram,
                           "fp8_linear_calls": f"per sampling step, counted by {options.count}",
                           "weights_loaded": WEIGHTS_LOADED[options.load_outside_inference_mode],
                           "loader": "file" if options.save_checkpoint else "state_dict",
                           "s_per_step": "median of the timed call's steps after its first"},
              "setup": [], "runs": []}
    session = Session(options, device)
    for spec, resolution, run in planned:
        print(f"{spec.key} {resolution_name(resolution)} {run.name} ...", flush=True)
        if options.time_budget is not None and time.perf_counter() - began > options.time_budget:
            record = {"model": spec.key, "resolution": resolution_name(resolution), "weights": run.weights,
                      "config": run.config, "model_mode": "eval" if run.eval_mode else AS_LOADED, "run": run.name,
                      "comfyui_version": comfyui.get("comfyui_version"), "vram_mode": comfyui.get("vram_mode"),
                      "skipped": f"--time-budget {options.time_budget:g} s spent before this run"}
        else:
            record = session.run(spec, resolution, run)
        report["runs"].append(record)
        report["setup"] = session.setup
        write_report(report, options.out)
        if "error" not in record and "skipped" not in record:
            print(f"  {record['s_per_step']} s/step, peak {record['peak_gib']} GiB, "
                  f"fp8 calls {record['fp8_linear_calls']}, rel err {record['rel_err_vs_stock']}, "
                  f"speedup {record['speedup_vs_stock']}", flush=True)
    session.unload()
    print(f"wrote {options.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
