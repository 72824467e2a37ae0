"""Host time per call of the FP8 linear's pieces on a CUDA GPU, on inputs small enough that the GPU never waits.

Answers where the host microseconds of one FP8 linear go (the FP8 block stack at 4608 tokens is often bound by its
host time on the H200 machine, see the notes): the Triton launch of the quantiser's kernels through `kernel[grid](...)` against calling the compiled
kernel's launcher directly (what a launch cache would save), torch.empty, torch._scaled_mm, and the whole
forward. Also checks that the direct launch writes the same bits.

    PYTHONPATH=overlays:. python benchmarks/launch_overhead.py --out benchmarks/results/launch-overhead.json
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from results_io import environment, write_json


def host_us(fn, calls: int = 2000, rounds: int = 5) -> dict:
    """Median over rounds of the mean host time per call (the GPU work is tiny, so the queue never fills)."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        per_call.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return {"us": statistics.median(per_call), "rounds_us": per_call}


def main() -> None:
    from fused_dit.integration import fp8_modules as fm
    from fused_dit.ops import fp8_linear as fl
    from fused_dit.ops import quantize_fp8 as qf

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    n = x.numel()
    grid, iterations, keep_from, block, hints, num_warps, max_partials = qf._dynamic_launch_cached(
        n, x.device, x.element_size())
    stats = torch.empty(grid[0] + 1, device="cuda", dtype=torch.float32)

    def absmax_launch():
        return qf._absmax_kernel[grid](x, stats, n, iterations, keep_from, BLOCK=block, HINTS=hints,
                                       num_warps=num_warps)

    compiled = absmax_launch()
    result = {"environment": environment(),
              "input": [64, 256], "host_us": {}}
    timings = result["host_us"]
    timings["triton_launch_kernel_grid"] = host_us(absmax_launch)

    # the compiled kernel's own launcher, with the arguments the JIT would pass (constexprs included)
    direct_error = None
    try:
        stream = torch.cuda.current_stream().cuda_stream
        bound = (x, stats, n, iterations, keep_from, block, hints)

        def direct():
            compiled.run(grid[0], 1, 1, stream, compiled.function, compiled.packed_metadata, None, None, None,
                         *bound)

        stats.fill_(-1.0)
        absmax_launch()
        expected = stats.clone()
        stats.fill_(-1.0)
        direct()
        torch.cuda.synchronize()
        result["direct_launch_same_bits"] = bool(torch.equal(stats, expected))
        timings["triton_direct_compiled_run"] = host_us(direct)
    except Exception as exc:       # the launcher's signature is Triton-internal; record why it did not work
        direct_error = f"{type(exc).__name__}: {exc}"[:300]
    result["direct_launch_error"] = direct_error

    timings["torch_empty"] = host_us(lambda: torch.empty(n, device="cuda", dtype=torch.uint8))
    timings["stats_slot_view"] = host_us(lambda: stats[0])
    timings["quantize_dynamic_triton"] = host_us(lambda: qf.quantize_dynamic_triton(x))
    w = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    w_codes, w_scale = fl.quantize_weight_fp8(w)
    a_codes, a_scale = qf.quantize_dynamic_triton(x)
    timings["scaled_mm"] = host_us(lambda: fl._scaled_mm(a_codes, a_scale, w_codes.t(), w_scale.float(), None,
                                                         torch.bfloat16, True))
    linear = torch.nn.Linear(256, 256, device="cuda", dtype=torch.bfloat16).eval()
    stock = linear.forward
    with torch.no_grad():
        timings["fp8_linear_forward"] = host_us(lambda: fm.fp8_linear_forward(linear, x, stock))
        timings["bf16_linear_forward"] = host_us(lambda: stock(x))
        # fused_dit.launch's direct path against the JIT's kernel[grid] (FUSED_DIT_DIRECT_LAUNCH=0), interleaved
        # round by round: this host's per-call cost moves in steps during a run (seen: 51 -> 32 us), so timing
        # one path after the other would compare two states of the host
        import os
        from fused_dit import launch
        result["direct_launch_enabled"] = launch.direct_enabled()
        pairs = {"quantize_dynamic_triton": lambda: qf.quantize_dynamic_triton(x),
                 "fp8_linear_forward": lambda: fm.fp8_linear_forward(linear, x, stock)}
        interleaved = {f"{name}_{path}": [] for name in pairs for path in ("direct", "jit_path")}
        for _ in range(5):
            for name, fn in pairs.items():
                interleaved[f"{name}_direct"].append(host_us(fn, rounds=1)["us"])
                os.environ["FUSED_DIT_DIRECT_LAUNCH"] = "0"
                try:
                    interleaved[f"{name}_jit_path"].append(host_us(fn, rounds=1)["us"])
                finally:
                    del os.environ["FUSED_DIT_DIRECT_LAUNCH"]
        for name, values in interleaved.items():
            timings[f"interleaved_{name}"] = {"us": statistics.median(values), "rounds_us": values}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(result, args.out, "launch-overhead")
    for name, value in timings.items():
        print(f"{name:32s} {value['us']:8.2f} us")
    print("direct launch:", direct_error or f"same bits {result.get('direct_launch_same_bits')}")


if __name__ == "__main__":
    main()
