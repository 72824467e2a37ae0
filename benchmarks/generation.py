#!/usr/bin/env python3
"""Whole-generation benchmark: what a ComfyUI user gets from the fused_dit overlays, through ComfyUI's own code.

Given a ComfyUI checkout (--comfyui DIR), it builds seeded random weights for Flux-dev (12B) and Wan 2.1 T2V 14B
at full size, loads them the way UNETLoader does (comfy.sd.load_diffusion_model from a safetensors file with
--save-checkpoint, else comfy.sd.load_diffusion_model_state_dict; model_options {"dtype": torch.float8_e4m3fn} for
fp8 weights), and samples with comfy.sample.sample (KSampler's call: euler, simple, cfg 1.0, so one model forward
per step) under torch.inference_mode(), as ComfyUI's executor runs a prompt. The model stays in training mode as
ComfyUI 0.3.64 leaves it; a run spec ending in ":eval" calls .eval() and requires_grad_(False) first, as newer
ComfyUI releases do in BaseModel.__init__.

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
A run spec is CONFIG[@WEIGHTS][:eval], e.g. `overlay_fp8@fp8_e4m3fn` (the node's FP8 on ComfyUI's fp8 weights) or
`comfy_fp8_fast:eval`.

Per run: s_per_step (median of the timed call's steps after its first, each closed by a CUDA synchronise in the
sampler's callback, after a warm-up call), the first call's seconds (compilation, FP8 quantisation), peak GPU
memory of the timed call, the number of torch._scaled_mm calls in one sampling step (torch.profiler, a separate
one-step call), the custom ops the profiler saw, and the output latent's relative error against stock bf16.
The weights are random: the figures are for speed, memory and which code ran, never image quality.

Each run is in its own try/except (its error is recorded), memory is freed between runs, and the JSON is written
after every run, so a call cut off by a time limit still leaves what it measured.

Examples:
    python benchmarks/generation.py --comfyui DIR --tiny --out /tmp/generation-tiny.json        # CPU smoke test
    python benchmarks/generation.py --comfyui DIR --models flux-dev --work-dir /tmp/gen --save-checkpoint \\
        --configs stock,overlay,overlay_fp8,comfy_fp8,comfy_fp8_fast --out benchmarks/results/generation.json
    python benchmarks/generation.py --combine A.json B.json --out benchmarks/results/generation.json
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
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))   # results_io, also when imported from elsewhere

CONFIGS = ("stock", "overlay", "overlay_fp8", "comfy_fp8", "comfy_fp8_fast", "compile", "overlay_compile",
           "overlay_fp8_alongside", "overlay_compile_allops")
COMPILE_CONFIGS = ("compile", "overlay_compile", "overlay_compile_allops")
WEIGHTS = ("bf16", "fp8_e4m3fn")
# configs that only exist on ComfyUI's fp8 weights
FP8_WEIGHT_CONFIGS = ("comfy_fp8", "comfy_fp8_fast")
NOTE = ("Weights are seeded random numbers, not trained ones: the figures are for speed, memory and which code "
        "ran (FP8 GEMM counts), never for image quality. rel_err_vs_stock compares output latents with the stock "
        "bf16 run of the same model, resolution and seed.")
# how the weights were loaded: as ComfyUI does (UNETLoader and load_models_gpu inside torch.inference_mode(), so
# they are inference tensors), or outside it (--load-outside-inference-mode)
WEIGHTS_LOADED = {False: "in inference_mode (as ComfyUI)", True: "outside inference_mode (not as ComfyUI)"}
SAMPLER = {"sampler_name": "euler", "scheduler": "simple", "cfg": 1.0, "denoise": 1.0}


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    key: str
    family: str            # "flux" | "wan"
    full: dict             # constructor arguments of ComfyUI's diffusion model class at full size
    tiny: dict             # the same, shrunk to what ComfyUI's model detection still recognises
    resolutions: tuple     # (height, width) or (height, width, frames)
    tiny_resolutions: tuple
    text_tokens: int       # T5 tokens for Flux (FluxTokenizer min_length), umT5 tokens for Wan
    tiny_text_tokens: int


FLUX_DEV = dict(in_channels=16, out_channels=16, vec_in_dim=768, context_in_dim=4096, hidden_size=3072,
                mlp_ratio=4.0, num_heads=24, depth=19, depth_single_blocks=38, axes_dim=[16, 56, 56], theta=10000,
                patch_size=2, qkv_bias=True, guidance_embed=True)
WAN21_T2V_14B = dict(model_type="t2v", patch_size=(1, 2, 2), text_len=512, in_dim=16, dim=5120, ffn_dim=13824,
                     freq_dim=256, text_dim=4096, out_dim=16, num_heads=40, num_layers=40, window_size=(-1, -1),
                     qk_norm=True, cross_attn_norm=True, eps=1e-6)
MODELS = {
    # ComfyUI's Flux detection fixes hidden 3072 / 24 heads, so the tiny Flux only loses depth
    "flux-dev": ModelSpec("flux-dev", "flux", FLUX_DEV, {**FLUX_DEV, "depth": 1, "depth_single_blocks": 1},
                          ((1024, 1024), (2048, 2048)), ((64, 64),), 256, 8),
    # Wan's detection reads dim (heads = dim // 128), ffn_dim and the depth from the weights
    "wan2.1-t2v-14b": ModelSpec("wan2.1-t2v-14b", "wan", WAN21_T2V_14B,
                                {**WAN21_T2V_14B, "dim": 256, "ffn_dim": 512, "num_heads": 2, "num_layers": 1},
                                ((480, 832, 33),), ((64, 64, 5),), 512, 8),
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
def import_comfyui(checkout: Path, device: str, allocator: str) -> dict:
    """Put the checkout and the repo's overlays/ on sys.path and import ComfyUI the way main.py starts it.

    Must run before torch is imported: main.py's cuda_malloc step sets PYTORCH_CUDA_ALLOC_CONF
    (backend:cudaMallocAsync on a supported GPU) before anything imports torch."""
    if not (checkout / "comfy" / "sd.py").exists():
        raise SystemExit(f"{checkout} is not a ComfyUI checkout (no comfy/sd.py)")
    sys.path[:0] = [str(checkout), str(REPO_ROOT / "overlays")]
    from comfy.cli_args import args
    args.cpu = device == "cpu"
    if allocator == "comfy" and device != "cpu":
        import cuda_malloc  # noqa: F401  (main.py's import: it sets the allocator through the environment)
    import torch  # noqa: F401
    import comfy.model_management  # noqa: F401
    import comfy.sample  # noqa: F401
    import comfy.sd  # noqa: F401
    return describe_checkout(checkout)


def describe_checkout(checkout: Path) -> dict:
    version = None
    version_file = checkout / "comfyui_version.py"
    if version_file.exists():
        for line in version_file.read_text().splitlines():
            if line.startswith("__version__"):
                version = line.split("=", 1)[1].strip().strip("\"'")
    revision = checkout / "REVISION"   # an exported tree carries "commit\ndate"
    commit, _, date = (revision.read_text().strip() + "\n").partition("\n") if revision.exists() else ("", "", "")
    return {"comfyui_version": version, "commit": commit or None, "commit_date": date.strip() or None}


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
def diffusion_model_class(spec: ModelSpec):
    if spec.family == "flux":
        from comfy.ldm.flux.model import Flux
        return Flux
    from comfy.ldm.wan.model import WanModel
    return WanModel


def random_state_dict(spec: ModelSpec, tiny: bool, seed: int, device: str) -> dict:
    """Seeded random bf16 weights with the names and shapes of ComfyUI's own model (built on the meta device).

    Scales keep activations finite through the whole depth: matrices ~ N(0, 1/fan_in), norm scales near 1,
    biases and Wan's modulation tables small. Tensors are drawn on `device` and returned on the CPU."""
    import torch
    import comfy.ops
    arguments = spec.tiny if tiny else spec.full
    with torch.device("meta"):
        model = diffusion_model_class(spec)(**arguments, operations=comfy.ops.disable_weight_init, device="meta",
                                            dtype=torch.bfloat16)
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    del model
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
    return directory / f"{spec.key}{'-tiny' if tiny else ''}-random-seed{seed}.safetensors"


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
                  "config": run.config, "model_mode": "eval" if run.eval_mode else "train", "run": run.name,
                  "weights_loaded": WEIGHTS_LOADED[self.options.load_outside_inference_mode]}
        patched = None
        captured = CapturedLog()
        try:
            base = self.load(spec, run)
            patched, details = build_config(run.config, base)
            record.update(details)
            diffusion_model = base.model.diffusion_model
            if run.eval_mode:   # newer ComfyUI's BaseModel.__init__
                base.model.requires_grad_(False)
                base.model.eval()
            record["training_mode"] = diffusion_model.training
            latent, noise, positive = inputs_for(spec, resolution, self.options.tiny, self.options.seed)
            steps, warmup = self.options.steps, self.options.warmup_steps
            with torch.inference_mode():
                started = time.perf_counter()
                sample(patched, noise, latent, positive, warmup, self.options.seed)
                synchronize(self.device)
                record["first_call_s"] = round(time.perf_counter() - started, 3)
                record["first_call_steps"] = warmup
                reset_peak(self.device)
                record["gpu_allocated_before_gib"] = allocated_gib(self.device)
                marks: list[float] = []
                started = time.perf_counter()
                out = sample(patched, noise, latent, positive, steps, self.options.seed,
                             callback=lambda *_: (synchronize(self.device), marks.append(time.perf_counter())))
                synchronize(self.device)
                total = time.perf_counter() - started
                record["peak_gib"], record["peak_reserved_gib"] = peak_gib(self.device)
                record["device_used_after_gib"] = device_used_gib(self.device)
                steps_s = [b - a for a, b in zip([started] + marks[:-1], marks)]
                record["step_times_s"] = [round(s, 4) for s in steps_s]
                record["steps"] = steps
                record["first_step_s"] = round(steps_s[0], 4) if steps_s else None
                later = steps_s[1:] or steps_s
                record["s_per_step"] = round(statistics.median(later), 4) if later else round(total / steps, 4)
                record["call_s"] = round(total, 3)
                one_step = lambda: sample(patched, noise, latent, positive, 1, self.options.seed)  # noqa: E731
                if self.options.count == "profiler":
                    calls = count_calls(one_step)
                    record["fp8_linear_calls"] = calls.pop("aten::_scaled_mm", 0)
                    record["custom_op_calls"] = calls
                else:
                    record["fp8_linear_calls"] = count_scaled_mm(one_step)
                record["fp8_linear_calls_counted_by"] = self.options.count
                if run.config in COMPILE_CONFIGS:
                    record["dynamo"] = dynamo_counters()
            out = out.float().cpu()
            record["output_finite"] = bool(torch.isfinite(out).all())
            record["output_rms"] = float(out.pow(2).mean().sqrt())
            self.compare_with_stock(spec, resolution, run, out, record)
        except Exception as error:   # one config's failure must not lose the others
            record["error"] = f"{type(error).__name__}: {error}"
            record["traceback"] = traceback.format_exc()[-4000:]
            print(f"  {run.name}: {record['error']}", flush=True)
        finally:
            record["overlay_log"] = captured.close()
            if patched is not None:
                release_config(patched, self.patcher)
            if run.eval_mode and self.patcher is not None:
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
                              f"stock-{spec.key}{'-tiny' if self.options.tiny else ''}-{key[1]}-"
                              f"seed{self.options.seed}-steps{self.options.steps}.pt")
        if run.config == "stock" and run.weights == "bf16" and not run.eval_mode:
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


def build_config(config: str, base):
    """The MODEL this config hands to KSampler, built with the nodes' own calls; and what was set."""
    if config in ("stock", "comfy_fp8", "comfy_fp8_fast"):
        return base, {}
    details = {}
    patched = base
    if config.startswith("overlay"):
        from comfyui_fused_dit import FusedDiTOps
        node = FusedDiTOps()
        inputs = {name: True for name in ("norm_rope", "adaln", "gate")}
        inputs["fp8_linear"] = config.startswith("overlay_fp8")
        if inputs["fp8_linear"]:
            inputs["fp8_weights"] = "alongside" if config == "overlay_fp8_alongside" else "replace"
        started = time.perf_counter()
        (patched,) = node.patch(patched, **inputs)
        details["node_inputs"] = inputs
        details["node_s"] = round(time.perf_counter() - started, 2)
        details["object_patches"] = len(getattr(patched, "object_patches", {}))
    if config == "overlay_compile_allops":
        details["ops_under_compile"] = set_ops_under_compile(("norm_rope", "adaln", "gate"))
    elif config == "overlay_compile":
        details["ops_under_compile"] = set_ops_under_compile(None)
    if config in COMPILE_CONFIGS:
        from comfy_api.torch_helpers import set_torch_compile_wrapper
        patched = patched.clone()   # TorchCompileModel.execute: m = model.clone(); set_torch_compile_wrapper(m, ...)
        set_torch_compile_wrapper(model=patched, backend="inductor")
        details["compile"] = {"backend": "inductor", "keys": ["diffusion_model"]}
    return patched, details


def set_ops_under_compile(families) -> list[str] | None:
    """Set which fused ops stay custom ops while Dynamo traces (None: the package's default); returns the set now
    in force, or None where this fused_dit has no such policy."""
    try:
        from fused_dit.integration import compiled
    except ImportError:
        return None
    compiled.UNDER_COMPILE = compiled.DEFAULT_UNDER_COMPILE if families is None else frozenset(families)
    return sorted(compiled.UNDER_COMPILE)


def release_config(patched, base) -> None:
    """Drop what a config left on the model: the overlay's forwards and FP8 copies (fused_dit.disable)."""
    if base is None:
        return
    try:
        import fused_dit
        fused_dit.disable(base.model.diffusion_model, drop_fp8_weights=True)
    except Exception as error:   # the record already holds the run; a failed cleanup is logged, not fatal
        logging.getLogger(__name__).warning("fused_dit.disable failed: %s", error)


def inputs_for(spec: ModelSpec, resolution: tuple, tiny: bool, seed: int):
    """Empty latent (EmptySD3LatentImage / EmptyHunyuanLatentVideo shapes), KSampler's noise, and random text
    conditioning of the encoders' shapes (Flux: T5 tokens + CLIP pooled + guidance 3.5; Wan: umT5 tokens)."""
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


def count_scaled_mm(call) -> int:
    """torch._scaled_mm calls in one call, by wrapping the Python attribute ComfyUI's fp8_linear and the overlay's
    FP8 linears call through (a compiled graph's own extern _scaled_mm calls are not seen: use --count profiler)."""
    import torch
    original = torch._scaled_mm
    calls = [0]

    def counted(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)
    torch._scaled_mm = counted
    try:
        call()
    finally:
        torch._scaled_mm = original
    return calls[0]


def count_calls(call) -> dict:
    """aten::_scaled_mm and custom-op (namespace::name outside aten/prim) calls in one call, from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        call()
    counts = {}
    for event in profiler.key_averages():
        name = event.key
        if name == "aten::_scaled_mm" or ("::" in name and not name.startswith(("aten::", "prim::", "cuda", "c10d"))
                                          and not name.startswith("Torch-Compiled")):
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
def run_key(run: dict) -> tuple:
    return (run["model"], run["resolution"], run["weights"], run["config"], run.get("model_mode", "train"),
            run.get("weights_loaded", WEIGHTS_LOADED[False]))


def combine(reports: list[dict]) -> dict:
    """One report from several calls' reports: later runs replace earlier ones with the same key; speedups are
    recomputed against the stock run of the same model, resolution and way of loading the weights."""
    combined = dict(reports[-1])
    runs: dict = {}
    for report in reports:
        for run in report["runs"]:
            runs[run_key(run)] = run
    combined["runs"] = list(runs.values())
    # a report that is itself combined brings its own calls along
    combined["calls"] = [call for r in reports for call in (r.get("calls") or [
        {"environment": r.get("environment"), "settings": r.get("settings"), "setup": r.get("setup")}])]
    loaded = lambda r: r.get("weights_loaded", WEIGHTS_LOADED[False])  # noqa: E731
    stock = {(r["model"], r["resolution"], loaded(r)): r.get("s_per_step") for r in combined["runs"]
             if r["config"] == "stock" and r["weights"] == "bf16" and r.get("model_mode", "train") == "train"}
    for run in combined["runs"]:
        reference = stock.get((run["model"], run["resolution"], loaded(run)))
        run["speedup_vs_stock"] = (round(reference / run["s_per_step"], 3)
                                   if reference and run.get("s_per_step") else None)
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
    comfyui = import_comfyui(options.comfyui.resolve(), device, options.allocator)
    import torch
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda but torch sees no CUDA device")
    report = {"benchmark": "generation", "script": "benchmarks/generation.py", "note": NOTE,
              "environment": environment(device, comfyui),
              "settings": {"steps": options.steps, "warmup_steps": options.warmup_steps, "seed": options.seed,
                           "tiny": options.tiny, **SAMPLER, "allocator": options.allocator,
                           "fp8_linear_calls": f"per sampling step, counted by {options.count}",
                           "weights_loaded": WEIGHTS_LOADED[options.load_outside_inference_mode],
                           "loader": "file" if options.save_checkpoint else "state_dict",
                           "s_per_step": "median of the timed call's steps after its first"},
              "setup": [], "runs": []}
    session = Session(options, device)
    for spec, resolution, run in planned:
        print(f"{spec.key} {resolution_name(resolution)} {run.name} ...", flush=True)
        record = session.run(spec, resolution, run)
        report["runs"].append(record)
        report["setup"] = session.setup
        write_report(report, options.out)
        if "error" not in record:
            print(f"  {record['s_per_step']} s/step, peak {record['peak_gib']} GiB, "
                  f"fp8 calls {record['fp8_linear_calls']}, rel err {record['rel_err_vs_stock']}, "
                  f"speedup {record['speedup_vs_stock']}", flush=True)
    session.unload()
    print(f"wrote {options.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
