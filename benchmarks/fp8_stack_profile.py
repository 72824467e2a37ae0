"""Where the time of the Flux-shaped block stack goes, stock vs overlays with FP8 linears (one GPU call).

    PYTHONPATH=overlays:. python benchmarks/fp8_stack_profile.py --out DIR [--processes 3]

1. Repeatability: the same stack timed in N fresh processes (each: stock, no-FP8, FP8 interleaved over rounds), to
   separate run-to-run spread from the within-run spread blocks.py reports.
2. A torch.profiler pass over one call of each variant: CUDA time per kernel name (top 25), the sum of kernel time
   vs the wall time of the call (the difference is launch gaps and host work).
Writes DIR/fp8_stack_profile.json.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import blocks as bench  # noqa: E402
from results_io import environment  # noqa: E402


def profile_variant(model, inputs, ops) -> dict:
    import fused_dit

    def call():
        with torch.no_grad():
            return model(**{k: v.clone() for k, v in inputs.items()})

    report = fused_dit.enable(model, ops=ops) if ops else None
    try:
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            start = time.perf_counter()
            call()
            torch.cuda.synchronize()
            wall_ms = (time.perf_counter() - start) * 1e3
        kernels: dict[str, dict] = {}
        for event in prof.events():
            if event.device_type == torch.autograd.DeviceType.CUDA:
                entry = kernels.setdefault(event.name, {"count": 0, "us": 0.0})
                entry["count"] += 1
                entry["us"] += event.device_time_total if hasattr(event, "device_time_total") else event.cuda_time
        total_us = sum(k["us"] for k in kernels.values())
        top = sorted(kernels.items(), key=lambda kv: -kv[1]["us"])[:25]
        return {"wall_ms_profiled": wall_ms, "kernel_ms_sum": total_us / 1e3, "kernel_launches":
                sum(k["count"] for k in kernels.values()), "top_kernels": [{"name": n[:160], **v} for n, v in top],
                "enable_report": report}
    finally:
        fused_dit.disable(model, drop_fp8_weights=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(bench.block_stack(2, 4, 4096, 512)["variants"], default=str))
        return 0
    result = {"environment": environment(), "repeat_processes": []}
    for _ in range(args.processes):
        proc = subprocess.run([sys.executable, __file__, "--out", str(args.out), "--child"], capture_output=True,
                              text=True)
        variants = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None
        result["repeat_processes"].append(
            {name: {"ms": v["ms"], "round_ms": v["round_ms"]} for name, v in variants.items()} if variants
            else {"error": proc.stderr[-2000:]})
    model, inputs = bench.fixtures.make_flux_stack(hidden=3072, heads=24, depth=2, depth_single=4, batch=1,
                                                   img_len=4096, txt_len=512, dtype=torch.bfloat16, device="cuda",
                                                   seed=0)
    result["profile"] = {name: profile_variant(model, inputs, ops)
                         for name, ops in (("stock", None), ("overlays_no_fp8", bench.NO_FP8),
                                           ("overlays_fp8", bench.WITH_FP8))}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fp8_stack_profile.json").write_text(json.dumps(result, indent=2, default=str))
    for run in result["repeat_processes"]:
        print({k: round(v["ms"], 2) for k, v in run.items() if isinstance(v, dict)})
    for name, p in result["profile"].items():
        print(name, f"wall {p['wall_ms_profiled']:.2f} ms, kernels {p['kernel_ms_sum']:.2f} ms, "
                    f"{p['kernel_launches']} launches")
        for k in p["top_kernels"][:8]:
            print(f"    {k['us'] / 1e3:7.3f} ms x{k['count']:3d} {k['name'][:100]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
