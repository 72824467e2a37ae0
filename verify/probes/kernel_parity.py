"""Probe for kernel-parity: the installed fused_dit overlay's Triton kernels against their references.

Runs in the target's interpreter (see verify/README.md) and imports the overlay package `fused_dit` as installed
there. Every case draws fresh random inputs (its seed is reported), poisons the outputs (NaN) where the op takes
`out=`, runs the op through its public function, and checks that the Triton kernel really ran (no eager fallback)
before comparing:

- tier 2, the drop-in promise: against `reference_comfy` (the eager chain the target's ComfyUI runs). bf16/fp16:
  <= 1 ulp on >= 99.9% of elements and <= 2 ulp max; fp32: |diff| <= 1e-5 + 1e-5 |ref|; FP8 codes byte-exact.
- tier 1: against the fp64 reference (`reference_fp32`), reported; fp32 outputs are held to the same tolerance
  there too. The FP8 GEMM: relative Frobenius error <= 5% against the eager linear.

With CUDA: real DiT shapes in bf16/fp16/fp32, FP8 ops on sm_89+. Without CUDA: small fp32 shapes under
TRITON_INTERPRET=1 (the interpreter truncates bf16 casts and deviates on fp8 casts, so those are not checked).

Cases come from the installed package, `fused_dit.parity.parity_cases(device, small)`: the same list, inputs,
references and gates as benchmarks/gpu_gates.py and benchmarks/gpu_fp8_gates.py (the probe keeps no copy of its
own; an installed fused_dit without `fused_dit.parity` is a SKIP asking for a reinstall). A case whose op ran its
eager reference is reported as skipped, never passed; a case that runs out of GPU memory is skipped with that reason.
"""
import importlib.util
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # python -I leaves this folder off sys.path
from _probe import emit, run  # noqa: E402 - importable only after the line above


def run_case(case, torch, cuda):
    """One case's JSON entry; status "passed" / "failed" / "skipped" (with the reason)."""
    try:
        entry = case.run()
    except Exception as exc:   # one broken case must not hide the others' results
        out_of_memory = cuda and isinstance(exc, torch.cuda.OutOfMemoryError)
        if not out_of_memory:
            traceback.print_exc()
        entry = {"name": case.name, "op": case.op}
        if out_of_memory:
            entry.update(status="skipped", reason=f"out of GPU memory at this shape: {exc}".splitlines()[0])
        else:
            entry.update(status="failed", failures=[f"crashed: {type(exc).__name__}: {exc}"])
    finally:
        if cuda:
            torch.cuda.empty_cache()
    if entry["status"] == "ran_eager":
        # The public function ran its eager reference: nothing about the kernel was measured.
        entry.update(status="skipped", reason=entry["failures"][0])
    return entry


# ------------------------------------------------------------------------------------------------ main

def main(args):
    device_arg = args.get("device", "auto")
    numbers = {"device_requested": device_arg}
    if importlib.util.find_spec("fused_dit") is None:
        return emit("SKIP", "fused_dit is not installed in the target's environment (install the overlay first)",
                    numbers)
    try:
        import torch
    except Exception as exc:
        return emit("SKIP", f"torch is not importable in the target ({type(exc).__name__}: {exc})", numbers)
    interpret_env = os.environ.get("TRITON_INTERPRET") == "1"
    cuda = device_arg != "cpu" and not interpret_env and torch.cuda.is_available()
    if device_arg == "cuda" and not cuda:
        why = "TRITON_INTERPRET=1 is set" if interpret_env else "torch.cuda.is_available() is False"
        return emit("FAIL", f"device 'cuda' was requested but {why}", numbers)
    if not cuda:
        # Must be set before triton is imported: triton.jit decides at decoration time to interpret.
        os.environ["TRITON_INTERPRET"] = "1"
        if importlib.util.find_spec("numpy") is None:
            return emit("SKIP", "no CUDA, and the Triton interpreter needs numpy, which is not installed", numbers)
    device = "cuda" if cuda else "cpu"

    import fused_dit
    from fused_dit import dispatch

    numbers.update({"device": device, "torch": torch.__version__, "fused_dit": getattr(fused_dit, "__version__", None),
                    "fused_dit_file": getattr(fused_dit, "__file__", None), "triton_interpret": not cuda})
    error = dispatch.triton_import_error()
    if error:
        return emit("SKIP", f"{error}: every op runs its eager reference, no kernel to check", numbers)
    import triton
    numbers["triton"] = triton.__version__
    if cuda:
        numbers.update(gpu=torch.cuda.get_device_name(), capability=list(torch.cuda.get_device_capability()))
    try:
        from fused_dit.parity import parity_cases
    except ImportError as exc:
        return emit("SKIP", f"the installed fused_dit has no parity cases ({exc}); reinstall the overlay", numbers)
    numbers["cases_from"] = "fused_dit.parity.parity_cases"
    results = [run_case(case, torch, cuda) for case in parity_cases(device, small=not cuda)]
    numbers["cases"] = results
    failed = [r for r in results if r["status"] == "failed"]
    passed = [r for r in results if r["status"] == "passed"]
    skipped = [r for r in results if r["status"] == "skipped"]
    numbers["summary"] = {"passed": len(passed), "failed": len(failed), "skipped": len(skipped)}
    where = f"on {numbers.get('gpu', 'CUDA')}" if cuda else "on CPU under TRITON_INTERPRET=1 (small fp32 shapes)"
    tail = f"; {len(skipped)} skipped ({skipped[0]['reason']})" if skipped else ""
    if failed:
        first = failed[0]
        return emit("FAIL", f"{len(failed)} of {len(results)} parity cases failed {where}, first: {first['name']}: "
                            f"{first['failures'][0]}{tail}", numbers)
    if not passed:
        return emit("SKIP", f"no parity case ran a kernel {where}{tail}", numbers)
    return emit("PASS", f"{len(passed)} parity cases passed {where} (tier 2 vs ComfyUI's eager chain, tier 1 vs "
                        f"fp64){tail}", numbers)


if __name__ == "__main__":
    run(main)
