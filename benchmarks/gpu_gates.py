"""Full parity gates of the fused DiT ops at real shapes on a CUDA GPU; writes JSON.

The cases are the pack's own, `fused_dit.parity.parity_cases("cuda", small=False)` (the non-FP8 ones; FP8:
benchmarks/gpu_fp8_gates.py), the same list the kernel-parity probe runs. Each case draws fresh random inputs (the
seed is recorded), poisons the outputs with NaN, runs the Triton overlay, and compares it with the tier-2 reference
(ComfyUI's eager chain: bf16/fp16 gate <= 1 ulp on >= 99.9% of elements and <= 2 ulp max; fp32 gate 1e-5) and with
the tier-1 fp64 reference (fp32 outputs: the same gate; otherwise for context, as is eager itself).

    PYTHONPATH=overlays:. python benchmarks/gpu_gates.py --out benchmarks/results/ [--set adaln.rows_per_program=4]

`--set KIND.field=value` runs the cases of one kind of launch setting (fused_dit.parity.LAUNCH_KINDS: rms_rope_flux,
rms_rope_wan, adaln, gate_add) with that field of the op's default setting replaced (a Python literal), so a
setting a sweep found can be held to the gates before it becomes the default (`--sweep-best kernels.json:16384`
takes every op's fastest setting at that length); the settings are recorded in the JSON.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import json
import sys
from pathlib import Path

import torch

from fused_dit.parity import GATE_TEXT, parity_cases
from results_io import environment, write_json

DEVICE = "cuda"


def launch_settings(assignments: list[str]) -> tuple[dict, dict]:
    """(launch setting per kind for fused_dit.parity.parity_cases, the assignments as recorded) for each
    "KIND.field=value"; only fields the kind's setting has."""
    from fused_dit.parity import LAUNCH_KINDS
    launches, applied = {}, {}
    for assignment in assignments:
        target, sep, literal = assignment.partition("=")
        kind, dot, field = target.partition(".")
        if not (sep and dot and field):
            raise ValueError(f"--set {assignment!r}: expected KIND.field=value, e.g. adaln.rows_per_program=4")
        if kind not in LAUNCH_KINDS:
            raise ValueError(f"--set {assignment!r}: no launch setting kind {kind!r}; known: {', '.join(LAUNCH_KINDS)}")
        module_name, default_name = LAUNCH_KINDS[kind]
        current = launches.get(kind) or getattr(importlib.import_module(f"fused_dit.ops.{module_name}"), default_name)
        if field not in {f.name for f in dataclasses.fields(current)}:
            raise ValueError(f"--set {assignment!r}: {type(current).__name__} has no field {field}")
        value = ast.literal_eval(literal)
        launches[kind] = dataclasses.replace(current, **{field: value})
        applied[target] = value
    return launches, applied


# kernels.py's sweep ops -> the launch setting kinds of the parity cases (the FP8 quantiser: gpu_fp8_gates.py)
SWEEP_KINDS = {"rms_rope_flux": "rms_rope_flux", "rms_rope_wan": "rms_rope_wan", "adaln": "adaln",
               "gate_add_wan": "gate_add"}


def sweep_best(spec: str | None) -> list[str]:
    """"KIND.field=value" assignments for the best setting of each op a kernels.py sweep found at one L."""
    if not spec:
        return []
    path, _, length = spec.rpartition(":")
    try:
        sweeps = json.loads(Path(path).read_text())["sweep"][length]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"--sweep-best {spec!r}: no sweep at L={length} there ({type(exc).__name__}: {exc})")
    assignments = []
    for op, report in sweeps.items():
        if op in SWEEP_KINDS:
            assignments += [f"{SWEEP_KINDS[op]}.{name}={value!r}" for name, value in report["best"].items()
                            if name != "error"]
    return assignments


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="JSON file, or a folder for gates-<date>.json")
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="KIND.FIELD=VALUE",
                        help="a field of an op's launch setting, e.g. adaln.rows_per_program=4 (repeatable)")
    parser.add_argument("--sweep-best", metavar="KERNELS_JSON:L",
                        help="first set every op's fastest configuration at length L of a kernels.py --sweep run")
    args = parser.parse_args(argv)
    try:
        launches, settings = launch_settings(sweep_best(args.sweep_best) + args.settings)
    except ValueError as exc:
        parser.error(str(exc))
    if not torch.cuda.is_available():
        print("gpu_gates: no CUDA device; the CPU tests cover the interpreter path", file=sys.stderr)
        return 2
    results = []
    for case in parity_cases(DEVICE, small=False, launches=launches):
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
        "cases_from": "fused_dit.parity.parity_cases", "settings": settings,
        "all_passed": all(r["passed"] for r in results), "cases": results,
    }
    if args.out:
        write_json(report, args.out, "gates")
    return 0 if report["all_passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
