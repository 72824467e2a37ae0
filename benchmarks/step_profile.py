"""Where one sampling step's GPU time goes (GEMM, FP8 GEMM, attention, fused_dit kernels, other), and the ceiling
that overlays which leave GEMMs and attention alone can reach.

It reuses generation.py: the same random-weight Flux-dev (and Wan 2.1 T2V 14B) at full size,
loaded by ComfyUI's own loader inside torch.inference_mode() and left in the mode the release leaves it in (0.3.64:
training; later: eval), started as the release's main.py starts it (DynamicVRAM where it has it, unless
--disable-dynamic-vram), the same configs (generation.py's, compile configs aside, built with the nodes' calls) and
the same comfy.sample.sample call (euler, cfg 1.0: one model forward per step).

Per model and config (built once, so FP8 copies are quantised once), two passes over the resolutions (every
resolution is timed before any is profiled, since the profiler was seen to slow later runs on the H200):
1. timing: a warm-up call, then a call of --steps steps closed by a CUDA synchronise in the sampler's callback;
   s_per_step is the median of its steps after the first, without the profiler;
2. profile: a call of 3 steps under torch.profiler (CPU + CUDA activities) whose schedule records only the third
   step (the profiler's step() is called from the sampler's callback, after a synchronise): the device time of every
   kernel of that step is summed by category (categorise()), with the step's wall time under the profiler and the
   idle gap (that wall minus the summed kernel time: launch gaps and host work, inflated by the profiler).

The ceilings, per model and resolution (stock's figures; "free" means taking zero time):
    ceiling_if_all_non_gemm_non_attention_work_were_free = stock s_per_step / (stock gemm + fp8 gemm + attention
        kernel time): every other kernel AND every idle gap gone; an upper bound for any overlay that leaves GEMMs
        and attention as they are.
    ceiling_if_other_kernels_were_free_idle_kept = stock s_per_step / (stock s_per_step - stock "other" kernel time):
        the same, but the host/launch gaps of the unprofiled step stay.
    overlay_share_left = (overlay's "other" + fused_dit kernel time) / stock's "other" kernel time: what of the
        non-GEMM, non-attention work the overlay config still spends.
The weights are random: the figures are for speed only, never image quality.

Examples:
    python -m benchmarks step-profile --comfyui DIR --tiny --out /tmp/step-profile-tiny.json     # CPU smoke test
    python -m benchmarks step-profile --comfyui DIR --models flux-dev,wan2.1-t2v-14b \\
        --out benchmarks/results/step-profile-0.3.64.json
    python -m benchmarks step-profile --comfyui DIR --models flux-dev --resolutions 1024x1024 --host-profile \\
        --configs stock,overlay_all,overlay_all_fp8_alongside --out benchmarks/results/step-profile-0.33.0.json
One current file per ComfyUI release: benchmarks/results/step-profile-<release>.json.
"""
from __future__ import annotations

import re
import statistics
import time
import traceback
from pathlib import Path

from . import generation, generation_configs, results
from .comfy_release import import_comfyui
from .models import (MODELS, SAMPLER, WEIGHTS_LOADED, add_model_arguments, check_device, check_model_arguments,
                     free_memory, inputs_for, resolution_name, resolutions_of, sample, synchronize)
from .models import import_paths  # noqa: F401  (the checkout and overlays/: the entry point asks this module)

REPO = Path(__file__).resolve().parent.parent
CATEGORIES = ("gemm", "fp8_gemm", "attention", "fused_dit", "other")

# generation.py's configs but the compiled ones (the profiler's step would include recompiles)
CONFIGS = tuple(c for c in generation_configs.CONFIGS if c not in generation_configs.COMPILE_CONFIGS)
TOP = 15
PROFILED_STEPS = 3          # the schedule: step 1 waits (sampler setup), step 2 warms the profiler, step 3 is kept
NOTE = ("Weights are seeded random numbers, not trained ones: the figures are for speed only, never image quality. "
        "Kernel times come from one sampling step under torch.profiler (CUDA activity); s_per_step is measured "
        "apart, without the profiler.")
DEFINITIONS = {
    "kernel_ms": "device time of the step's kernels, summed per category (categorise() in the script)",
    "gemm": "bf16/fp32 GEMM kernels (cuBLAS nvjet/cublas, CUTLASS, sm90 xmma/wgmma gemm names), not FP8",
    "fp8_gemm": "kernels launched under aten::_scaled_mm, or GEMM names with an FP8 mark (nvjet *_qq*, e4m3, fp8)",
    "attention": "flash / fmha / cuDNN SDPA / memory-efficient attention kernels",
    "fused_dit": "the overlay's own Triton kernels (the @triton.jit names of overlays/fused_dit/ops/*.py)",
    "other": "everything else: elementwise, norms, RoPE, copies, casts, reductions",
    "profiled_wall_ms": "the profiled step's wall time (synchronised at both ends), under the profiler",
    "idle_ms": "profiled_wall_ms minus the summed kernel time: launch gaps and host work (inflated by the profiler)",
    "s_per_step": "median of an unprofiled call's steps after its first, each closed by a CUDA synchronise",
    "ceiling_if_all_non_gemm_non_attention_work_were_free":
        "stock s_per_step / (stock gemm + fp8_gemm + attention kernel time): all other kernels and all idle gaps "
        "gone; the upper bound of overlays that leave GEMMs and attention untouched",
    "ceiling_if_other_kernels_were_free_idle_kept":
        "stock s_per_step / (stock s_per_step - stock other kernel time): the other kernels gone, the unprofiled "
        "step's idle gaps kept",
    "overlay_share_left": "(config's other + fused_dit kernel time) / stock's other kernel time",
    "idle_ms_unprofiled": "s_per_step (unprofiled) minus the profiled step's summed kernel time",
    "speedup_vs_stock": "stock s_per_step / config's s_per_step",
}

# ---------------------------------------------------------------------------------------------- categorising
_FP8_NAME = re.compile(r"scaled_mm|e4m3|e5m2|fp8|float8|nvjet_\w*?_qq", re.IGNORECASE)
_ATTENTION_NAME = re.compile(r"flash|fmha|sdpa|attention|attn", re.IGNORECASE)
_GEMM_NAME = re.compile(r"gemm|cublas|cutlass|nvjet|xmma|wgmma|_sgemm|_hgemm|splitkreduce|gemv|matmul",
                        re.IGNORECASE)
_FP8_OPS = ("aten::_scaled_mm",)
_TRITON_JIT = re.compile(r"@triton\.jit[^\n]*\n(?:\s*@[^\n]*\n)*\s*def\s+(\w+)")


def fused_dit_kernel_names(ops_dir: Path = REPO / "overlays" / "fused_dit" / "ops") -> frozenset:
    """The names of the functions decorated @triton.jit in overlays/fused_dit/ops/*.py (a launched Triton kernel
    shows in the profiler under its function's name; helpers are inlined and never show)."""
    names = set()
    for path in sorted(ops_dir.glob("*.py")):
        names.update(_TRITON_JIT.findall(path.read_text()))
    return frozenset(names)


def categorise(kernel: str, ops: tuple = (), fused_names: frozenset = frozenset()) -> str:
    """The category of one kernel: its name, and the CPU ops that launched it (innermost first).

    Order matters: our Triton kernels by exact name; FP8 GEMMs (launched under aten::_scaled_mm, or named so) before
    GEMMs; attention before GEMMs (fmha_cutlass*, cuDNN's sdpa ... wgmma names also read as GEMMs)."""
    if kernel in fused_names:
        return "fused_dit"
    gemm_like = bool(_GEMM_NAME.search(kernel))
    # an FP8 marker alone is not enough: casts to and from float8 are elementwise kernels ("other")
    if any(op in _FP8_OPS for op in ops) or (gemm_like and _FP8_NAME.search(kernel)):
        return "fp8_gemm"
    if _ATTENTION_NAME.search(kernel):
        return "attention"
    if gemm_like:
        return "gemm"
    return "other"


def summarise(kernels, fused_names: frozenset, top: int = TOP) -> dict:
    """kernels: (name, device_us, ops) triples, ops the launching CPU ops innermost first (may be empty).

    Returns per category the summed milliseconds, the launch count, the top `top` kernel names by time, and for
    "other" also the top launching ops (the innermost aten op) by time."""
    per_category = {c: {"ms": 0.0, "launches": 0, "kernels": {}, "ops": {}} for c in CATEGORIES}
    for name, device_us, ops in kernels:
        category = per_category[categorise(name, tuple(ops), fused_names)]
        category["ms"] += device_us / 1e3
        category["launches"] += 1
        entry = category["kernels"].setdefault(name, [0, 0.0])
        entry[0] += 1
        entry[1] += device_us / 1e3
        op = next((o for o in ops if o.startswith("aten::")), ops[0] if ops else None)
        if op is not None:
            op_entry = category["ops"].setdefault(op, [0, 0.0])
            op_entry[0] += 1
            op_entry[1] += device_us / 1e3

    def ranked(table):
        rows = sorted(table.items(), key=lambda kv: -kv[1][1])[:top]
        return [{"name": n[:200], "count": c, "ms": round(ms, 3)} for n, (c, ms) in rows]

    result = {}
    for name, category in per_category.items():
        result[name] = {"ms": round(category["ms"], 3), "launches": category["launches"],
                        "distinct_kernels": len(category["kernels"]), "top_kernels": ranked(category["kernels"])}
        if name == "other":
            result[name]["top_launching_ops"] = ranked(category["ops"])
    return result


def ceilings(stock: dict, configs: dict) -> dict:
    """The derived figures of one model and resolution from each config's record (see DEFINITIONS)."""
    out = {}
    wall = stock.get("s_per_step")
    kernel = stock.get("kernel_ms")
    if not wall or not kernel:
        return out
    wall_ms = wall * 1e3
    kept = kernel["gemm"] + kernel["fp8_gemm"] + kernel["attention"]
    out["stock_s_per_step"] = wall
    out["stock_gemm_attention_ms"] = round(kept, 3)
    out["stock_other_ms"] = kernel["other"]
    out["stock_idle_ms_unprofiled"] = round(wall_ms - sum(kernel.values()), 3)
    out["ceiling_if_all_non_gemm_non_attention_work_were_free"] = round(wall_ms / kept, 3) if kept else None
    left = wall_ms - kernel["other"]
    measured = sum(kernel.values()) > 0   # no device kernels (the CPU smoke test): no ceiling to state
    out["ceiling_if_other_kernels_were_free_idle_kept"] = round(wall_ms / left, 3) if measured and left > 0 else None
    for name, record in configs.items():
        if name == "stock" or not record.get("kernel_ms"):
            continue
        spent = record["kernel_ms"]["other"] + record["kernel_ms"]["fused_dit"]
        total = sum(record["kernel_ms"].values())
        out[name] = {"speedup_vs_stock": round(wall / record["s_per_step"], 3) if record.get("s_per_step") else None,
                     "kernel_ms_total": round(total, 3),
                     "idle_ms_unprofiled": (round(record["s_per_step"] * 1e3 - total, 3)
                                            if record.get("s_per_step") else None),
                     "other_plus_fused_dit_ms": round(spent, 3),
                     "overlay_share_left": round(spent / kernel["other"], 3) if kernel["other"] else None,
                     "gemm_attention_ms": round(record["kernel_ms"]["gemm"] + record["kernel_ms"]["fp8_gemm"]
                                                + record["kernel_ms"]["attention"], 3)}
    return out


# ---------------------------------------------------------------------------------------------- profiling
def is_annotation(event) -> bool:
    """A device-side range the profiler draws (ProfilerStep#N, record_function), not a kernel."""
    return bool(getattr(event, "is_user_annotation", False)) or event.name.startswith("ProfilerStep")


def kernel_events(profiler, device: str) -> list:
    """(kernel name, device us, launching CPU ops innermost first) for every device kernel the profiler kept.

    On the CPU (the --tiny smoke test) there are no device kernels: the list is empty (every category 0)."""
    import torch
    events = profiler.events()
    if device != "cuda":
        return []
    # every CPU op lists the kernels it launched (FunctionEvent.kernels, in every torch release since 1.x); the
    # device events are the complete list: each takes the launching op of a same-named, same-length listed kernel
    # (a kernel no op claims keeps no ops)
    launched: dict = {}
    for event in events:
        if event.device_type != torch.autograd.DeviceType.CPU or not event.kernels:
            continue
        ops, parent = [], event
        while parent is not None and len(ops) < 12:
            ops.append(parent.name)
            parent = parent.cpu_parent
        for kernel in event.kernels:
            launched.setdefault((kernel.name, kernel.duration), []).append(tuple(ops))
    kernels = []
    for event in events:
        if event.device_type != torch.autograd.DeviceType.CUDA or is_annotation(event):
            continue
        duration = event.time_range.end - event.time_range.start
        claims = launched.get((event.name, duration))
        kernels.append((event.name, duration, claims.pop() if claims else ()))
    return kernels


def profile_step(patched, inputs, seed: int, device: str) -> tuple:
    """One sampling step under torch.profiler: the third of a 3-step call (callback-driven schedule)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    latent, noise, positive = inputs
    marks: list[float] = []
    with profile(activities=activities, schedule=schedule(wait=1, warmup=1, active=1, repeat=1)) as profiler:
        def callback(*_):
            synchronize(device)
            marks.append(time.perf_counter())
            profiler.step()
        sample(patched, noise, latent, positive, PROFILED_STEPS, seed, callback=callback)
        synchronize(device)
    if len(marks) != PROFILED_STEPS:
        raise RuntimeError(f"the sampler called back {len(marks)} times for {PROFILED_STEPS} steps")
    wall_ms = (marks[2] - marks[1]) * 1e3
    cpu_ops = sum(1 for e in profiler.events() if e.device_type == torch.autograd.DeviceType.CPU)
    return wall_ms, kernel_events(profiler, device), cpu_ops


# the host functions whose cumulative time host_profile reports by name (ComfyUI's cast, the FP8 seam, the GEMMs)
HOST_FUNCTIONS = ("cast_bias_weight", "uncast_bias_weight", "forward_comfy_cast_weights", "cast_forward",
                  "_quantized_gemm", "_resident_codes", "quantize_weight_fp8", "linear", "_scaled_mm",
                  "scaled_dot_product_attention", "synchronize")


def host_profile(patched, inputs, seed: int, device: str, top: int = 25) -> dict:
    """Where one sampling step's host time goes: step 2 of a 2-step call under cProfile (enabled by the sampler's
    callback after step 1, disabled by the one after step 2, which synchronises: its wait for the GPU shows as
    `synchronize`). cProfile slows Python-heavy code, so compare configs with each other, not with s_per_step."""
    import cProfile
    import pstats
    latent, noise, positive = inputs
    profiler = cProfile.Profile()
    calls = []

    def callback(*_):
        synchronize(device)
        (profiler.disable if calls else profiler.enable)()
        calls.append(1)
    sample(patched, noise, latent, positive, 2, seed, callback=callback)
    profiler.disable()
    stats = pstats.Stats(profiler).stats       # (file, line, name) -> (cc, nc, tottime, cumtime, callers)
    total = sum(value[2] for value in stats.values())

    def where(key):
        path, line, name = key
        return f"{'/'.join(Path(path).parts[-2:])}:{line}({name})" if path != "~" else name
    by_name: dict = {}
    for key, (_, calls_n, tottime, cumtime, _) in stats.items():
        name = key[2].split()[2] if key[2].startswith("<built-in method ") else key[2]
        if name in HOST_FUNCTIONS:
            entry = by_name.setdefault(name, {"calls": 0, "cumulative_ms": 0.0})
            entry["calls"] += calls_n
            entry["cumulative_ms"] = round(entry["cumulative_ms"] + cumtime * 1e3, 2)
    ranked = sorted(stats.items(), key=lambda item: item[1][2], reverse=True)[:top]
    return {"host_profiled_ms": round(total * 1e3, 2),
            "functions": by_name,
            "top_by_own_time": [{"function": where(key), "calls": value[1], "own_ms": round(value[2] * 1e3, 2),
                                 "cumulative_ms": round(value[3] * 1e3, 2)} for key, value in ranked]}


def time_steps(patched, inputs, steps: int, warmup: int, seed: int, device: str) -> dict:
    latent, noise, positive = inputs
    started = time.perf_counter()
    sample(patched, noise, latent, positive, warmup, seed)
    synchronize(device)
    first_call_s = time.perf_counter() - started
    marks: list[float] = []
    started = time.perf_counter()
    sample(patched, noise, latent, positive, steps, seed,
                      callback=lambda *_: (synchronize(device), marks.append(time.perf_counter())))
    steps_s = [b - a for a, b in zip([started] + marks[:-1], marks)]
    later = steps_s[1:] or steps_s
    return {"first_call_s": round(first_call_s, 3), "step_times_s": [round(s, 4) for s in steps_s],
            "s_per_step": round(statistics.median(later), 4)}


def profile_record(wall_ms: float, kernels: list, cpu_events: int, fused_names: frozenset) -> dict:
    table = summarise(kernels, fused_names)
    total = sum(c["ms"] for c in table.values())
    return {"profiled_wall_ms": round(wall_ms, 3), "kernel_ms_total": round(total, 3),
            "idle_ms": round(wall_ms - total, 3), "kernel_launches": sum(c["launches"] for c in table.values()),
            "cpu_events": cpu_events, "kernel_ms": {c: table[c]["ms"] for c in CATEGORIES}, "categories": table}


def run_config(session, spec, resolutions, config: str, fused_names, options, device) -> dict:
    """One config built once (FP8 copies are quantised once), timed at every resolution, then profiled at every
    resolution, so no timing of this config follows a profile of it. resolution name -> record; an error is
    recorded in the records it concerns, not raised."""
    import torch
    records = {resolution_name(r): {} for r in resolutions}
    patched = None
    run = generation.parse_run_spec(config)
    try:
        base = session.load(spec, run)
        patched, details = generation.build_config(run.config, base)
        for record in records.values():
            record.update({"node_inputs": details.get("node_inputs"),
                           "training_mode": base.model.diffusion_model.training})
        for phase in ("timing", "profile") + (("host",) if options.host_profile else ()):
            for resolution in resolutions:
                name = resolution_name(resolution)
                record = records[name]
                if "error" in record:
                    continue
                print(f"{spec.key} {name} {config} {phase} ...", flush=True)
                try:
                    inputs = inputs_for(spec, resolution, options.tiny, options.seed)
                    with torch.inference_mode():
                        if phase == "timing":
                            record.update(time_steps(patched, inputs, options.steps,
                                                     options.warmup_steps, options.seed, device))
                            print(f"  {record['s_per_step']} s/step", flush=True)
                        elif phase == "host":
                            record["host"] = host_profile(patched, inputs, options.seed, device)
                            print(f"  host {record['host']['host_profiled_ms']} ms under cProfile: "
                                  f"{record['host']['functions']}", flush=True)
                        else:
                            record.update(profile_record(*profile_step(patched, inputs, options.seed,
                                                                       device), fused_names))
                            print(f"  wall {record['profiled_wall_ms']} ms profiled, kernels {record['kernel_ms']},"
                                  f" idle {record['idle_ms']} ms", flush=True)
                except Exception as error:   # one resolution's failure must not lose the others
                    record["error"] = f"{phase}: {type(error).__name__}: {error}"
                    record["traceback"] = traceback.format_exc()[-4000:]
                    print(f"  {config} {name}: {record['error']}", flush=True)
    except Exception as error:
        for record in records.values():
            record.setdefault("error", f"build: {type(error).__name__}: {error}")
            record.setdefault("traceback", traceback.format_exc()[-4000:])
        print(f"  {config}: {type(error).__name__}: {error}", flush=True)
    finally:
        if patched is not None:
            generation.release_config(patched, session.patcher)
        del patched
        free_memory()
    return records


def add_arguments(parser) -> None:
    add_model_arguments(parser, models="flux-dev", steps=3, warmup_steps=1)
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"comma list of {', '.join(CONFIGS)}")
    parser.add_argument("--host-profile", action="store_true",
                        help="also one step under cProfile per config: where the host time goes")


def run(options, parser) -> int:
    check_model_arguments(options, parser)
    options.configs = [c for c in options.configs.split(",") if c]
    bad = [c for c in options.configs if c not in CONFIGS]
    if bad:
        parser.error(f"unknown configs {bad}; known: {', '.join(CONFIGS)}")
    if "stock" not in options.configs:
        options.configs.insert(0, "stock")   # the ceilings are stock's
    device = options.device
    comfyui = import_comfyui(options.comfyui.resolve(), device, options.allocator, options.disable_dynamic_vram)
    check_device(device)
    environment = generation.environment(device, comfyui)
    fused_names = fused_dit_kernel_names()
    # generation.Session reads these attributes of its options: weights from state dicts, loaded as ComfyUI does
    options.load_outside_inference_mode = False
    options.save_checkpoint = False
    options.work_dir = None
    session = generation.Session(options, device)
    report = {"benchmark": "step-profile", "script": "benchmarks/step_profile.py", "note": NOTE,
              "environment": environment,
              "settings": {"steps": options.steps, "warmup_steps": options.warmup_steps, "seed": options.seed,
                           "tiny": options.tiny, **SAMPLER, "allocator": options.allocator,
                           "profiled_step": f"step 3 of a {PROFILED_STEPS}-step call, after the timing pass of the same build",
                           "order": "per model: configs in turn, each built once, timed at every resolution, "
                                    "then profiled at every resolution",
                           "weights_loaded": WEIGHTS_LOADED[False], "model_mode": generation.AS_LOADED,
                           "vram_mode": comfyui.get("vram_mode"),
                           "fused_dit_kernel_names": sorted(fused_names),
                           "activities": ["CPU", "CUDA"] if device == "cuda" else ["CPU"]},
              "definitions": DEFINITIONS, "setup": [], "results": []}
    for model_key in options.models:
        spec = MODELS[model_key]
        resolutions = resolutions_of(spec, options)
        entries = {}
        for resolution in resolutions:
            name = resolution_name(resolution)
            entries[name] = {"model": model_key, "resolution": name, "weights": "bf16", "configs": {}}
            report["results"].append(entries[name])
        for config in options.configs:
            records = run_config(session, spec, resolutions, config, fused_names, options, device)
            for name, record in records.items():
                entries[name]["configs"][config] = record
            report["setup"] = session.setup
            results.write_json(report, options.out)
        for name, entry in entries.items():
            entry["derived"] = ceilings(entry["configs"].get("stock", {}), entry["configs"])
            print(f"{model_key} {name} derived: {entry['derived']}", flush=True)
        results.write_json(report, options.out)
        session.unload()
    print(f"wrote {options.out}")
    return 0

