"""Host time per call of each fused op against ComfyUI's eager chain it replaces, on a CUDA GPU.

In eager ComfyUI a block is bound by host time wherever the GPU finishes its kernels faster than Python issues
them; an overlay that saves GPU time but costs host time can then make a block slower. This times, per op, the
mean host microseconds per call on inputs small enough that the GPU never waits (launch_overhead.host_us): the
overlay's public call, the same call with its Triton kernel replaced by a stub that launches nothing (the
wrapper's own Python: dispatch, checks, allocation, the launch key; the difference is the launch itself: the
compiled kernel's launcher on repeats where fused_dit.launch goes direct, else the JIT's), the same call with the
direct path off (FUSED_DIT_DIRECT_LAUNCH=0: every launch through the JIT), and the eager chain.
One JSON; no assertions.

    PYTHONPATH=overlays:.:benchmarks python benchmarks/host_overhead.py --out benchmarks/results/host-overhead.json
"""
from __future__ import annotations

import argparse
import functools
import os
from pathlib import Path


from fused_dit import launch
from fused_dit.ops import adaln, gate_add, rms_rope
import kernels
from launch_overhead import host_us
from results_io import environment, write_json

# the Triton kernel each op's wrapper launches
KERNELS = {"rms_rope_flux": (rms_rope, "_flux_rms_rope_kernel"), "rms_rope_wan": (rms_rope, "_wan_rms_rope_kernel"),
           "adaln": (adaln, "_adaln_kernel"), "gate_add_wan": (gate_add, "_gate_add_kernel"),
           "gate_add_flux": (gate_add, "_gate_add_kernel")}


class _NoLaunch:
    """Stands in for a Triton kernel (its parameter names, for fused_dit.launch): `kernel[grid](...)` does nothing."""

    def __init__(self, kernel):
        self.arg_names = kernel.arg_names

    def __getitem__(self, grid):
        return lambda *args, **options: None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokens", type=int, default=16, help="tokens per call (small: the GPU never waits)")
    parser.add_argument("--calls", type=int, default=1000)
    args = parser.parse_args()
    result = {**environment(), "tokens": args.tokens, "calls_per_round": args.calls,
              "direct_launch": launch.direct_enabled(),
              "method": "mean host time per call over a round of calls without synchronising, median of 5 rounds",
              "host_us": {}}
    # kernels.py's inputs (Flux and Wan widths, batch 1) at a few tokens; ops with one kernel to stub out
    for op, overlay_with, eager_chain, inputs, _ in kernels.problems(args.tokens):
        if op not in KERNELS:
            continue
        overlay = functools.partial(overlay_with, kernels.DEFAULT_LAUNCHES[op])
        eager = functools.partial(eager_chain, *inputs)
        module, kernel_name = KERNELS[op]
        kernel = getattr(module, kernel_name)
        setattr(module, kernel_name, _NoLaunch(kernel))
        try:
            wrapper_only = host_us(overlay, args.calls)["us"]
        finally:
            setattr(module, kernel_name, kernel)
        os.environ["FUSED_DIT_DIRECT_LAUNCH"] = "0"
        try:
            jit_path = host_us(overlay, args.calls)["us"]
        finally:
            del os.environ["FUSED_DIT_DIRECT_LAUNCH"]
        result["host_us"][op] = {"overlay": host_us(overlay, args.calls)["us"], "overlay_without_launch": wrapper_only,
                                 "overlay_jit_launch": jit_path, "eager_chain": host_us(eager, args.calls)["us"]}
        print(op, {k: round(v, 1) for k, v in result["host_us"][op].items()}, flush=True)
    write_json(result, args.out, "host-overhead")


if __name__ == "__main__":
    main()
