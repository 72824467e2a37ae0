"""Full parity gates of the fused DiT ops at real shapes on a CUDA GPU; writes JSON.

The cases are the pack's own, `fused_dit.parity.parity_cases("cuda", small=False)` (the non-FP8 ones; FP8:
benchmarks/gpu_fp8_gates.py), the same list the kernel-parity probe runs. Each case draws fresh random inputs (the
seed is recorded), poisons the outputs with NaN, runs the Triton overlay, and compares it with the tier-2 reference
(ComfyUI's eager chain: bf16/fp16 gate <= 1 ulp on >= 99.9% of elements and <= 2 ulp max; fp32 gate 1e-5) and with
the tier-1 fp64 reference (fp32 outputs: the same gate; otherwise for context, as is eager itself).

    PYTHONPATH=overlays:. python benchmarks/gpu_gates.py --out benchmarks/results/
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from fused_dit.parity import GATE_TEXT, parity_cases
from results_io import environment, write_json

DEVICE = "cuda"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="JSON file, or a folder for gates-<date>.json")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_gates: no CUDA device; the CPU tests cover the interpreter path", file=sys.stderr)
        return 2
    results = []
    for case in parity_cases(DEVICE, small=False):
        if case.fp8:
            continue
        # keys of the earlier result files (name, op, dtype, seed, backend, shape_fallbacks, vs_comfy, vs_fp64,
        # eager_vs_fp64, passed) are all in the case's result; it adds shape, gate, status, failures and more
        entry = case.run()
        results.append(entry)
        print(f"{'PASS' if entry['passed'] else 'FAIL'} {entry['name']} [{entry['backend']}]: max "
              f"{entry['max_ulp']} ulp, {entry['within_one_ulp_fraction']:.5%} within 1 ulp (vs eager); max |diff| "
              f"vs fp64 {max(r['max_abs_diff'] for r in entry['vs_fp64']):.3g}, eager vs fp64 "
              f"{max(r['max_abs_diff'] for r in entry['eager_vs_fp64']):.3g}", flush=True)
        for failure in entry["failures"]:
            print(f"    {failure}", flush=True)
        torch.cuda.empty_cache()
    report = {
        **environment(),
        "gate": {"bf16_fp16": GATE_TEXT["ulp"], "fp32": GATE_TEXT["fp32"]},
        "cases_from": "fused_dit.parity.parity_cases",
        "all_passed": all(r["passed"] for r in results), "cases": results,
    }
    if args.out:
        write_json(report, args.out, "gates")
    return 0 if report["all_passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
