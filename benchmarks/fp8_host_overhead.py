"""Host time per FP8 linear call, the previous FP8 modules vs the current ones, and the block stack in fresh processes.

    PYTHONPATH=overlays:. python benchmarks/fp8_host_overhead.py --out DIR [--old benchmarks/_old_fp8/overlays]
                                                                 [--processes 3] [--deadline-s 170]

--old names a folder holding a copy of the previous `fused_dit` package (made with `cp -r overlays/fused_dit` before
the change, deleted after the run); it is imported under the name `fused_dit_old`, so both run in one process.

1. Host microseconds per call (fp8_linear_forward, ffn_forward_fp8, a ComfyUI-style fp8-weight Linear), old vs new,
   interleaved over rounds. The GPU is kept busy by a spin kernel (torch.cuda._sleep) queued before the timed calls,
   so the calls only enqueue work and time.perf_counter measures host work alone; `gpu_busy_after_calls` records
   that the stream was still busy when the last call returned (else the number includes waiting).
2. Byte equality of old vs new: the layer outputs and the quantisers' codes and scales on the same inputs.
3. A breakdown of one dynamic call's host cost, old and new (plan lookup, quantiser, torch._scaled_mm, ...).
4. The Flux-shaped block stack (fp8_stack_profile.py's child mode) in fresh processes, new and old, as many as fit
   before --deadline-s.
5. Last: one Triton launch through the JIT vs through the compiled kernel's own runner (the binder skipped), for
   comparison only.
Writes DIR/fp8_host_overhead.json after every part, so a run cut short still leaves what it measured.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from results_io import environment  # noqa: E402

ROUNDS = 9
TOKENS = 4608          # Flux at 1024x1024: 4096 image + 512 text tokens
HIDDEN = 3072


def load_package_as(root: Path, name: str):
    """Import the fused_dit package found in `root` under another top-level name."""
    package_dir = root / "fused_dit"
    spec = importlib.util.spec_from_file_location(name, package_dir / "__init__.py",
                                                  submodule_search_locations=[str(package_dir)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def ops_of(package: str) -> dict:
    try:
        modules = importlib.import_module(f"{package}.integration.fp8_modules")
    except ModuleNotFoundError:      # a package from before the module wiring moved out of ops/fp8_linear.py
        modules = importlib.import_module(f"{package}.ops.fp8_linear")
    return {"fm": modules,
            "qf": importlib.import_module(f"{package}.ops.quantize_fp8"),
            "gq": importlib.import_module(f"{package}.ops.gelu_quantize_fp8")}


def sleep_cycles_per_ms() -> float:
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(20_000_000)
    end.record()
    end.synchronize()
    return 20_000_000 / start.elapsed_time(end)


def host_us_per_call(fn, calls: int, cycles_per_ms: float, busy_ms: float) -> tuple[float, bool]:
    """Host microseconds per call of fn with the GPU kept busy; and whether it was still busy at the end."""
    torch.cuda.synchronize()
    torch.cuda._sleep(int(cycles_per_ms * busy_ms))
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host_s = time.perf_counter() - start
    busy = not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    return host_s / calls * 1e6, busy


def compare(fns: dict, calls: int, cycles_per_ms: float) -> dict:
    """fns: name -> callable; each timed ROUNDS times, interleaved, GPU busy; per-name median/min us per call."""
    # spin long enough to outlast the host loop at ~200 us per call, and the calls' own GPU work queued behind it
    busy_ms = max(50.0, calls * 0.2)
    samples = {name: [] for name in fns}
    all_busy = True
    for _ in range(ROUNDS):
        for name, fn in fns.items():
            us, busy = host_us_per_call(fn, calls, cycles_per_ms, busy_ms)
            samples[name].append(us)
            all_busy &= busy
    result = {name: {"median_us": statistics.median(v), "min_us": min(v), "rounds_us": v}
              for name, v in samples.items()}
    result["calls_per_round"] = calls
    result["gpu_busy_after_calls"] = all_busy
    if "old" in samples and "new" in samples:
        result["new_saves_us_median"] = result["old"]["median_us"] - result["new"]["median_us"]
    return result


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    # reshape(-1): a 0-dim tensor cannot be viewed as another element size
    return bool(torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))


def make_cases(gen: torch.Generator) -> dict:
    dev, dt = "cuda", torch.bfloat16
    x = torch.randn(1, TOKENS, HIDDEN, generator=gen, device=dev).to(dt)
    linear = torch.nn.Linear(HIDDEN, HIDDEN, device=dev, dtype=dt)
    ffn = torch.nn.Sequential(torch.nn.Linear(HIDDEN, 4 * HIDDEN, device=dev, dtype=dt),
                              torch.nn.GELU(approximate="tanh"),
                              torch.nn.Linear(4 * HIDDEN, HIDDEN, device=dev, dtype=dt))
    # ComfyUI fp8 checkpoint layout: e4m3 weight, scale_weight and scale_input next to it
    static = torch.nn.Linear(HIDDEN, HIDDEN, device=dev, dtype=dt)
    with torch.no_grad():
        w = static.weight.float()
        scale_w = w.abs().amax() / 448
        static.weight = torch.nn.Parameter((w / scale_w).to(torch.float8_e4m3fn), requires_grad=False)
    static.register_buffer("scale_weight", scale_w.reshape(()))
    static.register_buffer("scale_input", torch.tensor(0.02, device=dev))
    for m in (linear, ffn, static):
        m.eval()
        m.requires_grad_(False)
    return {"x": x, "linear": linear, "ffn": ffn, "static": static}


def clone_module(module: torch.nn.Module) -> torch.nn.Module:
    import copy
    return copy.deepcopy(module)


def part_host(result: dict, ops: dict, cycles_per_ms: float) -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    cases = make_cases(gen)
    x = cases["x"]
    modules = {version: {name: clone_module(cases[name]) for name in ("linear", "ffn", "static")}
               for version in ops}

    def linear_call(version, name):
        fm, module = ops[version]["fm"], modules[version][name]
        stock = torch.nn.Linear.forward.__get__(module)
        return lambda: fm.fp8_linear_forward(module, x, stock)

    def ffn_call(version):
        fm, module = ops[version]["fm"], modules[version]["ffn"]
        return lambda: fm.ffn_forward_fp8(module, x, module.forward)

    calls = {"linear_dynamic_bf16_weight": ({v: linear_call(v, "linear") for v in ops}, 150),
             "ffn_gelu_dynamic": ({v: ffn_call(v) for v in ops}, 80),
             "linear_static_fp8_weight": ({v: linear_call(v, "static") for v in ops}, 150)}
    exact = {}
    with torch.no_grad():
        for case, (fns, _) in calls.items():
            outs = {v: fn() for v, fn in fns.items()}       # also compiles kernels and caches the FP8 weights
            if "old" in outs:
                exact[f"{case}_output"] = same_bytes(outs["old"], outs["new"])
        if "old" in ops:
            x2d = x.reshape(-1, HIDDEN)
            h2d = torch.randn(TOKENS, 4 * HIDDEN, generator=gen, device="cuda").bfloat16()
            for label, fn_name, mod, arg in (("quantize_dynamic", "quantize_dynamic_triton", "qf", x2d),
                                             ("gelu_quantize_dynamic", "gelu_quantize_dynamic_triton", "gq", h2d)):
                (c_old, s_old), (c_new, s_new) = (getattr(ops[v][mod], fn_name)(arg) for v in ("old", "new"))
                exact[f"{label}_codes"] = same_bytes(c_old, c_new)
                exact[f"{label}_scale"] = same_bytes(s_old, s_new) and s_old.dim() == s_new.dim() == 0
            scale_in = torch.tensor(0.02, device="cuda")
            for label, scale in (("quantize_comfy_scaled", scale_in), ("quantize_comfy_unit", None)):
                c_old, c_new = (ops[v]["qf"].quantize_comfy_triton(x2d.clone(), scale) for v in ("old", "new"))
                exact[f"{label}_codes"] = same_bytes(c_old, c_new)
        torch.cuda.synchronize()
        result["byte_exact_old_vs_new"] = exact
        result["host_us_per_call"] = {case: compare(fns, n, cycles_per_ms) for case, (fns, n) in calls.items()}
        for version in ops:
            result[f"breakdown_us_{version}"] = breakdown(ops[version], modules[version]["linear"], x,
                                                          cycles_per_ms)


def breakdown(op: dict, module, x: torch.Tensor, cycles_per_ms: float) -> dict:
    """Host us of the pieces of one dynamic FP8 linear call (GPU busy), median over rounds."""
    fm, qf = op["fm"], op["qf"]
    x2d = x.reshape(-1, HIDDEN)
    plan = fm.fp8_plan_of(module, x)
    weight = plan.weight
    codes, scale = qf.quantize_dynamic_triton(x2d)
    pieces = {
        "plan_lookup": lambda: fm.fp8_plan_of(module, x),
        "quantize_dynamic_triton": lambda: qf.quantize_dynamic_triton(x2d),
        "scaled_mm": lambda: torch._scaled_mm(codes, weight.codes_t, scale_a=scale, scale_b=weight.scale_fp32,
                                              bias=plan.bias, out_dtype=x.dtype),
        "torch_empty_codes": lambda: torch.empty(x2d.shape, device=x.device, dtype=torch.float8_e4m3fn),
        "env_read": lambda: os.environ.get("FUSED_DIT_BACKEND"),
    }
    out = {}
    for name, fn in pieces.items():
        samples = [host_us_per_call(fn, 200, cycles_per_ms, 40.0)[0] for _ in range(5)]
        out[name] = statistics.median(samples)
    return out


def direct_runner_probe(qf, cycles_per_ms: float) -> dict:
    """Host us of one absmax launch through the JIT (kernel[grid](...)) vs the compiled kernel's own runner.

    The runner skips argument binding, specialisation and the cache lookup. A measurement only, run last (a
    launch API mismatch cannot disturb the other parts); the partial maxima it writes are checked against the JIT
    launch's.
    """
    x2d = torch.randn(TOKENS, HIDDEN, device="cuda").bfloat16()
    grid, iterations, keep_from, block, hints, num_warps, _ = qf._dynamic_launch_cached(
        x2d.numel(), x2d.device, x2d.element_size())
    stats = torch.empty(grid[0] + 1, device="cuda", dtype=torch.float32)
    kernel = qf._absmax_kernel
    args = (x2d, stats, x2d.numel(), iterations, keep_from)
    compiled = kernel[grid](*args, BLOCK=block, HINTS=hints, num_warps=num_warps)
    out: dict = {}
    try:
        reference = stats[1:].clone()
        # the runner indexes grid[0], grid[1] and grid[2]: it needs all three
        runner = compiled[grid + (1,) * (3 - len(grid))]
        stats.fill_(-1.0)
        runner(*args, block, hints)
        torch.cuda.synchronize()
        out["direct_runner_matches_jit"] = bool(torch.equal(stats[1:], reference))
        out["direct_runner_us"] = statistics.median(
            host_us_per_call(lambda: runner(*args, block, hints), 200, cycles_per_ms, 40.0)[0] for _ in range(5))
    except Exception as exc:  # Triton's runner API differs between releases
        out["direct_runner_error"] = f"{type(exc).__name__}: {exc}"[:300]
    out["jit_launch_us"] = statistics.median(
        host_us_per_call(lambda: kernel[grid](*args, BLOCK=block, HINTS=hints, num_warps=num_warps), 200,
                         cycles_per_ms, 40.0)[0] for _ in range(5))
    return out


def part_stack(result: dict, old_root: Path | None, processes: int, deadline: float, write) -> None:
    """fp8_stack_profile.py's child (blocks.block_stack(2, 4, 4096, 512)) in fresh processes, new and old."""
    repo = HERE.parent
    base_path = os.environ.get("PYTHONPATH", f"{repo / 'overlays'}{os.pathsep}{repo}")
    # new first and three of them early, so a deadline cuts old runs first; otherwise interleaved
    order = ["new", "old", "new", "new", "old", "old"] if old_root is not None and processes == 3 else \
        ["new"] * processes + (["old"] * processes if old_root is not None else [])
    runs = result["block_stack_processes"] = []
    for code in order:
        left = deadline - time.monotonic()
        if left < 25:
            runs.append({"code": code, "skipped": "deadline"})
            continue
        env = dict(os.environ, PYTHONPATH=base_path if code == "new" else f"{old_root}{os.pathsep}{base_path}")
        started = time.monotonic()
        try:
            proc = subprocess.run([sys.executable, str(HERE / "fp8_stack_profile.py"), "--out", "/tmp", "--child"],
                                  capture_output=True, text=True, env=env, timeout=left)
        except subprocess.TimeoutExpired:
            runs.append({"code": code, "error": "timeout"})
            write()
            continue
        entry = {"code": code, "seconds": time.monotonic() - started}
        if proc.returncode == 0:
            variants = json.loads(proc.stdout.strip().splitlines()[-1])
            entry.update({name: {"ms": v["ms"], "round_ms": v["round_ms"], "speedup_vs_stock": v["speedup_vs_stock"]}
                          for name, v in variants.items()})
        else:
            entry["error"] = proc.stderr[-1500:]
        runs.append(entry)
        write()
    for code in ("new", "old"):
        fp8 = [r["overlays_fp8"]["ms"] for r in runs if r.get("code") == code and "overlays_fp8" in r]
        sp = [r["overlays_fp8"]["speedup_vs_stock"] for r in runs if r.get("code") == code and "overlays_fp8" in r]
        if fp8:
            result.setdefault("block_stack_summary", {})[code] = {
                "overlays_fp8_ms_per_process": fp8, "speedup_vs_stock_per_process": sp}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--old", type=Path, default=HERE / "_old_fp8" / "overlays")
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--deadline-s", type=float, default=170.0)
    args = parser.parse_args()
    deadline = time.monotonic() + args.deadline_s
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict = {"environment": environment(), "tokens": TOKENS, "hidden": HIDDEN, "rounds": ROUNDS}

    def write():
        (args.out / "fp8_host_overhead.json").write_text(json.dumps(result, indent=2, default=str))

    import fused_dit  # noqa: F401  (the current package, from PYTHONPATH)
    ops = {"new": ops_of("fused_dit")}
    old_root = args.old if (args.old / "fused_dit" / "__init__.py").exists() else None
    if old_root is not None:
        load_package_as(old_root, "fused_dit_old")
        ops = {"old": ops_of("fused_dit_old"), **ops}
    result["old_package"] = str(old_root)
    cycles_per_ms = sleep_cycles_per_ms()
    result["sleep_cycles_per_ms"] = cycles_per_ms
    started = time.monotonic()
    part_host(result, ops, cycles_per_ms)
    result["host_part_seconds"] = time.monotonic() - started
    write()
    for case, r in result["host_us_per_call"].items():
        print(case, {k: round(v["median_us"], 1) for k, v in r.items() if isinstance(v, dict)},
              "busy" if r["gpu_busy_after_calls"] else "NOT BUSY")
    print("byte exact:", result["byte_exact_old_vs_new"])
    print("breakdown new:", {k: (round(v, 1) if isinstance(v, float) else v)
                             for k, v in result["breakdown_us_new"].items()})
    part_stack(result, old_root, args.processes, deadline, write)
    write()
    print("block stack:", json.dumps(result.get("block_stack_summary"), default=str))
    result["triton_launch_us"] = direct_runner_probe(ops["new"]["qf"], cycles_per_ms)
    write()
    print("triton launch:", result["triton_launch_us"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
