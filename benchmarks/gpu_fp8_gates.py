"""GPU gates for the FP8 overlay ops (5-7); writes JSON (GPU, versions, date) under --out.

The cases are the pack's own FP8 cases, `fused_dit.parity.parity_cases("cuda", small=False)` (the list the
kernel-parity probe runs). Gates: FP8 codes byte-exact against the eager references (dynamic per-tensor, ComfyUI
unit scale with its in-place clamp, ComfyUI static scale); the fused GELU quantisation's code mismatch fraction
(<= 0.1%, one code apart, where tanh rounds differently); FP8 GEMM relative Frobenius error vs bf16 <= 5%; the
ComfyUI fp8 module path bit-identical to ComfyUI's eager fp8_linear computation.

The summary keys of the earlier result files are kept (quantize_codes, gelu_quantize_codes,
gemm_relative_frobenius_error, comfy_fp8_module_bit_identical, ...); "cases" holds every case's full result.

    PYTHONPATH=overlays:. python benchmarks/gpu_fp8_gates.py --out benchmarks/results
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from fused_dit.parity import parity_cases
from results_io import environment


def _bytes_of(result: dict, output: str) -> dict:
    return next(entry for entry in result.get("byte_mismatch", ()) if entry["output"] == output)


def _codes_entry(result: dict) -> dict:
    codes = _bytes_of(result, "codes")
    return {"numel": codes["numel"], "mismatching": codes["mismatching"], "fraction": codes["fraction"]}


def summary(cases_and_results) -> dict:
    """The earlier files' keys, derived from the case results."""
    from fused_dit.ops import quantize_fp8 as qf

    out: dict = {"torch_fp8_cast_saturates": qf.torch_fp8_cast_saturates("cuda:0")}
    codes, gelu = {}, {}
    for case, result in cases_and_results:
        if result["status"] == "skipped":
            continue
        variant = case.params.get("variant")
        if case.family == "quantize_fp8":
            entry = _codes_entry(result)
            if variant == "dynamic":
                entry["scale_equal"] = _bytes_of(result, "scale")["mismatching"] == 0
            elif variant == "comfy_unit":
                entry["in_place_clamp_equal"] = _bytes_of(result, "clamped_input")["mismatching"] == 0
            entry.update(backend=result["backend"], passed=result["passed"])
            codes[f"{variant}/{case.dtype}/{case.params['rows']}x{case.params['cols']}"] = entry
        elif case.family == "gelu_quantize_fp8":
            entry = _codes_entry(result)
            if variant == "dynamic":
                entry["scale_equal"] = _bytes_of(result, "scale")["mismatching"] == 0
                entry["max_code_distance"] = _bytes_of(result, "codes")["max_code_distance"]
            entry.update(backend=result["backend"], passed=result["passed"])
            gelu[f"{variant}/{case.dtype}"] = entry
        elif case.family == "fp8_linear" and variant == "dynamic":
            rel = result["relative_frobenius"][0]
            out["gemm_relative_frobenius_error"] = {
                "shape_MKN": [case.params["M"], case.params["K"], case.params["N"]],
                "fp8_vs_bf16": rel["vs_comfy"], "fp8_vs_fp32": rel["vs_fp32"], "bf16_vs_fp32": rel["eager_vs_fp32"]}
            out["gemm_error_gate_5pct"] = result["passed"]
        elif case.family == "fp8_linear" and variant == "comfy_module":
            out["comfy_fp8_module_bit_identical"] = result["passed"]
    out["quantize_codes"] = codes
    out["quantize_codes_byte_exact"] = bool(codes) and all(
        v["backend"] == "triton" and v["mismatching"] == 0 and v.get("scale_equal", True)
        and v.get("in_place_clamp_equal", True) for v in codes.values())
    out["gelu_quantize_codes"] = gelu
    return out


def gates() -> dict:
    cases_and_results = []
    for case in parity_cases("cuda", small=False):
        if not case.fp8:
            continue
        result = case.run()
        cases_and_results.append((case, result))
        verdict = "SKIP" if result["status"] == "skipped" else "PASS" if result["passed"] else "FAIL"
        print(f"{verdict} {case.name} [{result.get('backend', '-')}]: "
              f"{'; '.join(result.get('failures') or ()) or result.get('reason', 'ok')}", file=sys.stderr, flush=True)
        torch.cuda.empty_cache()
    results = [result for _, result in cases_and_results]
    return {**summary(cases_and_results), "cases_from": "fused_dit.parity.parity_cases",
            "all_passed": bool(results) and all(r["passed"] for r in results), "cases": results}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_fp8_gates: no CUDA device; the CPU tests cover the kernels' math", file=sys.stderr)
        return 2
    result = {"environment": environment(), **gates()}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "gpu_fp8_gates.json"
    path.write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k != "cases"}, indent=2))
    print(f"wrote {path}")
    return 0 if result["all_passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
