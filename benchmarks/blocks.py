"""Block-stack and FP8 GEMM benchmark on a GPU; writes JSON (GPU, versions, date) under --out.

1. A stack of Flux-shaped blocks (hidden 3072, 24 heads, MLP 4x, 4096 image + 512 text tokens, bf16, random
   weights; fixtures from tests/overlays/blocks.py that follow ComfyUI's math): stock eager, overlays without FP8,
   overlays with FP8 linears (their codes beside the bf16 weights, and with `fp8_weights="replace"`: the bf16
   weights in host memory). Median time over repeats (CUDA events), speedups, peak memory
   (torch.cuda.max_memory_allocated in total and above what was allocated before the call), output error vs stock,
   and each variant's call captured in a CUDA graph and replayed (its GPU time without host launch gaps).
2. One Linear at M=16384 K=3072 N=12288: bf16 GEMM vs FP8 (_scaled_mm) with the weights pre-quantised, with and
   without the dynamic activation quantisation (op 5), and with eager quantisation for comparison.
3. `--compile`: the same stack under torch.compile (Inductor, the whole model as ComfyUI's TorchCompileModel
   compiles it): stock compiled, and the overlays compiled with fullgraph=True (each fused op one custom op), beside
   stock and overlays eager; first-call seconds, ms per call, and the output's bits against the eager forward.
   Writes compile-stack.json.

The models are built as ComfyUI 0.3.64 leaves Flux (training mode, parameters requiring grad) and called under
torch.inference_mode(), as ComfyUI's executor runs them. Random weights: timings and memory only.

    PYTHONPATH=overlays:. python benchmarks/blocks.py --out benchmarks/results [--compile]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import importlib.util  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernels import copy_ceiling_gbs, time_ms as queued_gpu_ms  # noqa: E402
from results_io import environment  # noqa: E402


def _load_fixtures():
    """tests/overlays/blocks.py under its own name (this script is `blocks` too)."""
    path = Path(__file__).resolve().parents[1] / "tests" / "overlays" / "blocks.py"
    spec = importlib.util.spec_from_file_location("fused_dit_block_fixtures", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


fixtures = _load_fixtures()

NO_FP8 = ("norm_rope", "adaln", "gate")
ROUNDS = 5
WITH_FP8 = NO_FP8 + ("fp8_linear",)


def time_ms(fn, warmup=3, repeats=10, host_samples: list | None = None) -> float:
    """Median GPU time of one call (CUDA events around it); with host_samples, also appends the median time the
    host took to issue the call (fn() returning, before the sync): near the GPU time, the call is host-bound."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples, issued = [], []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        began = time.perf_counter()
        fn()
        issued.append((time.perf_counter() - began) * 1e3)
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end))
    if host_samples is not None:
        host_samples.append(statistics.median(issued))
    return statistics.median(samples)


def graphed_ms(fn) -> float | str:
    """fn captured in one CUDA graph and timed as replays: the GPU time of the call without host launch gaps
    (what a GPU-bound run sees); the reason instead when the call cannot be captured."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
    except Exception as exc:       # a host sync inside the call would end the capture; report it
        return f"not capturable: {type(exc).__name__}: {exc}"[:300]
    ms = time_ms(graph.replay)
    del graph
    return ms


def peak_memory_mib(fn) -> dict:
    """torch.cuda.max_memory_allocated over one call: in total (weights and FP8 codes included), what was resident
    before the call, and the peak above that."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    return {"peak_total_mib": peak / 2**20, "resident_before_call_mib": before / 2**20,
            "peak_above_start_mib": (peak - before) / 2**20}


def block_stack(depth: int, depth_single: int, img_len: int, txt_len: int) -> dict:
    import fused_dit

    model, inputs = fixtures.make_flux_stack(hidden=3072, heads=24, depth=depth, depth_single=depth_single,
                                             batch=1, img_len=img_len, txt_len=txt_len, dtype=torch.bfloat16,
                                             device="cuda", seed=0)
    weights_mib = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20

    def call():
        with torch.inference_mode():
            return model(**{k: v.clone() for k, v in inputs.items()})

    stock_out = call().float()
    # (name, op families, where the FP8 linears' bf16 weights stay)
    plans = (("stock", None, None), ("overlays_no_fp8", NO_FP8, "alongside"),
             ("overlays_fp8", WITH_FP8, "alongside"), ("overlays_fp8_weights_replaced", WITH_FP8, "replace"))
    variants = {name: {"round_ms": [], "round_host_issue_ms": [], "fp8_weights": storage}
                for name, _, storage in plans}
    # Variants are interleaved over rounds: a drift of clocks or a neighbour's load hits every variant alike, and
    # the spread across rounds says how much of a difference is noise.
    for round_index in range(ROUNDS):
        for name, ops, storage in plans:
            report = fused_dit.enable(model, ops=ops, fp8_weights=storage) if ops else None
            try:
                out = call().float()               # also quantises and caches the FP8 weights once
                entry = variants[name]
                entry["round_ms"].append(time_ms(call, host_samples=entry["round_host_issue_ms"]))
                if round_index == 0:
                    entry.update({
                        **peak_memory_mib(call),
                        "relative_frobenius_error_vs_stock": float((out - stock_out).norm() / stock_out.norm()),
                        "max_abs_diff_vs_stock": float((out - stock_out).abs().max()),
                        "enable_report": report,
                    })
                if round_index == ROUNDS - 1:
                    entry["graph_replay_ms"] = graphed_ms(call)
            finally:
                fused_dit.disable(model, drop_fp8_weights=True)
    for entry in variants.values():
        entry["ms"] = statistics.median(entry["round_ms"])
        entry["spread_ms"] = [min(entry["round_ms"]), max(entry["round_ms"])]
    fp8_weight_mib = sum(m.weight.numel() for n, m in model.named_modules()
                         if isinstance(m, torch.nn.Linear) and "mod" not in n) / 2**20
    stock_ms = variants["stock"]["ms"]
    stock_graph_ms = variants["stock"]["graph_replay_ms"]
    for v in variants.values():
        v["speedup_vs_stock"] = stock_ms / v["ms"]
        if isinstance(v["graph_replay_ms"], float) and isinstance(stock_graph_ms, float):
            v["graph_replay_speedup_vs_stock"] = stock_graph_ms / v["graph_replay_ms"]
    return {"shape": {"hidden": 3072, "heads": 24, "double_blocks": depth, "single_blocks": depth_single,
                      "img_tokens": img_len, "txt_tokens": txt_len, "batch": 1, "dtype": "bfloat16"},
            "weights_mib": weights_mib,
            "fp8_weight_copies_mib": fp8_weight_mib,
            "note": "peak_total_mib: torch.cuda.max_memory_allocated over one call, weights and FP8 codes "
                    "included; peak_above_start_mib excludes what was resident before the call. fp8_weights "
                    "'alongside': the FP8 codes (1 byte/param of the block Linears) are held beside the bf16 "
                    "weights; 'replace': the bf16 weights of those Linears wait in host memory",
            "variants": variants}


def gemm(m=16384, k=3072, n=12288) -> dict:
    from fused_dit.ops import fp8_linear as fl
    from fused_dit.ops import quantize_fp8 as qf

    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, k, generator=g, device="cuda").bfloat16()
    w = (torch.randn(n, k, generator=g, device="cuda") / k ** 0.5).bfloat16()
    b = (0.02 * torch.randn(n, generator=g, device="cuda")).bfloat16()
    w_codes, w_scale = fl.quantize_weight_fp8(w)
    weight = fl.Fp8Weight(w_codes, w_scale, static_input=False, input_scale=None, source_key=())
    a_codes, a_scale = qf.quantize_fp8_dynamic(x)
    flops = 2 * m * k * n

    def eager_quant_linear():
        codes, scale = qf.quantize_fp8_dynamic_reference(x)
        return fl.matmul_fp8(codes, scale, w_codes, w_scale, b, torch.bfloat16)

    def linear_accum(fast):
        settings = dataclasses.replace(fl.SETTINGS, fast_accum=fast)
        return lambda: fl.linear_fp8(x, weight, b, settings=settings)

    reference = F.linear(x, w, b).float()
    frobenius = {f"fp8_linear_{'fast' if fast else 'exact'}_accum": float(
        (linear_accum(fast)().float() - reference).norm() / reference.norm()) for fast in (True, False)}
    # GPU time of each call: every call is queued behind a GPU sleep before the first starts (kernels.time_ms), so
    # the host's time to issue the quantiser's launches is not counted as GPU time (an earlier version counted it: the
    # events were recorded around each call as it was issued, adding this host's launch latency to the FP8 rows).
    # L2 is flushed before each call: back to back, the FP8 weight (37 MB) would stay in the 50 MB L2 and the bf16
    # one (75 MB) would not, which a model whose every Linear has its own weight never sees.
    flush = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    calls = {
        "bf16_linear": lambda: F.linear(x, w, b),
        "fp8_prequantised_gemm": lambda: fl.matmul_fp8(a_codes, a_scale, w_codes, w_scale, b, torch.bfloat16),
        "fp8_prequantised_gemm_fast_accum": lambda: fl.matmul_fp8(a_codes, a_scale, w_codes, w_scale, b,
                                                                  torch.bfloat16, fast_accum=True),
        # the product's setting (fl.SETTINGS.fast_accum) and the other one, side by side
        "fp8_linear_with_triton_quant": lambda: fl.linear_fp8(x, weight, b),
        "fp8_linear_with_triton_quant_fast_accum": linear_accum(True),
        "fp8_linear_with_triton_quant_exact_accum": linear_accum(False),
        "fp8_linear_with_eager_quant": eager_quant_linear,
        "triton_dynamic_quant_only": lambda: qf.quantize_fp8_dynamic(x),
        "eager_dynamic_quant_only": lambda: qf.quantize_fp8_dynamic_reference(x),
    }
    timings = {name: queued_gpu_ms(call, l2_flush=flush) for name, call in calls.items()}
    del flush
    result = {"shape_MKN": [m, k, n], "ms": timings, "fast_accum_default": fl.SETTINGS.fast_accum,
              "timing": "GPU time per call, all calls queued behind a GPU sleep first (no host launch gaps), L2 "
                        "flushed before each",
              "relative_frobenius_vs_bf16": frobenius,
              "tflops": {name: flops / (ms * 1e-3) / 1e12 for name, ms in timings.items() if "only" not in name},
              "quant_gb_per_s": {name: x.numel() * 3 / (ms * 1e-3) / 1e9 for name, ms in timings.items()
                                 if "only" in name}}
    result["speedup_fp8_incl_quant_vs_bf16"] = timings["bf16_linear"] / timings["fp8_linear_with_triton_quant"]
    # What this GEMM allows: the pre-quantised GEMM plus a two-pass per-tensor quantisation moving its bytes at
    # the copy bandwidth (x read twice, codes written once), the fastest such a linear could be.
    copy_gbs = copy_ceiling_gbs()
    floor_ms = (2 * x.numel() * x.element_size() + x.numel()) / copy_gbs / 1e6
    gemm_ms = min(timings["fp8_prequantised_gemm"], timings["fp8_prequantised_gemm_fast_accum"])
    result["bound"] = {
        "copy_gbs": copy_gbs, "two_pass_quant_floor_ms": floor_ms, "fastest_prequantised_gemm_ms": gemm_ms,
        "speedup_if_quant_at_floor": timings["bf16_linear"] / (gemm_ms + floor_ms),
        "speedup_if_quant_free": timings["bf16_linear"] / gemm_ms,
        "quant_budget_for_1.6x_ms": timings["bf16_linear"] / 1.6 - gemm_ms}
    return result


def compile_stack(depth: int, depth_single: int, img_len: int, txt_len: int) -> dict:
    """Stock and overlays, eager and under torch.compile (Inductor, whole model); see the module docstring."""
    import fused_dit

    model, inputs = fixtures.make_flux_stack(hidden=3072, heads=24, depth=depth, depth_single=depth_single,
                                             batch=1, img_len=img_len, txt_len=txt_len, dtype=torch.bfloat16,
                                             device="cuda", seed=0)

    def caller(module):
        def call():
            with torch.inference_mode():
                return module(**{k: v.clone() for k, v in inputs.items()})
        return call

    variants, outputs = {}, {}
    # (name, op families or None, compiled, fullgraph)
    plans = (("stock", None, False, False), ("overlays_no_fp8", NO_FP8, False, False),
             ("overlays_fp8", WITH_FP8, False, False), ("stock_compiled", None, True, False),
             ("overlays_no_fp8_compiled", NO_FP8, True, True), ("overlays_fp8_compiled", WITH_FP8, True, True))
    for name, ops, compiled, fullgraph in plans:
        torch._dynamo.reset()
        if ops:
            fused_dit.enable(model, ops=ops)
        entry = {"ops": list(ops or ()), "compiled": compiled, "fullgraph": fullgraph}
        try:
            module = torch.compile(model, fullgraph=fullgraph) if compiled else model
            torch.cuda.synchronize()
            began = time.perf_counter()
            try:
                outputs[name] = caller(module)()
            except Exception as exc:     # a graph break under fullgraph=True, or a compiler failure: reported
                entry["error"] = f"{type(exc).__name__}: {exc}"[:600]
                variants[name] = entry
                continue
            torch.cuda.synchronize()
            entry["first_call_s"] = time.perf_counter() - began
            entry["ms"] = time_ms(caller(module))
        finally:
            if ops:
                fused_dit.disable(model, drop_fp8_weights=True)
        variants[name] = entry
    torch._dynamo.reset()
    stock_ms = variants["stock"]["ms"]
    for name, entry in variants.items():
        if "ms" in entry:
            entry["speedup_vs_stock"] = stock_ms / entry["ms"]
    pairs = {"overlays_no_fp8_compiled": "overlays_no_fp8", "overlays_fp8_compiled": "overlays_fp8",
             "stock_compiled": "stock", "overlays_no_fp8": "stock"}
    agreement = {}
    for name, against in pairs.items():
        if name in outputs and against in outputs:
            a, b = outputs[name], outputs[against]
            agreement[f"{name}_vs_{against}"] = {
                "bit_identical": bool(torch.equal(a, b)),
                "max_abs_diff": float((a.float() - b.float()).abs().max()),
                "relative_frobenius": float((a.float() - b.float()).norm() / b.float().norm())}
    return {"shape": {"hidden": 3072, "heads": 24, "double_blocks": depth, "single_blocks": depth_single,
                      "img_tokens": img_len, "txt_tokens": txt_len, "batch": 1, "dtype": "bfloat16",
                      "comfy_state": "0.3.64 (training mode, requires_grad), called under torch.inference_mode()"},
            "compile": "torch.compile(model) with Inductor's defaults, the whole stack; fullgraph=True for the "
                       "overlays (a graph break is an error)",
            "variants": variants, "agreement": agreement}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--double", type=int, default=2)
    parser.add_argument("--single", type=int, default=4)
    parser.add_argument("--img-tokens", type=int, default=4096)
    parser.add_argument("--txt-tokens", type=int, default=512)
    parser.add_argument("--no-gemm", action="store_true", help="only the block stack")
    parser.add_argument("--compile", action="store_true",
                        help="only the stack under torch.compile (compile-stack.json)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.compile:
        result = {"environment": environment(),
                  "compile_stack": compile_stack(args.double, args.single, args.img_tokens, args.txt_tokens)}
        variants = result["compile_stack"]["variants"]
        faster_alone = min(variants[n].get("ms", float("inf")) for n in ("overlays_no_fp8", "stock_compiled"))
        result["targets_met"] = {
            "overlays_compiled_without_graph_break": "error" not in variants["overlays_no_fp8_compiled"],
            "overlays_then_compile_ge_1.0x_the_faster_alone": (
                variants["overlays_no_fp8_compiled"].get("ms", float("inf")) <= faster_alone)}
        (args.out / "compile-stack.json").write_text(json.dumps(result, indent=2, default=str))
        print(json.dumps(result, indent=2, default=str))
        return
    result = {"environment": environment(), "gemm": None if args.no_gemm else gemm(),
              "block_stack": block_stack(args.double, args.single, args.img_tokens, args.txt_tokens)}
    targets = {
        "fp8_linear_incl_quant_ge_1.6x_bf16": (None if args.no_gemm
                                               else result["gemm"]["speedup_fp8_incl_quant_vs_bf16"] >= 1.6),
        "stack_no_fp8_ge_1.10x": result["block_stack"]["variants"]["overlays_no_fp8"]["speedup_vs_stock"] >= 1.10,
        "stack_fp8_ge_1.30x": result["block_stack"]["variants"]["overlays_fp8"]["speedup_vs_stock"] >= 1.30,
        "peak_memory_not_above_stock": all(
            v["peak_above_start_mib"] <= result["block_stack"]["variants"]["stock"]["peak_above_start_mib"]
            for v in result["block_stack"]["variants"].values()),
        "peak_total_lower_with_fp8_weights_replaced": (
            result["block_stack"]["variants"]["overlays_fp8_weights_replaced"]["peak_total_mib"]
            < result["block_stack"]["variants"]["stock"]["peak_total_mib"]),
        "stack_fp8_weights_replaced_ge_1.30x": (
            result["block_stack"]["variants"]["overlays_fp8_weights_replaced"]["speedup_vs_stock"] >= 1.30),
    }
    result["targets_met"] = targets
    (args.out / "blocks.json").write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
