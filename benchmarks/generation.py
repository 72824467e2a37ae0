"""Whole-generation benchmark: what a ComfyUI user gets from the fused_dit overlays, through ComfyUI's own code.

Given a ComfyUI checkout (--comfyui DIR), it starts that release the way its main.py does
(comfy_release.py: cuda_malloc, and DynamicVRAM with comfy-aimdo and ModelPatcherDynamic where the
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
    overlay_attention_fp8  the node with its attention family alone in its fp8 mode (attention_mode "fp8")
    overlay_all_fp8_attn  overlay_all_fp8 with attention_mode "fp8": FP8 Linears and FP8 attention
    overlay_all_fp8_attn_compile  overlay_all_fp8_attn, then TorchCompileModel (issue 28: the fp8 mode under Dynamo)
    overlay_all_compile  overlay_all, then TorchCompileModel (the attention family steps aside while Dynamo
                     traces: the compiled graph keeps the release's SDPA order)
    node_defaults    the node as a user drops it in: every input at its INPUT_TYPES default (what runs then is the
                     registry's choice for this release: its overlay_log says which families ran)
    comfy_sage       what `--use-sage-attention` selects: ComfyUI's attention_sage bound as optimized_attention in
                     every loaded comfy module for the run (the flag binds it so at import); needs sageattention
    tiled            issue 50's refinement: the pack's TiledSampling node at the model's tile in the pack's table
                     (overlays/fused_dit/models.json tiling.tile_px; overlap, batch and canvas as the node plans
                     them); tiled_CONFIG puts it on the MODEL CONFIG builds (e.g. tiled_overlay_all_fp8), any
                     config but the compile ones. Tiled configs run at the model's tiled canvases only (4096x4096 and
                     8192x8192; Wan: stills, one frame), after a stock run at the tile's size; each records the
                     node's tiles and batch (from its log line) and s_per_tile_step, and the report's
                     tiled_summary holds each against that stock step and the 4096 canvas's memory
A family the node does not offer is recorded in the run (families_absent); a config none of whose families
exists is recorded as skipped, not run.
A run spec is CONFIG[@WEIGHTS][:eval], e.g. `overlay_fp8@fp8_e4m3fn` (the node's FP8 on ComfyUI's fp8 weights) or
`comfy_fp8_fast:eval`.

Models (--models): flux-dev (1024x1024, 2048x2048, and 4096x4096 when --resolutions names it; T5 256 tokens + CLIP
pooled, guidance 3.5), wan2.1-t2v-14b (480x832, 33 frames, and 81 frames when --resolutions names 480x832x81; umT5
512 tokens) and qwen-image (1024x1024, and 2048x2048 when --resolutions names it; 115 Qwen2.5-VL tokens, no
pooled vector, no guidance; the 16-channel EmptySD3LatentImage latent with the frame axis ComfyUI adds for its Wan21 latent format).
Issue 50's models, run only when --models names them: flux2-dev (FLUX.2 [dev], 32B, its checkpoint's matrices stored
in float8_e4m3fn; 1024x1024, 2048x2048; 128 latent channels at 1/16, 512 Mistral 3 tokens 15360 wide, guidance
3.5), z-image (Z-Image-Turbo on NextDiT; 1024x1024, 2048x2048; 512 Qwen3 4B tokens 2560 wide) and wan2.2-t2v-14b
(one Wan 2.2 A14B expert: Wan 2.1 T2V 14B's shape, loaded as WAN21; 480x832, 81 frames).
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

Examples (from the repository root):
    python -m benchmarks generation --comfyui DIR --tiny --out /tmp/generation-tiny.json        # CPU smoke test
    python -m benchmarks generation --comfyui DIR --models flux-dev --work-dir /tmp/gen --save-checkpoint \\
        --configs stock,overlay,overlay_fp8,overlay_all_fp8,comfy_fp8_fast --out /tmp/gen-flux.json
    python -m benchmarks generation --combine A.json B.json --out benchmarks/results/generation-0.33.0.json
One current file per ComfyUI release: benchmarks/results/generation-<release>.json (combine keys every run by its
comfyui_version, so each speedup is against its own release's stock).
On the device machine: scripts/generation_for_device.sh (benchmarks/README.md).
"""
from __future__ import annotations

if __name__ == "__main__" and not __package__:   # the command line of earlier results
    raise SystemExit("run it as `python -m benchmarks generation ...` from the repository root")

import dataclasses
import json
import logging
import statistics
import time
import traceback
from pathlib import Path

from . import generation_configs, results
from .comfy_release import STARTED, import_comfyui, main_backend, sdpa_backend_name
from .generation_configs import (COMPILE_CONFIGS, CONFIGS, FP8_WEIGHT_CONFIGS, TINY_TILE_PX, build_config, is_tiled,
                                 known_config, release_config, set_ops_under_compile, tiles_of, untiled)
from .models import (DEFAULT_MODELS, MODELS, SAMPLER, WEIGHTS_LOADED, Loader, ModelSpec, ModelUnavailable,
                     add_model_arguments, check_device, check_model_arguments, diffusion_model_class, free_memory,
                     inputs_for, resolution_name, resolutions_of, sample, synchronize)
from .models import import_paths  # noqa: F401  (the checkout and overlays/: the entry point asks this module)

REPO = Path(__file__).resolve().parent.parent
MODEL_TABLE = REPO / "overlays" / "fused_dit" / "models.json"
WEIGHTS = ("bf16", "fp8_e4m3fn")
NOTE = ("Weights are seeded random numbers, not trained ones: the figures are for speed, memory and which code "
        "ran (FP8 GEMM counts), never for image quality. rel_err_vs_stock compares output latents with the stock "
        "bf16 run of the same model, resolution and seed.")
# a run's model_mode: the mode the release's loader leaves the model in, or "eval" forced by a ":eval" run spec
# (earlier files said "train" for the first: 0.3.64 leaves its models in training mode)
AS_LOADED = "as loaded"


@dataclasses.dataclass(frozen=True)
class RunSpec:
    config: str
    weights: str
    eval_mode: bool

    @property
    def name(self) -> str:
        default = "fp8_e4m3fn" if untiled(self.config) in FP8_WEIGHT_CONFIGS else "bf16"
        return self.config + ("" if self.weights == default else f"@{self.weights}") + (":eval" if self.eval_mode else "")

    @property
    def load_key(self) -> tuple:
        """What the ModelPatcher is loaded as: (weights, --fast fp8_matrix_mult)."""
        return self.weights, untiled(self.config) == "comfy_fp8_fast"


def parse_run_spec(text: str) -> RunSpec:
    """CONFIG[@WEIGHTS][:eval] -> RunSpec; a clear ValueError for anything else."""
    body, _, mode = text.partition(":")
    if mode not in ("", "eval"):
        raise ValueError(f"run spec {text!r}: the only mode suffix is ':eval'")
    config, _, weights = body.partition("@")
    if not known_config(config):
        raise ValueError(f"run spec {text!r}: unknown config {config!r}; known: {', '.join(CONFIGS)}, and tiled or "
                         "tiled_CONFIG for any of them but the compile configs")
    weights = weights or ("fp8_e4m3fn" if untiled(config) in FP8_WEIGHT_CONFIGS else "bf16")
    if weights not in WEIGHTS:
        raise ValueError(f"run spec {text!r}: unknown weights {weights!r}; known: {', '.join(WEIGHTS)}")
    if untiled(config) in FP8_WEIGHT_CONFIGS and weights != "fp8_e4m3fn":
        raise ValueError(f"run spec {text!r}: {config} is ComfyUI's fp8 weight path; it has no {weights} form")
    return RunSpec(config, weights, mode == "eval")


# ----------------------------------------------------------------------------------------------- the session
class Session(Loader):
    """One process's models (models.Loader), stock references and results."""

    def __init__(self, options, device: str):
        super().__init__(options, device)
        self.references: dict = {}              # (model, resolution) -> stock output latent (CPU fp32)
        self.timings: dict = {}                 # (model, resolution) -> stock s_per_step

    # ---- one run
    def run(self, spec: ModelSpec, resolution: tuple, run: RunSpec) -> dict:
        import torch
        record = {"model": spec.key, "resolution": resolution_name(resolution), "weights": run.weights,
                  "config": run.config, "model_mode": "eval" if run.eval_mode else AS_LOADED, "run": run.name,
                  "weights_loaded": WEIGHTS_LOADED[self.options.load_outside_inference_mode],
                  "comfyui_version": STARTED.get("comfyui_version"), "vram_mode": STARTED.get("vram_mode"),
                  "date": results.now()}
        patched = None
        was_training = None
        captured = CapturedLog()
        try:
            diffusion_model_class(spec)   # ModelUnavailable where the release has no code for this model
            base = self.load(spec, run)
            record["model_patcher"] = type(base).__name__
            patched, details = build_config(run.config, base, tiling_for(spec, self.options.tiny)
                                            if is_tiled(run.config) else None)
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
            if is_tiled(run.config):
                record.update(tiled_record(spec, record, self.options.tiny))
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
                name = sdpa_backend_name(torch._fused_sdp_choice(
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
        return main_backend(self.counts)


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
    """The fused_dit logger's distinct messages during one run, DEBUG included (the node's per-shape attention
    choices and why FP8 declined are DEBUG lines since its log became one INFO line per model)."""

    LIMIT = 30

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []
        self.logger = logging.getLogger("fused_dit")
        self.previous_level = self.logger.level
        self.logger.addHandler(self)
        self.logger.setLevel(logging.DEBUG)

    def emit(self, record):
        message = record.getMessage()
        if message not in self.messages and len(self.messages) < self.LIMIT:
            self.messages.append(message)

    def close(self) -> list[str]:
        self.logger.removeHandler(self)
        self.logger.setLevel(self.previous_level)
        super().close()
        return self.messages


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


# ------------------------------------------------------------------------------------------------- reports
def model_mode(run: dict) -> str:
    """A run's model_mode, with earlier files' "train" read as AS_LOADED (what it meant: the loader's mode)."""
    mode = run.get("model_mode", AS_LOADED)
    return AS_LOADED if mode == "train" else mode


def is_reference(run: dict) -> bool:
    """The run every speedup of its model and resolution is taken against: stock, bf16, as loaded."""
    return run["config"] == "stock" and run["weights"] == "bf16" and model_mode(run) == AS_LOADED


def run_key(run: dict) -> tuple:
    """A run of another GPU is another run: an H100 call never replaces an H200 row of the same config."""
    return (run.get("comfyui_version"), run["model"], run["resolution"], run["weights"], run["config"],
            model_mode(run), run.get("weights_loaded", WEIGHTS_LOADED[False]), run.get("vram_mode"), run.get("gpu"))


def reference_group(run: dict) -> tuple:
    """What a run's speedup is taken against: the stock run of the same release, model, resolution, way of
    loading the weights, VRAM mode (DynamicVRAM and --disable-dynamic-vram are two different stocks) and GPU."""
    return (run.get("comfyui_version"), run["model"], run["resolution"],
            run.get("weights_loaded", WEIGHTS_LOADED[False]), run.get("vram_mode"), run.get("gpu"))


def combine(reports: list[dict]) -> dict:
    """One report from several calls' reports: later runs replace earlier ones with the same key. A run's speedup
    is against the stock run of its own call where that call has one (timings of two calls differ by more than
    some overlays gain), else against the newest stock of its group; `speedup_reference` says which. Runs of a
    report that is itself combined keep the speedup and reference they were given there."""
    combined = dict(reports[-1])
    runs: dict = {}          # run key -> (run, its own call's stock or None, keeps the speedup it has)
    for report in reports:
        environment = report.get("environment") or {}
        version = (environment.get("comfyui") or {}).get("comfyui_version")
        normalised = [{**run, "model_mode": model_mode(run)} for run in report["runs"]]
        for run in normalised:
            run.setdefault("comfyui_version", version)
            run.setdefault("gpu", environment.get("gpu"))
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
    combined["tiled_summary"] = tiled_summary(combined["runs"])
    # a report that is itself combined brings its own calls along
    combined["calls"] = [call for r in reports for call in (r.get("calls") or [
        {"environment": r.get("environment"), "settings": r.get("settings"), "setup": r.get("setup")}])]
    # what a maintainer wrote into any of them (notes, later calls of the same runs) is kept, never the last one's only
    for key in ("notes", "repeats"):
        kept = [item for r in reports for item in r.get(key) or []]
        if kept:
            combined[key] = list({json.dumps(item, sort_keys=True): item for item in kept}.values())
    return combined


def plan(options) -> list[tuple[ModelSpec, tuple, RunSpec]]:
    """(model, resolution, run) in an order that loads each model's weights once: by model, by what is loaded
    (bf16, fp8, fp8 with --fast), stock first within each. Tiled configs run at the model's tiled canvases only
    (the others never there), after a stock run at the model's tile size (added where the configs lack it)."""
    runs = [parse_run_spec(text) for text in options.configs]
    order = {key: index for index, key in enumerate(
        (("bf16", False), ("fp8_e4m3fn", False), ("fp8_e4m3fn", True)))}
    stock = parse_run_spec("stock")
    planned = []
    for model_key in options.models:
        spec = MODELS[model_key]
        canvases = tiled_resolutions_of(spec, options) if any(is_tiled(r.config) for r in runs) else []
        tile_stock = [(tile_resolution(spec, options.tiny, canvases[0]), stock)] if canvases else []
        for load_key in sorted({r.load_key for r in runs} | {r.load_key for _, r in tile_stock}, key=order.get):
            group = sorted((r for r in runs if r.load_key == load_key),
                           key=lambda r: (r.config != "stock", r.eval_mode, CONFIGS.index(untiled(r.config))))
            cases = [(resolution, run) for resolution in resolutions_of(spec, options) for run in group
                     if not is_tiled(run.config)]
            cases += [case for case in tile_stock if case[1].load_key == load_key and case not in cases]
            tiled = [(canvas, run) for canvas in canvases for run in group if is_tiled(run.config)]
            for resolution, run in cases + tiled:
                if options.skip and f"{model_key}/{resolution_name(resolution)}/{run.name}" in options.skip:
                    continue
                planned.append((spec, resolution, run))
    return planned


# ------------------------------------------------------------------------------- issue 50's tiled refinement
def table_tile_px(spec: ModelSpec) -> int:
    """The tile the pack's model table gives this model (read as JSON: nothing imports torch before ComfyUI)."""
    if not spec.table_key:
        raise ValueError(f"{spec.key} has no entry in the pack's model table: no tiled configs for it")
    return json.loads(MODEL_TABLE.read_text(encoding="utf-8"))[spec.table_key]["tiling"]["tile_px"]


def tiling_for(spec: ModelSpec, tiny: bool) -> dict:
    """generation_configs.tiled_sampling's arguments: the table's entry and tile (--tiny: the node's smallest)."""
    return {"table_key": spec.table_key, "tile_px": TINY_TILE_PX if tiny else table_tile_px(spec), "tiny": tiny}


def tiled_resolutions_of(spec: ModelSpec, options) -> list[tuple]:
    """The canvases the model's tiled configs run at (--tiny: its tiny ones), those named where --resolutions
    names any."""
    if not spec.table_key:
        raise ValueError(f"{spec.key} has no entry in the pack's model table: no tiled configs for it")
    canvases = spec.tiny_tiled_resolutions if options.tiny else spec.tiled_resolutions
    return [r for r in canvases if not options.resolutions or resolution_name(r) in options.resolutions]


def tile_resolution(spec: ModelSpec, tiny: bool, canvas: tuple) -> tuple:
    """The native run one tile of `canvas` stands for: the tile's square with the canvas's frames."""
    tile = tiling_for(spec, tiny)["tile_px"]
    return (tile, tile, *canvas[2:])


def tiled_record(spec: ModelSpec, record: dict, tiny: bool) -> dict:
    """A tiled run's plan (from the node's log line), its seconds per tile-step, and the runs it is held
    against: the tile-sized stock step and the same config at the model's first (smallest) tiled canvas."""
    found = tiles_of(record.get("overlay_log") or [])
    canvas = tuple(int(v) for v in record["resolution"].split("x"))
    canvases = spec.tiny_tiled_resolutions if tiny else spec.tiled_resolutions
    found.update({"tile_stock_resolution": resolution_name(tile_resolution(spec, tiny, canvas)),
                  "memory_reference_resolution": resolution_name(canvases[0])})
    if found.get("tiles") and record.get("s_per_step"):
        found["s_per_tile_step"] = round(record["s_per_step"] / found["tiles"], 4)
    return found


def ratio(numerator, denominator):
    return round(numerator / denominator, 3) if numerator and denominator else None


def tiled_summary(runs: list[dict]) -> list[dict]:
    """Issue 50's two tiled targets per tiled run: its seconds per tile-step over the stock step at the tile's size
    (of its own release, GPU and VRAM mode; at most 0.75), and its memory over the same run at the model's first
    tiled canvas (4096; within 10%), both torch's peak and the device's."""
    stock = {reference_group(r): r for r in runs if is_reference(r) and r.get("s_per_step")}
    done = {(reference_group(r), r.get("run")): r for r in runs if r.get("s_per_step")}
    rows = []
    for run in runs:
        if "tile_stock_resolution" not in run or not run.get("s_per_step"):
            continue
        native = stock.get(reference_group({**run, "resolution": run["tile_stock_resolution"]}))
        base = done.get((reference_group({**run, "resolution": run["memory_reference_resolution"]}), run["run"]))
        rows.append({"model": run["model"], "run": run["run"], "resolution": run["resolution"],
                     "gpu": run.get("gpu"), "tiles": run.get("tiles"), "tile_batch": run.get("tile_batch"),
                     "s_per_step": run["s_per_step"], "s_per_tile_step": run.get("s_per_tile_step"),
                     "tile_stock": native and {"resolution": native["resolution"], "s_per_step": native["s_per_step"]},
                     "tile_step_vs_tile_stock": ratio(run.get("s_per_tile_step"), native and native["s_per_step"]),
                     "memory_reference": base and base["resolution"],
                     "peak_vs_reference": ratio(run.get("peak_gib"), base and base.get("peak_gib")),
                     "device_used_vs_reference": ratio(run.get("device_used_peak_gib"),
                                                       base and base.get("device_used_peak_gib")),
                     "rel_err_vs_stock": run.get("rel_err_vs_stock")})
    return rows


def environment(device: str, comfyui: dict) -> dict:
    """The file's header (results.environment) with the ComfyUI started, fused_dit's version and the allocator."""
    import os
    import fused_dit
    env = results.environment(device)
    env.update({"device": device, "comfyui": comfyui, "fused_dit": fused_dit.__version__,
                "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")})
    return env


def add_arguments(parser) -> None:
    add_model_arguments(parser, models=",".join(DEFAULT_MODELS), steps=4, warmup_steps=2, comfyui_required=False)
    parser.add_argument("--configs", default=",".join(CONFIGS),
                        help="comma list of run specs CONFIG[@WEIGHTS][:eval]; configs: " + ", ".join(CONFIGS))
    parser.add_argument("--skip", default="", help="comma list of MODEL/RESOLUTION/RUN to leave out")
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
    parser.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                        help="start no run after this many seconds (the runs left are recorded as skipped), so a "
                             "call under a time limit ends with its JSON written")
    parser.add_argument("--combine", type=Path, nargs="+", help="merge these reports into --out and exit")
    parser.add_argument("--note", action="append", default=[], help="with --combine: a sentence added to the notes")


def run(options, parser) -> int:
    if options.combine:
        combined = combine([json.loads(path.read_text()) for path in options.combine])
        combined["notes"] = combined.get("notes", []) + options.note     # the files' notes, then the new ones
        results.write_json(combined, options.out)
        print(f"wrote {options.out}")
        return 0
    if options.comfyui is None:
        parser.error("--comfyui DIR is required (or --combine)")
    check_model_arguments(options, parser)
    options.configs = [c for c in options.configs.split(",") if c]
    options.skip = {s for s in options.skip.split(",") if s}
    try:
        planned = plan(options)
    except ValueError as error:
        parser.error(str(error))
    if options.save_checkpoint and not options.work_dir:
        parser.error("--save-checkpoint needs --work-dir")
    if options.work_dir:
        options.work_dir.mkdir(parents=True, exist_ok=True)

    began = time.perf_counter()
    comfyui = import_comfyui(options.comfyui.resolve(), options.device, options.allocator,
                             options.disable_dynamic_vram)
    check_device(options.device)
    report = {"benchmark": "generation", "script": "benchmarks/generation.py", "note": NOTE,
              "environment": environment(options.device, comfyui),
              "settings": {"steps": options.steps, "warmup_steps": options.warmup_steps, "seed": options.seed,
                           "tiny": options.tiny, **SAMPLER, "allocator": options.allocator,
                           "disable_dynamic_vram": options.disable_dynamic_vram,
                           "fp8_linear_calls": f"per sampling step, counted by {options.count}",
                           "weights_loaded": WEIGHTS_LOADED[options.load_outside_inference_mode],
                           "loader": "file" if options.save_checkpoint else "state_dict",
                           "s_per_step": "median of the timed call's steps after its first"},
              "setup": [], "runs": []}
    session = Session(options, options.device)
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
        report["tiled_summary"] = tiled_summary(report["runs"])
        results.write_json(report, options.out)
        if "error" not in record and "skipped" not in record:
            print(f"  {record['s_per_step']} s/step, peak {record['peak_gib']} GiB, "
                  f"fp8 calls {record['fp8_linear_calls']}, rel err {record['rel_err_vs_stock']}, "
                  f"speedup {record['speedup_vs_stock']}", flush=True)
    session.unload()
    print(f"wrote {options.out}")
    return 0
