"""AdaLN under Nsight Compute: the overlay and comfy-kitchen's CUDA kernel (when importable), one call each per L.

Run under `ncu --profile-from-start off` (the calls between cudaProfilerStart/Stop are the profiled ones; the
warm-up and compilation before are not; a same-size `copy_` would be a device memcpy, not a kernel ncu lists), e.g.

    ncu --profile-from-start off --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \\
        --section WarpStateStats --section LaunchStats -o adaln python benchmarks/ncu_adaln.py

The metrics quoted in docs/gpu-report.md were collected by hand from ncu's CSV pages into
benchmarks/results/ncu-adaln.json (with the ncu command line that produced them).
"""
from __future__ import annotations

import argparse
import ast
import dataclasses

import torch

from fused_dit.ops import adaln

DEVICE, BF16, C = "cuda", torch.bfloat16, 3072


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="FIELD=VALUE",
                        help="an AdalnLaunch field for the overlay's call, e.g. rows_per_program=1 (repeatable)")
    args = parser.parse_args()
    fields = {}
    for setting in args.settings:
        name, value = setting.split("=", 1)
        fields[name] = ast.literal_eval(value)
    launch = dataclasses.replace(adaln.LAUNCH, **fields)
    try:
        from comfy_kitchen.registry import registry
        kitchen = registry.get_implementation("adaln", backend="cuda")
    except Exception:
        kitchen = None
    calls = []
    for L in args.lengths:
        x = torch.randn(1, L, C, device=DEVICE, dtype=BF16)
        e = torch.randn(1, 1, 6, C, device=DEVICE, dtype=BF16)
        shift, scale = e[:, :, 0], e[:, :, 1]
        calls.append(lambda x=x, shift=shift, scale=scale: adaln.adaln(x, shift, scale, launch=launch))
        if kitchen is not None:
            calls.append(lambda x=x, shift=shift, scale=scale: kitchen(x=x, scale=scale, shift=shift, eps=1e-6))
    for call in calls:   # compile and warm up outside the profiled range
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for call in calls:
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
