"""Probe for kernel-parity: the installed fused_dit overlay's Triton kernels against their references.

Runs in the target's interpreter (see verify/README.md) and imports the overlay package `fused_dit` as installed
there. Every case draws fresh random inputs (its seed is reported), poisons the outputs (NaN) where the op takes
`out=`, runs the op through its public function, and checks that the Triton kernel really ran (no eager fallback)
before comparing:

- tier 2, the drop-in promise: against `reference_comfy` (the eager chain the target's ComfyUI runs). bf16/fp16:
  <= 1 ulp on >= 99.9% of elements and <= 2 ulp max; fp32: |diff| <= 1e-5 + 1e-5 |ref|; FP8 codes as raw bytes.
- tier 1: against the fp64 reference (`reference_fp32`). fp32 outputs: the same tolerance. bf16/fp16: the kernel
  may be no further from fp64 than the eager chain is, plus the 2 ulp of the tier-2 gate.

With CUDA: real DiT shapes in bf16/fp16/fp32, FP8 ops on sm_89+. Without CUDA: small fp32 shapes under
TRITON_INTERPRET=1 (the interpreter truncates bf16 casts and deviates on fp8 casts, so those are not checked).

Cases come from the package when it offers them, `fused_dit.testing.parity_cases(device, small)` yielding
`(name, op, run)` with `run(generator) -> (outputs, comfy_refs, fp64_refs, inputs)` (the shape of
benchmarks/gpu_gates.py); otherwise from the built-in list below.
"""
import importlib.util
import inspect
import json
import math
import os
import sys
import time
import traceback


def emit(outcome, reason, numbers):
    print(json.dumps({"outcome": outcome, "reason": reason, "numbers": numbers}, default=str))
    return 0


class Case:
    """One parity case. `run(gen)` returns (outputs, tier-2 refs, tier-1 refs, inputs); `judge` is "float" (ulp /
    tolerance gates) or "bytes" (FP8 codes, allowed mismatch fraction `max_byte_mismatch`) or "relative" (a GEMM
    whose accumulation order differs: relative Frobenius error)."""

    def __init__(self, name, op, run, judge="float", fp8=False, max_byte_mismatch=0.0, max_relative=0.0):
        self.name, self.op, self.run, self.judge = name, op, run, judge
        self.fp8, self.max_byte_mismatch, self.max_relative = fp8, max_byte_mismatch, max_relative


# ------------------------------------------------------------------------------------------------ inputs

def builtin_cases(torch, device, small):
    """The cases this probe knows; small: fp32 shapes the Triton interpreter gets through in seconds."""
    from fused_dit import testing
    from fused_dit.ops import adaln, gate_add, rms_rope

    def randn(shape, dtype, gen, scale=1.0):
        return (torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * scale).to(dtype)

    def rotation(leading, half, gen):
        angle = (torch.rand((*leading, half), generator=gen, device=device) * 2 - 1) * math.pi
        cos, sin = angle.cos(), angle.sin()
        return torch.stack([cos, -sin, sin, cos], dim=-1).view(*leading, half, 2, 2)

    def with_out(fn, args, out, **kwargs):
        """Call fn writing into poisoned `out` when it takes one, so unwritten elements show up as NaN."""
        if "out" in inspect.signature(fn).parameters:
            fn(*args, out=out, **kwargs)
            return out if isinstance(out, tuple) else (out,)
        result = fn(*args, **kwargs)
        return result if isinstance(result, tuple) else (result,)

    def poisoned(shape, dtype):
        return testing.poisoned_empty(shape, dtype, device)

    def flux(B, H, N, D, dtype, pe_batch):
        def run(gen):
            qkv = randn((B, N, 3 * H * D), dtype, gen, 3.0)
            q, k, _ = qkv.view(B, N, 3, H, D).permute(2, 0, 3, 1, 4)      # strided views, as Flux makes them
            q_scale, k_scale = randn((D,), dtype, gen, 0.2) + 1, randn((D,), dtype, gen, 0.2) + 1
            pe = rotation((pe_batch, 1, N), D // 2, gen)
            inputs = (q, k, q_scale, k_scale, pe)
            outs = with_out(rms_rope.flux_rms_rope, inputs, tuple(poisoned((B, H, N, D), dtype) for _ in range(2)))
            return outs, rms_rope.flux_reference_comfy(*inputs), rms_rope.flux_reference_fp32(*inputs), inputs
        return run

    def wan(B, L, C, H, dtype):
        def run(gen):
            q, k = randn((B, L, C), dtype, gen, 3.0), randn((B, L, C), dtype, gen, 3.0)
            wq, wk = randn((C,), dtype, gen, 0.2) + 1, randn((C,), dtype, gen, 0.2) + 1
            freqs = rotation((1, L, 1), C // H // 2, gen)
            inputs = (q, k, wq, wk, freqs)
            outs = with_out(rms_rope.wan_rms_rope, inputs + (H,),
                            tuple(poisoned((B, L, H, C // H), dtype) for _ in range(2)))
            return outs, rms_rope.wan_reference_comfy(*inputs, H), rms_rope.wan_reference_fp32(*inputs, H), inputs
        return run

    def wan_norm(B, Lq, Lk, C, dtype):
        def run(gen):
            q, k = randn((B, Lq, C), dtype, gen, 3.0), randn((B, Lk, C), dtype, gen, 3.0)
            wq, wk = randn((C,), dtype, gen, 0.2) + 1, randn((C,), dtype, gen, 0.2) + 1
            inputs = (q, k, wq, wk)
            outs = with_out(rms_rope.wan_rms_norm_qk, inputs, (poisoned(q.shape, dtype), poisoned(k.shape, dtype)))
            comfy = (rms_rope.wan_norm_reference_comfy(q, wq), rms_rope.wan_norm_reference_comfy(k, wk))
            exact = (rms_rope.wan_norm_reference_fp32(q, wq), rms_rope.wan_norm_reference_fp32(k, wk))
            return outs, comfy, exact, inputs
        return run

    def modulation(B, rows, C, dtype, gen):
        return randn((B, rows, 6, C), dtype, gen, 0.5).unbind(2)     # strided chunks, as ComfyUI splits them

    def adaln_case(B, L, C, rows, dtype):
        def run(gen):
            x = randn((B, L, C), dtype, gen, 2.0) + 0.3
            shift, scale = modulation(B, rows, C, dtype, gen)[:2]
            inputs = (x, shift, scale)
            outs = with_out(adaln.adaln, inputs, poisoned((B, L, C), dtype))
            return outs, (adaln.reference_comfy(*inputs),), (adaln.reference_fp32(*inputs),), inputs
        return run

    def gate_case(B, L, C, rows, dtype, rounding):
        def run(gen):
            x, y = randn((B, L, C), dtype, gen, 2.0), randn((B, L, C), dtype, gen, 2.0)
            gate = modulation(B, rows, C, dtype, gen)[2]
            inputs = (x, y, gate)
            outs = with_out(gate_add.gate_add, inputs + (rounding,), poisoned((B, L, C), dtype))
            return outs, (gate_add.reference_comfy(*inputs, rounding),), \
                (gate_add.reference_fp32(*inputs, rounding),), inputs
        return run

    f32, bf16, f16 = torch.float32, torch.bfloat16, torch.float16
    wan_add, flux_add = gate_add.WAN, gate_add.FLUX
    if small:
        return [
            Case("rms_rope_flux B1 H2 N8 D16 fp32", "rms_rope_flux", flux(1, 2, 8, 16, f32, 1)),
            Case("rms_rope_flux B2 H2 N5 D8 fp32 pe[B]", "rms_rope_flux", flux(2, 2, 5, 8, f32, 2)),
            Case("rms_rope_wan B1 L8 C64 H4 fp32", "rms_rope_wan", wan(1, 8, 64, 4, f32)),
            Case("rms_norm_wan B1 Lq8 Lk5 C64 fp32", "rms_norm_wan", wan_norm(1, 8, 5, 64, f32)),
            Case("adaln B2 L8 C48 rows1 fp32", "adaln", adaln_case(2, 8, 48, 1, f32)),
            Case("adaln B2 L9 C48 rows4 (uneven repeat_e) fp32", "adaln", adaln_case(2, 9, 48, 4, f32)),
            Case("gate_add_wan B2 L8 C48 rows1 fp32", "gate_add", gate_case(2, 8, 48, 1, f32, wan_add)),
            Case("gate_add_flux B2 L8 C48 per-token fp32", "gate_add", gate_case(2, 8, 48, 8, f32, flux_add)),
        ] + fp8_cases(torch, device, small)
    return [
        Case("rms_rope_flux B1 H24 N4096 D128 bf16", "rms_rope_flux", flux(1, 24, 4096, 128, bf16, 1)),
        Case("rms_rope_flux B2 H3 N37 D64 bf16 pe[B]", "rms_rope_flux", flux(2, 3, 37, 64, bf16, 2)),
        Case("rms_rope_flux B2 H24 N37 D128 fp16", "rms_rope_flux", flux(2, 24, 37, 128, f16, 1)),
        Case("rms_rope_flux B1 H24 N1024 D128 fp32", "rms_rope_flux", flux(1, 24, 1024, 128, f32, 1)),
        Case("rms_rope_wan B1 L8190 C5120 H40 bf16", "rms_rope_wan", wan(1, 8190, 5120, 40, bf16)),
        Case("rms_rope_wan B2 L37 C1536 H12 bf16", "rms_rope_wan", wan(2, 37, 1536, 12, bf16)),
        Case("rms_norm_wan B2 Lq4096 Lk512 C5120 bf16", "rms_norm_wan", wan_norm(2, 4096, 512, 5120, bf16)),
        Case("adaln B1 L4096 C3072 rows1 bf16", "adaln", adaln_case(1, 4096, 3072, 1, bf16)),
        Case("adaln B2 L4097 C3072 rows21 (uneven repeat_e) bf16", "adaln", adaln_case(2, 4097, 3072, 21, bf16)),
        Case("adaln B2 L37 C3071 rows1 fp16", "adaln", adaln_case(2, 37, 3071, 1, f16)),
        Case("adaln B1 L1024 C3072 rows1 fp32", "adaln", adaln_case(1, 1024, 3072, 1, f32)),
        Case("gate_add_wan B1 L8190 C5120 rows1 bf16", "gate_add", gate_case(1, 8190, 5120, 1, bf16, wan_add)),
        Case("gate_add_flux B2 L4096 C3072 per-token bf16", "gate_add",
             gate_case(2, 4096, 3072, 4096, bf16, flux_add)),
        Case("gate_add_wan B2 L4097 C3071 rows21 bf16", "gate_add", gate_case(2, 4097, 3071, 21, bf16, wan_add)),
        Case("gate_add_flux B1 L1024 C3072 rows1 fp32", "gate_add", gate_case(1, 1024, 3072, 1, f32, flux_add)),
    ] + fp8_cases(torch, device, small)


def fp8_cases(torch, device, small):
    """FP8 ops: codes compared as bytes, the GEMM by relative error; they need sm_89+ (dispatch declines below)."""
    from fused_dit.ops import fp8_linear, gelu_quantize_fp8, quantize_fp8

    M, K, N = (16, 32, 32) if small else (4096, 3072, 3072)

    def randn(shape, dtype, gen, scale=1.0):
        return (torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * scale).to(dtype)

    def dynamic(gen):
        x = randn((M, K), torch.bfloat16, gen, 3.0)
        codes, scale = quantize_fp8.quantize_fp8_dynamic(x)
        ref_codes, ref_scale = quantize_fp8.quantize_fp8_dynamic_reference(x)
        return (codes, scale.reshape(1)), (ref_codes, ref_scale.reshape(1)), None, (x,)

    def comfy_unit(gen):
        x = randn((M, K), torch.bfloat16, gen, 300.0)     # some values beyond 448: the in-place clamp matters
        x_ref = x.clone()
        codes = quantize_fp8.quantize_fp8_comfy(x)
        ref = quantize_fp8.quantize_fp8_comfy_reference(x_ref)
        return (codes, x), (ref, x_ref), None, (x,)

    def comfy_static(gen):
        x = randn((M, K), torch.bfloat16, gen, 3.0)
        scale_input = torch.tensor(0.02, device=device)
        return (quantize_fp8.quantize_fp8_comfy(x, scale_input),), \
            (quantize_fp8.quantize_fp8_comfy_reference(x, scale_input),), None, (x,)

    def gelu_dynamic(gen):
        h = randn((M, K), torch.bfloat16, gen, 2.0)
        codes, scale = gelu_quantize_fp8.gelu_quantize_fp8_dynamic(h)
        ref_codes, ref_scale = gelu_quantize_fp8.gelu_quantize_fp8_dynamic_reference(h)
        return (codes, scale.reshape(1)), (ref_codes, ref_scale.reshape(1)), None, (h,)

    def gelu_comfy(gen):
        h = randn((M, K), torch.bfloat16, gen, 2.0)
        return (gelu_quantize_fp8.gelu_quantize_fp8_comfy(h),), \
            (gelu_quantize_fp8.gelu_quantize_fp8_comfy_reference(h),), None, (h,)

    def linear(gen):
        x = randn((M, K), torch.bfloat16, gen, 1.0)
        weight = randn((N, K), torch.bfloat16, gen, 0.05)
        bias = randn((N,), torch.bfloat16, gen, 0.1)
        w_codes, w_scale = fp8_linear.quantize_weight_fp8(weight)
        a_codes, a_scale = quantize_fp8.quantize_fp8_dynamic_reference(x)
        module = torch.nn.Linear(K, N, device=device, dtype=torch.bfloat16)
        with torch.no_grad():
            module.weight.copy_(weight)
            module.bias.copy_(bias)
        out = fp8_linear.linear_fp8(x, fp8_linear.fp8_weight_of(module), module.bias)
        # tier 2: the same codes and scales through an fp32 GEMM; tier 1: the unquantised linear in fp32
        emulated = ((a_codes.float() * a_scale) @ (w_codes.float() * w_scale).t() + bias.float()).to(x.dtype)
        exact = torch.nn.functional.linear(x.float(), weight.float(), bias.float())
        return (out,), (emulated,), (exact,), (x,)

    return [
        Case(f"quantize_fp8_dynamic [{M},{K}] bf16", "quantize_fp8_dynamic", dynamic, "bytes", fp8=True),
        Case(f"quantize_fp8_comfy unit scale, clamp in place [{M},{K}] bf16", "quantize_fp8_comfy", comfy_unit,
             "bytes", fp8=True),
        Case(f"quantize_fp8_comfy static scale [{M},{K}] bf16", "quantize_fp8_comfy", comfy_static, "bytes",
             fp8=True),
        # tanh in the kernel and torch's tanhf may differ in the last bit, flipping a rare bf16 rounding
        Case(f"gelu_quantize_fp8_dynamic [{M},{K}] bf16", "gelu_quantize_fp8_dynamic", gelu_dynamic, "bytes",
             fp8=True, max_byte_mismatch=1e-3),
        Case(f"gelu_quantize_fp8_comfy [{M},{K}] bf16", "gelu_quantize_fp8_comfy", gelu_comfy, "bytes", fp8=True,
             max_byte_mismatch=1e-3),
        Case(f"fp8_linear M{M} K{K} N{N} bf16", "fp8_scaled_mm", linear, "relative", fp8=True, max_relative=1e-2),
    ]


def package_cases(device, small):
    """Cases the installed package offers, None when it offers none."""
    from fused_dit import testing
    offered = getattr(testing, "parity_cases", None)
    if offered is None:
        return None
    return [Case(name, op, run) for name, op, run in offered(device, small)]


# ------------------------------------------------------------------------------------------------ judging

def judge_float(testing, torch, outs, comfy, exact):
    numbers = {"vs_comfy": [], "vs_fp64": []}
    failures = []
    for index, (out, ref2, ref1) in enumerate(zip(outs, comfy, exact)):
        report2, report1 = testing.compare(out, ref2), testing.compare(out, ref1)
        eager1 = testing.compare(ref2, ref1)
        numbers["vs_comfy"].append(_brief(report2))
        numbers["vs_fp64"].append(dict(_brief(report1), eager_max_ulp=eager1.max_ulp))
        if out.dtype == torch.float32:
            for what, ref in (("vs eager", ref2), ("vs fp64", ref1)):
                try:
                    testing.assert_close_fp32(out, ref, f"output {index} {what}")
                except AssertionError as exc:
                    failures.append(str(exc))
        else:
            if not report2.passes_ulp_gate():
                failures.append(f"output {index}: {report2.max_ulp} ulp max, "
                                f"{1 - report2.over_one_ulp_fraction:.4%} within 1 ulp of the eager chain, "
                                f"{report2.unwritten} unwritten")
            if report1.max_ulp > eager1.max_ulp + testing.BF16_MAX_ULP:
                failures.append(f"output {index}: {report1.max_ulp} ulp from fp64 where eager is "
                                f"{eager1.max_ulp} ulp away")
    return failures, numbers


def judge_bytes(testing, torch, case, outs, refs):
    numbers = {"byte_mismatch": []}
    failures = []
    for index, (out, ref) in enumerate(zip(outs, refs)):
        if out.dtype in (torch.float32, torch.bfloat16, torch.float16) and out.numel() == 1:
            equal = bool(torch.equal(out.cpu(), ref.cpu()))     # the scale: must be the same fp32 value
            numbers.setdefault("scale_equal", []).append(equal)
            if not equal:
                failures.append(f"output {index}: scale {out.item()!r} != reference {ref.item()!r}")
            continue
        count, fraction = testing.byte_mismatch(out, ref)
        numbers["byte_mismatch"].append({"count": count, "fraction": fraction})
        if fraction > case.max_byte_mismatch:
            failures.append(f"output {index}: {count} elements ({fraction:.4%}) differ in bytes, allowed "
                            f"{case.max_byte_mismatch:.2%}")
    return failures, numbers


def judge_relative(torch, case, outs, comfy, exact):
    numbers = {"relative_vs_emulated": [], "relative_vs_fp32_linear": []}
    failures = []
    for index, (out, ref2, ref1) in enumerate(zip(outs, comfy, exact)):
        o = out.float()
        rel2 = float((o - ref2.float()).norm() / ref2.float().norm().clamp_min(1e-30))
        rel1 = float((o - ref1.float()).norm() / ref1.float().norm().clamp_min(1e-30))
        numbers["relative_vs_emulated"].append(rel2)
        numbers["relative_vs_fp32_linear"].append(rel1)     # the FP8 quantisation error itself, for context
        if not math.isfinite(rel2) or rel2 > case.max_relative:
            failures.append(f"output {index}: relative error {rel2:.3g} vs the emulated FP8 GEMM, allowed "
                            f"{case.max_relative:g}")
    return failures, numbers


def _brief(report):
    return {"max_ulp": report.max_ulp, "over_one_ulp_fraction": report.over_one_ulp_fraction,
            "max_abs_diff": report.max_abs_diff, "unwritten": report.unwritten}


def run_case(case, torch, device, testing, dispatch, ops_pkg, fp8_ok):
    entry = {"name": case.name, "op": case.op}
    if case.fp8 and not fp8_ok[0]:
        entry.update(status="skipped", reason=fp8_ok[1])
        return entry
    seed = testing.random_seed()
    entry["seed"] = seed
    fallbacks = getattr(ops_pkg, "_fallbacks_said", None)
    if fallbacks is not None:
        fallbacks.clear()
    started = time.monotonic()
    with torch.no_grad():   # parity of forward values; autograd state would only add memory and warnings
        outs, comfy, exact, inputs = case.run(testing.generator(seed, device))
    if device == "cuda":
        torch.cuda.synchronize()
    entry["seconds"] = round(time.monotonic() - started, 3)
    choice = dispatch.choose(case.op, *inputs, min_capability=(8, 9) if case.fp8 else None)
    # Each case calls one public op; any shape/dtype fallback logged while it ran means the kernel did not run.
    shape_fallbacks = sorted(f"{op}: {reason}" for op, reason in (fallbacks or ()))
    entry["backend"] = choice.backend if not shape_fallbacks else "eager"
    entry["dtype"] = str(outs[0].dtype).replace("torch.", "")
    if not choice.triton or shape_fallbacks:
        # The public function ran its eager reference: nothing about the kernel was measured.
        entry.update(status="skipped", reason=f"ran eager: {'; '.join(shape_fallbacks) or choice.reason}")
        return entry
    if case.judge == "bytes":
        failures, numbers = judge_bytes(testing, torch, case, outs, comfy)
    elif case.judge == "relative":
        failures, numbers = judge_relative(torch, case, outs, comfy, exact)
    else:
        failures, numbers = judge_float(testing, torch, outs, comfy, exact)
    entry.update(numbers)
    entry["status"] = "failed" if failures else "passed"
    if failures:
        entry["failures"] = failures
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
    from fused_dit import dispatch, testing
    import fused_dit.ops as ops_pkg

    numbers.update({"device": device, "torch": torch.__version__, "fused_dit": getattr(fused_dit, "__version__", None),
                    "fused_dit_file": getattr(fused_dit, "__file__", None), "triton_interpret": not cuda})
    error = dispatch.triton_import_error()
    if error:
        return emit("SKIP", f"{error}: every op runs its eager reference, no kernel to check", numbers)
    import triton
    numbers["triton"] = triton.__version__
    fp8_ok = (True, "")
    if cuda:
        capability = torch.cuda.get_device_capability()
        numbers.update(gpu=torch.cuda.get_device_name(), capability=list(capability))
        if capability < (8, 9):
            fp8_ok = (False, f"FP8 kernels need sm_89+, this GPU is sm_{capability[0]}{capability[1]}")
    else:
        fp8_ok = (False, "FP8 kernels are not checked under the Triton interpreter (its fp8 casts deviate)")

    cases = package_cases(device, small=not cuda)
    numbers["cases_from"] = "fused_dit.testing.parity_cases" if cases is not None else "probe built-in"
    if cases is None:
        cases = builtin_cases(torch, device, small=not cuda)
    results = []
    for case in cases:
        try:
            results.append(run_case(case, torch, device, testing, dispatch, ops_pkg, fp8_ok))
        except Exception as exc:   # one broken case must not hide the others' results
            traceback.print_exc()
            results.append({"name": case.name, "op": case.op, "status": "failed",
                            "failures": [f"crashed: {type(exc).__name__}: {exc}"]})
        if cuda:
            torch.cuda.empty_cache()
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
    try:
        sys.exit(main(json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}))
    except Exception as exc:  # the verdict must be the last line whatever happens
        traceback.print_exc()
        sys.exit(emit("FAIL", f"probe crashed: {type(exc).__name__}: {exc}", {}))
