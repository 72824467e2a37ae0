"""The parity cases of the fused_dit ops: one list, owned by the pack, run by every checker.

The kernel-parity probe (`applier verify --kernels`, in the target's interpreter where only the installed package
is importable) and the GPU gate scripts (benchmarks/gpu_gates.py, benchmarks/gpu_fp8_gates.py) all take their
cases from `parity_cases(device, small)`, so a case, its inputs and its references cannot drift between them.

Each case's `run()` draws fresh random inputs (the seed is returned so a failure can be replayed), runs the public
op (which dispatches to the Triton kernel when it can) into poisoned outputs, runs the op module's own references
(tier 2 `reference_comfy` / `*_reference`: the eager chain ComfyUI runs; tier 1 `reference_fp32`: fp64 math, or
an fp32 linear for the FP8 GEMM) and judges the output:

- bf16/fp16 ("ulp"): <= 1 ulp on >= 99.9% of elements and <= 2 ulp max against tier 2;
- fp32 ("fp32"): |diff| <= 1e-5 + 1e-5 |ref| against tier 2 and tier 1;
- FP8 codes and scales ("bytes"): byte-exact against tier 2 (the fused GELU allows what its module documents);
- FP8 GEMM ("relative"): relative Frobenius error <= 5% against the eager linear in the activation dtype;
- FP8 attention ("fp8_attention"): the ulp gate against its eager FP8 reference (the same codes and tiles in fp32
  torch ops), fp32 SDPA reported; it runs under the interpreter too.

A case whose op ran its eager reference instead of the kernel reports `backend: "eager"` and status "ran_eager",
never "passed": comparing eager with itself measures nothing. References are never re-implemented here.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from . import dispatch, ops as ops_package, testing
from .ops import attention_fp8

FP8_GEMM_MAX_RELATIVE_FROBENIUS = 0.05
FP8_ATTENTION_WITHIN_ONE_ULP = 0.99
# gelu_quantize_fp8's documented parity: the kernel's tanh and torch's tanhf may round differently in the last bit,
# flipping a rare bf16 rounding and so one fp8 code; expected well below 0.1%, each one code apart.
GELU_FP8_MAX_MISMATCH_FRACTION = 1e-3
GELU_FP8_MAX_CODE_DISTANCE = 1

FP8_MIN_CAPABILITY = (8, 9)
INTERPRETER_FP8_SKIP = ("FP8 cases are not run under the Triton interpreter (its fp8 casts deviate from torch's; "
                        "tests/overlays/test_fp8.py checks the kernels' math through fp32 outputs)")

GATE_TEXT = {
    "ulp": f"<= 1 ulp on >= {testing.BF16_WITHIN_ONE_ULP_FRACTION:.1%} and <= {testing.BF16_MAX_ULP} ulp max "
           "vs ComfyUI's eager chain",
    "fp32": f"|diff| <= {testing.FP32_TOLERANCE:g} + {testing.FP32_TOLERANCE:g} * |ref| vs ComfyUI's eager chain "
            "and vs fp64",
    "bytes": "byte-exact vs the eager reference",
    "relative": f"relative Frobenius error <= {FP8_GEMM_MAX_RELATIVE_FROBENIUS:.0%} vs the eager linear",
    "fp8_attention": f"<= 1 ulp on >= {testing.BF16_WITHIN_ONE_ULP_FRACTION:.1%} and <= {testing.BF16_MAX_ULP} ulp "
                     "max vs the kernel's eager FP8 reference (same tiles, same codes), or, where a rounding tie "
                     f"moved a product, >= {FP8_ATTENTION_WITHIN_ONE_ULP:.0%} within 1 ulp and no further from "
                     "fp32 SDPA than the reference plus one rounding of the output dtype",
}


@dataclass
class ComparedOutput:
    """One output of a case with its references; the allowances only matter for the bytes gate."""
    name: str
    actual: torch.Tensor
    tier2: torch.Tensor
    tier1: torch.Tensor | None = None
    max_mismatch_fraction: float = 0.0
    max_code_distance: int = 0


# body(generator) -> (outputs with their references, the input tensors the op's dispatcher looked at)
CaseBody = Callable[[torch.Generator], "tuple[list[ComparedOutput], tuple[torch.Tensor, ...]]"]


@dataclass(frozen=True)
class ParityCase:
    name: str
    op: str                 # the op name dispatch.choose and the fallback log use, e.g. "gate_add_wan"
    family: str             # the op module, e.g. "gate_add"
    dtype: str              # the input dtype
    shape: str              # the shape in words, e.g. "B1 L4096 C3072 rows1"
    gate: str               # "ulp" | "fp32" | "bytes" | "relative"
    device: str
    body: CaseBody = field(repr=False)
    fp8: bool = False
    skip_reason: str | None = None
    params: dict = field(default_factory=dict)   # e.g. {"variant": "dynamic", "rows": 7, "cols": 1000}

    def run(self, seed: int | None = None) -> dict:
        """Run the case once on fresh inputs (or the inputs of `seed`) and judge it; see the module docstring."""
        result = {"name": self.name, "op": self.op, "family": self.family, "dtype": self.dtype, "shape": self.shape,
                  "gate_kind": self.gate, "gate": GATE_TEXT[self.gate]}
        if self.skip_reason:
            result.update(status="skipped", reason=self.skip_reason, passed=False)
            return result
        seed = testing.random_seed() if seed is None else seed
        result["seed"] = seed
        # eager_because logs a shape/dtype fallback once per reason: clear it so this run's fallbacks show up
        ops_package._fallbacks_said.clear()
        started = time.monotonic()
        with torch.no_grad():   # forward values only; autograd state would only add memory
            outputs, inputs = self.body(testing.generator(seed, self.device))
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
        result["seconds"] = round(time.monotonic() - started, 3)
        choice = dispatch.choose(self.op, *inputs, min_capability=FP8_MIN_CAPABILITY if self.fp8 else None)
        fallbacks = sorted(f"{op}: {reason}" for op, reason in ops_package._fallbacks_said)
        result["backend"] = "triton" if choice.triton and not fallbacks else "eager"
        result["backend_reason"] = "; ".join(fallbacks) or choice.reason
        result["shape_fallbacks"] = fallbacks
        failures = _JUDGES[self.gate](outputs, result)
        if result["backend"] != "triton":
            result["status"] = "ran_eager"
            failures.insert(0, f"ran eager: {result['backend_reason']}")
        else:
            result["status"] = "failed" if failures else "passed"
        result["failures"] = failures
        result["passed"] = result["status"] == "passed"
        return result


# ---------------------------------------------------------------------------------------------------------------
# judging
# ---------------------------------------------------------------------------------------------------------------

def _judge_float(outputs: list[ComparedOutput], result: dict) -> list[str]:
    failures = []
    result.update(outputs=[o.name for o in outputs], vs_comfy=[], vs_fp64=[], eager_vs_fp64=[])
    for o in outputs:
        to_tier2 = testing.compare(o.actual, o.tier2)
        result["vs_comfy"].append(to_tier2.as_dict())
        result["vs_fp64"].append(testing.compare(o.actual, o.tier1).as_dict())
        result["eager_vs_fp64"].append(testing.compare(o.tier2, o.tier1).as_dict())
        if o.actual.dtype == torch.float32:
            for what, reference in (("vs eager", o.tier2), ("vs fp64", o.tier1)):
                try:
                    testing.assert_close_fp32(o.actual, reference, f"{o.name} {what}")
                except AssertionError as exc:
                    failures.append(str(exc))
        elif not to_tier2.passes_ulp_gate():
            failures.append(f"{o.name}: {to_tier2.max_ulp} ulp max, {1 - to_tier2.over_one_ulp_fraction:.4%} "
                            f"within 1 ulp of the eager chain, {to_tier2.unwritten} unwritten")
    reports = result["vs_comfy"]
    result["max_abs_diff"] = max(r["max_abs_diff"] for r in reports)
    result["max_ulp"] = max(r["max_ulp"] for r in reports)
    result["within_one_ulp_fraction"] = min(1 - r["over_one_ulp_fraction"] for r in reports)
    return failures


def _judge_bytes(outputs: list[ComparedOutput], result: dict) -> list[str]:
    failures = []
    result.update(outputs=[o.name for o in outputs], byte_mismatch=[])
    for o in outputs:
        actual, expected = o.actual.reshape(-1), o.tier2.reshape(-1)   # 0-dim scales have no bytes view
        count, fraction = testing.byte_mismatch(actual, expected)
        report = testing.compare(actual, expected)
        entry = {"output": o.name, "numel": actual.numel(), "mismatching": count, "fraction": fraction,
                 "max_code_distance": report.max_ulp, "max_abs_diff": report.max_abs_diff}
        result["byte_mismatch"].append(entry)
        if fraction > o.max_mismatch_fraction or (count and report.max_ulp > o.max_code_distance):
            allowed = (f"allowed {o.max_mismatch_fraction:.2%} at <= {o.max_code_distance} code apart"
                       if o.max_mismatch_fraction else "must be byte-exact")
            failures.append(f"{o.name}: {count} of {actual.numel()} elements ({fraction:.4%}) differ in bytes, up to "
                            f"{report.max_ulp} codes apart ({allowed})")
    entries = result["byte_mismatch"]
    result["byte_mismatches"] = sum(e["mismatching"] for e in entries)
    result["max_abs_diff"] = max(e["max_abs_diff"] for e in entries)
    result["max_ulp"] = max(e["max_code_distance"] for e in entries)
    result["within_one_ulp_fraction"] = None
    return failures


def _relative_frobenius(actual: torch.Tensor, reference: torch.Tensor) -> float:
    a, r = actual.detach().float(), reference.detach().float()
    return float((a - r).norm() / r.norm().clamp_min(1e-30))


def _judge_relative(outputs: list[ComparedOutput], result: dict) -> list[str]:
    failures = []
    result.update(outputs=[o.name for o in outputs], relative_frobenius=[])
    for o in outputs:
        entry = {"output": o.name, "vs_comfy": _relative_frobenius(o.actual, o.tier2),
                 "vs_fp32": _relative_frobenius(o.actual, o.tier1),          # the FP8 quantisation error itself
                 "eager_vs_fp32": _relative_frobenius(o.tier2, o.tier1),
                 "max_abs_diff": float((o.actual.float() - o.tier2.float()).abs().max())}
        result["relative_frobenius"].append(entry)
        if not math.isfinite(entry["vs_comfy"]) or entry["vs_comfy"] > FP8_GEMM_MAX_RELATIVE_FROBENIUS:
            failures.append(f"{o.name}: relative Frobenius error {entry['vs_comfy']:.3g} vs the eager linear, allowed "
                            f"{FP8_GEMM_MAX_RELATIVE_FROBENIUS:g}")
    result["max_abs_diff"] = max(e["max_abs_diff"] for e in result["relative_frobenius"])
    result["max_ulp"] = result["within_one_ulp_fraction"] = None
    return failures


def _judge_fp8_attention(outputs: list[ComparedOutput], result: dict) -> list[str]:
    """The ulp gate against the eager FP8 reference; where a few elements miss it (an 8-bit code or a rounded P
    landing on the other side of a tie between the kernel's and the reference's fp32 arithmetic moves a whole
    product), the kernel passes only if it is as close to fp32 attention as its reference is, up to one rounding of
    the output dtype (relative Frobenius), with at least FP8_ATTENTION_WITHIN_ONE_ULP of elements within 1 ulp."""
    failures = _judge_float(outputs, result)
    if not failures:
        return failures
    kept = []
    for o, message in zip(outputs, failures):
        kernel_error = _relative_frobenius(o.actual, o.tier1)
        reference_error = _relative_frobenius(o.tier2, o.tier1)
        within = 1 - testing.compare(o.actual, o.tier2).over_one_ulp_fraction
        rounding = torch.finfo(o.actual.dtype).eps / 2
        if not (kernel_error <= reference_error + rounding and within >= FP8_ATTENTION_WITHIN_ONE_ULP):
            kept.append(f"{message}; error vs fp32 {kernel_error:.4g} against the reference's {reference_error:.4g}")
    return kept


_JUDGES = {"ulp": _judge_float, "fp32": _judge_float, "bytes": _judge_bytes, "relative": _judge_relative,
           "fp8_attention": _judge_fp8_attention}


# ---------------------------------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------------------------------

def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _short(dtype: torch.dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[dtype]


def _randn(shape, dtype, gen, scale=1.0):
    return (torch.randn(shape, generator=gen, device=gen.device, dtype=torch.float32) * scale).to(dtype)


def _rotation_table(leading: tuple[int, ...], half: int, gen: torch.Generator) -> torch.Tensor:
    """[*leading, half, 2, 2] fp32 rows [[cos, -sin], [sin, cos]] of random angles."""
    angle = (torch.rand((*leading, half), generator=gen, device=gen.device) * 2 - 1) * math.pi
    cos, sin = angle.cos(), angle.sin()
    return torch.stack([cos, -sin, sin, cos], dim=-1).view(*leading, half, 2, 2)


def _modulation(B, rows, C, dtype, gen, chunks=6):
    """Rows of a `[B, rows, chunks, C]` modulation tensor split like ComfyUI does (strided views)."""
    return _randn((B, rows, chunks, C), dtype, gen, 0.5).unbind(2)


def _activations(shape, dtype, gen, outliers=False):
    x = torch.randn(shape, generator=gen, device=gen.device) * 3
    if outliers:
        x.view(-1)[::997] *= 400   # beyond +-448: the unit-scale clamp and the dynamic scale's absmax matter
    return x.to(dtype)


def _poison_allocator(numel: int, device) -> None:
    """FP8 ops allocate their own outputs (no `out=`): hand the allocator a poisoned block of that size first, so
    an element the kernel never writes most likely reads as NaN (0x7F) rather than as stale correct bytes."""
    testing.poisoned_empty((max(numel, 1),), torch.float8_e4m3fn, device)


# ---------------------------------------------------------------------------------------------------------------
# case bodies: each calls one public op and its references. Op modules are imported and their functions looked up
# when the case runs: a broken or half-edited op module fails its own cases only, and a test can monkeypatch an op
# ---------------------------------------------------------------------------------------------------------------

def _flux_rms_rope(B, H, N, D, dtype, pe_batch, launch):
    def body(gen):
        from .ops import rms_rope
        qkv = _randn((B, N, 3 * H * D), dtype, gen, 3.0)
        q, k, _ = qkv.view(B, N, 3, H, D).permute(2, 0, 3, 1, 4)          # strided views, as Flux makes them
        q_scale, k_scale = _randn((D,), dtype, gen, 0.2) + 1, _randn((D,), dtype, gen, 0.2) + 1
        pe = _rotation_table((pe_batch, 1, N), D // 2, gen)
        inputs = (q, k, q_scale, k_scale, pe)
        outs = tuple(testing.poisoned_empty((B, H, N, D), dtype, gen.device) for _ in range(2))
        rms_rope.flux_rms_rope(*inputs, out=outs, **launch)
        comfy, exact = rms_rope.flux_reference_comfy(*inputs), rms_rope.flux_reference_fp32(*inputs)
        return [ComparedOutput(n, o, c, e) for n, o, c, e in zip(("q", "k"), outs, comfy, exact)], inputs
    return body


def _wan_rms_rope(B, L, C, H, dtype, freqs_batch, launch):
    def body(gen):
        from .ops import rms_rope
        q, k = _randn((B, L, C), dtype, gen, 3.0), _randn((B, L, C), dtype, gen, 3.0)
        wq, wk = _randn((C,), dtype, gen, 0.2) + 1, _randn((C,), dtype, gen, 0.2) + 1
        freqs = _rotation_table((freqs_batch, L, 1), C // H // 2, gen)
        inputs = (q, k, wq, wk, freqs)
        outs = tuple(testing.poisoned_empty((B, L, H, C // H), dtype, gen.device) for _ in range(2))
        rms_rope.wan_rms_rope(*inputs, H, out=outs, **launch)
        comfy, exact = rms_rope.wan_reference_comfy(*inputs, H), rms_rope.wan_reference_fp32(*inputs, H)
        return [ComparedOutput(n, o, c, e) for n, o, c, e in zip(("q", "k"), outs, comfy, exact)], inputs
    return body


def _wan_rms_norm(B, Lq, Lk, C, dtype, launch):
    def body(gen):
        from .ops import rms_rope
        q, k = _randn((B, Lq, C), dtype, gen, 3.0), _randn((B, Lk, C), dtype, gen, 3.0)
        wq, wk = _randn((C,), dtype, gen, 0.2) + 1, _randn((C,), dtype, gen, 0.2) + 1
        outs = (testing.poisoned_empty(q.shape, dtype, gen.device), testing.poisoned_empty(k.shape, dtype, gen.device))
        rms_rope.wan_rms_norm_qk(q, k, wq, wk, out=outs, **launch)
        return [ComparedOutput(n, o, rms_rope.wan_norm_reference_comfy(x, w), rms_rope.wan_norm_reference_fp32(x, w))
                for n, o, x, w in (("q", outs[0], q, wq), ("k", outs[1], k, wk))], (q, k, wq, wk)
    return body


def _adaln(B, L, C, rows, dtype, launch):
    def body(gen):
        from .ops import adaln
        x = _randn((B, L, C), dtype, gen, 2.0) + 0.3
        shift, scale = _modulation(B, rows, C, dtype, gen)[:2]
        out = testing.poisoned_empty((B, L, C), dtype, gen.device)
        adaln.adaln(x, shift, scale, out=out, **launch)
        return [ComparedOutput("out", out, adaln.reference_comfy(x, shift, scale),
                               adaln.reference_fp32(x, shift, scale))], (x, shift, scale)
    return body


def _gate_add(B, L, C, rows, dtype, rounding_name, launch):
    def body(gen):
        from .ops import gate_add
        rounding = getattr(gate_add, rounding_name)
        x, y = _randn((B, L, C), dtype, gen, 2.0), _randn((B, L, C), dtype, gen, 2.0)
        gate = _modulation(B, rows, C, dtype, gen)[2]
        out = testing.poisoned_empty((B, L, C), dtype, gen.device)
        gate_add.gate_add(x, y, gate, rounding, out=out, **launch)
        return [ComparedOutput("out", out, gate_add.reference_comfy(x, y, gate, rounding),
                               gate_add.reference_fp32(x, y, gate, rounding))], (x, y, gate)
    return body


def _quantize(variant, rows, cols, dtype):
    def body(gen):
        from .ops import quantize_fp8 as qf
        x = _activations((rows, cols), dtype, gen, outliers=True)
        _poison_allocator(x.numel(), x.device)
        if variant == "dynamic":
            codes, scale = qf.quantize_fp8_dynamic(x)
            ref_codes, ref_scale = qf.quantize_fp8_dynamic_reference(x)
            return [ComparedOutput("codes", codes, ref_codes), ComparedOutput("scale", scale, ref_scale)], (x,)
        if variant == "comfy_unit":   # ComfyUI clamps its input in place: the clamped inputs must agree too
            ours, theirs = x.clone(), x.clone()
            codes = qf.quantize_fp8_comfy(ours)
            return [ComparedOutput("codes", codes, qf.quantize_fp8_comfy_reference(theirs)),
                    ComparedOutput("clamped_input", ours, theirs)], (x,)
        scale_input = torch.tensor(0.37, device=x.device)
        return [ComparedOutput("codes", qf.quantize_fp8_comfy(x, scale_input),
                               qf.quantize_fp8_comfy_reference(x, scale_input))], (x,)
    return body


def _gelu_quantize(variant, rows, cols, dtype):
    def body(gen):
        from .ops import gelu_quantize_fp8 as gq
        h = _activations((rows, cols), dtype, gen)
        _poison_allocator(h.numel(), h.device)
        allowance = dict(max_mismatch_fraction=GELU_FP8_MAX_MISMATCH_FRACTION,
                         max_code_distance=GELU_FP8_MAX_CODE_DISTANCE)
        if variant == "dynamic":
            codes, scale = gq.gelu_quantize_fp8_dynamic(h)
            ref_codes, ref_scale = gq.gelu_quantize_fp8_dynamic_reference(h)
            return [ComparedOutput("codes", codes, ref_codes, **allowance),
                    ComparedOutput("scale", scale, ref_scale)], (h,)
        return [ComparedOutput("codes", gq.gelu_quantize_fp8_comfy(h), gq.gelu_quantize_fp8_comfy_reference(h),
                               **allowance)], (h,)
    return body


def _linear_fp8_dynamic(M, K, N, dtype):
    """A bf16/fp16 Linear through the overlay's FP8 path; tier 2 is the module's stock F.linear in that dtype."""
    def body(gen):
        from .ops import fp8_linear as fl
        x = torch.randn(M, K, generator=gen, device=gen.device).to(dtype)
        w = (torch.randn(N, K, generator=gen, device=gen.device) / K ** 0.5).to(dtype)
        b = (0.02 * torch.randn(N, generator=gen, device=gen.device)).to(dtype)
        w_codes, w_scale = fl.quantize_weight_fp8(w)
        weight = fl.Fp8Weight(w_codes, w_scale, static_input=False, input_scale=None, source_key=())
        out = fl.linear_fp8(x, weight, b)
        eager = torch.nn.functional.linear(x, w, b)
        exact = torch.nn.functional.linear(x.float(), w.float(), b.float())
        return [ComparedOutput("out", out, eager, exact)], (x,)
    return body


def _linear_fp8_comfy_module(M, K, N, dtype):
    """A ComfyUI fp8 checkpoint Linear (e4m3 weight, scale_weight, unit input scale) through the overlay, against
    the eager chain of ComfyUI's fp8_linear: the in-place clamp, the fp8 cast, torch._scaled_mm."""
    def body(gen):
        from .integration import fp8_modules as fm
        from .ops import fp8_linear as fl
        from .ops import quantize_fp8 as qf
        x = torch.randn(M, K, generator=gen, device=gen.device).to(dtype) * 40   # some beyond 448
        w = (torch.randn(N, K, generator=gen, device=gen.device) / K ** 0.5).to(dtype)
        b = (0.02 * torch.randn(N, generator=gen, device=gen.device)).to(dtype)
        w_codes, w_scale = fl.quantize_weight_fp8(w)
        module = torch.nn.Linear(K, N, bias=True, device=x.device, dtype=dtype)
        module.weight.data, module.bias.data = w_codes.clone(), b.clone()
        module.scale_weight, module.scale_input = w_scale.clone(), None
        ours, theirs = x.clone(), x.clone()
        out = fl.linear_fp8(ours, fm.fp8_weight_of(module), fm.module_bias(module, ours))
        eager = torch._scaled_mm(qf.quantize_fp8_comfy_reference(theirs).contiguous(), module.weight.t(),
                                 out_dtype=dtype, bias=module.bias, scale_a=torch.ones((), device=x.device),
                                 scale_b=module.scale_weight)
        eager = eager[0] if isinstance(eager, tuple) else eager
        return [ComparedOutput("out", out, eager), ComparedOutput("clamped_input", ours, theirs)], (x,)
    return body


# ---------------------------------------------------------------------------------------------------------------
# the lists
# ---------------------------------------------------------------------------------------------------------------

def _float_cases(device: str, small: bool, launches: dict) -> list[ParityCase]:
    bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32

    def launch(kind):
        # the op's own default unless the caller gives another setting (`launch=` of the op)
        return {"launch": launches[kind]} if kind in launches else {}

    def case(label, op, family, dtype, body, suffix=""):
        name = f"{label} {_short(dtype)}{suffix}"
        return ParityCase(name=name, op=op, family=family, dtype=_dtype_name(dtype), shape=label.split(" ", 1)[1],
                          gate="fp32" if dtype == fp32 else "ulp", device=device, body=body)

    def flux(B, H, N, D, dtype, pe_batch=1):
        return case(f"rms_rope_flux B{B} H{H} N{N} D{D}", "rms_rope_flux", "rms_rope", dtype,
                    _flux_rms_rope(B, H, N, D, dtype, pe_batch, launch("rms_rope_flux")),
                    " pe[B]" if pe_batch > 1 else "")

    def wan(B, L, C, H, dtype, freqs_batch=1):
        return case(f"rms_rope_wan B{B} L{L} C{C} H{H}", "rms_rope_wan", "rms_rope", dtype,
                    _wan_rms_rope(B, L, C, H, dtype, freqs_batch, launch("rms_rope_wan")),
                    " freqs[B]" if freqs_batch > 1 else "")

    def wan_norm(B, Lq, Lk, C, dtype):
        return case(f"rms_norm_wan B{B} Lq{Lq} Lk{Lk} C{C}", "rms_norm_wan", "rms_rope", dtype,
                    _wan_rms_norm(B, Lq, Lk, C, dtype, launch("rms_rope_wan")))

    def rows_words(rows, L, mark_uneven=True):
        if rows == L and rows > 1:
            return "per-token"
        uneven = mark_uneven and rows > 1 and L % rows != 0
        return f"rows{rows}" + (" (uneven repeat_e)" if uneven else "")

    def adaln(B, L, C, rows, dtype):
        return case(f"adaln B{B} L{L} C{C} {rows_words(rows, L)}", "adaln", "adaln", dtype,
                    _adaln(B, L, C, rows, dtype, launch("adaln")))

    def gate(B, L, C, rows, dtype, tag):
        words = rows_words(rows, L, mark_uneven=False)   # gpu_gates.py never marked gate_add's uneven rows
        return case(f"gate_add_{tag} B{B} L{L} C{C} {words}", f"gate_add_{tag}", "gate_add", dtype,
                    _gate_add(B, L, C, rows, dtype, tag.upper(), launch("gate_add")))

    if small:   # fp32 only: the interpreter truncates bf16 casts; shapes it gets through in seconds
        return [
            flux(1, 2, 8, 16, fp32), flux(2, 2, 5, 8, fp32, pe_batch=2),
            wan(1, 8, 64, 4, fp32), wan(2, 5, 48, 3, fp32, freqs_batch=2),
            wan_norm(1, 8, 5, 64, fp32),
            adaln(2, 8, 48, 1, fp32), adaln(2, 9, 48, 4, fp32), adaln(1, 6, 40, 6, fp32),
            gate(2, 8, 48, 1, fp32, "wan"), gate(2, 8, 48, 8, fp32, "flux"), gate(2, 9, 40, 4, fp32, "wan"),
        ]
    # the real DiT shapes benchmarks/gpu_gates.py runs (names unchanged so result files compare; the odd-C adaln
    # cases became C=3068 when rows of C % 4 != 0 started deferring to eager: a partial 512-channel step instead)
    cases = [flux(1, 24, N, 128, bf16) for N in (4096, 16384)]
    cases += [flux(2, 3, 37, 64, bf16, pe_batch=2), flux(2, 24, 37, 128, fp16), flux(1, 24, 4096, 128, fp32)]
    cases += [wan(1, 32760, 5120, 40, bf16), wan(2, 4096, 5120, 40, bf16, freqs_batch=2),
              wan(2, 37, 1536, 12, bf16), wan(1, 1024, 5120, 40, fp32)]
    cases += [wan_norm(2, 32760, 512, 5120, bf16)]
    cases += [adaln(1, L, 3072, 1, bf16) for L in (4096, 16384)]
    cases += [adaln(1, 32760, 5120, 1, bf16), adaln(2, 4096, 3072, 4096, bf16), adaln(2, 32760, 5120, 21, bf16),
              adaln(2, 4097, 3072, 21, bf16), adaln(2, 37, 3068, 1, bf16), adaln(2, 37, 3068, 1, fp16),
              adaln(1, 4096, 3072, 1, fp32)]
    for tag in ("wan", "flux"):
        cases += [gate(1, 32760, 5120, 1, bf16, tag), gate(2, 16384, 3072, 16384, bf16, tag),
                  gate(2, 4097, 3071, 21, bf16, tag), gate(1, 4096, 3072, 1, fp32, tag)]
    return cases


def _fp8_cases(device: str, small: bool) -> list[ParityCase]:
    skip = None
    if small or dispatch.interpreting() or not device.startswith("cuda"):
        skip = INTERPRETER_FP8_SKIP
    elif torch.cuda.get_device_capability(device) < FP8_MIN_CAPABILITY:
        major, minor = torch.cuda.get_device_capability(device)
        skip = f"FP8 kernels need sm_89+, this GPU is sm_{major}{minor}"

    def case(name, op, family, dtype, shape, gate, body, **params):
        return ParityCase(name=name, op=op, family=family, dtype=_dtype_name(dtype), shape=shape, gate=gate,
                          device=device, body=body, fp8=True, skip_reason=skip, params=params)

    quantize_shapes = ((16, 32),) if small else ((16384, 3072), (4096 + 512, 3072), (7, 1000))
    gelu_shape = (16, 32) if small else (16384, 3072)
    M, K, N = (16, 32, 32) if small else (16384, 3072, 12288)
    ops = {"dynamic": "quantize_fp8_dynamic", "comfy_unit": "quantize_fp8_comfy", "comfy_static": "quantize_fp8_comfy"}
    # small: the cases are listed (skipped, with the reason) once per op, not per dtype
    quantize_dtypes = (torch.bfloat16,) if small else (torch.bfloat16, torch.float16, torch.float32)
    cases = []
    for dtype in quantize_dtypes:
        for rows, cols in quantize_shapes:
            for variant, op in ops.items():
                cases.append(case(f"quantize_fp8 {variant} [{rows},{cols}] {_short(dtype)}", op, "quantize_fp8",
                                  dtype, f"[{rows},{cols}]", "bytes", _quantize(variant, rows, cols, dtype),
                                  variant=variant, rows=rows, cols=cols))
    for dtype in quantize_dtypes[:1] if small else (torch.bfloat16, torch.float16):
        rows, cols = gelu_shape
        for variant in ("dynamic", "comfy_unit"):
            op = "gelu_quantize_fp8_dynamic" if variant == "dynamic" else "gelu_quantize_fp8_comfy"
            cases.append(case(f"gelu_quantize_fp8 {variant} [{rows},{cols}] {_short(dtype)}", op, "gelu_quantize_fp8",
                              dtype, f"[{rows},{cols}]", "bytes", _gelu_quantize(variant, rows, cols, dtype),
                              variant=variant, rows=rows, cols=cols))
    bf16 = torch.bfloat16
    cases.append(case(f"fp8_linear dynamic M{M} K{K} N{N} bf16", "fp8_scaled_mm", "fp8_linear", bf16,
                      f"M{M} K{K} N{N}", "relative", _linear_fp8_dynamic(M, K, N, bf16),
                      variant="dynamic", M=M, K=K, N=N))
    cases.append(case(f"fp8_linear comfy fp8 module M{M} K{K} N{N} bf16", "fp8_scaled_mm", "fp8_linear", bf16,
                      f"M{M} K{K} N{N}", "bytes", _linear_fp8_comfy_module(M, K, N, bf16),
                      variant="comfy_module", M=M, K=K, N=N))
    return cases


def _attention_fp8(B, H, S, D, dtype):
    def body(gen):
        q = _randn((B, H, S, D), dtype, gen, 0.5)
        k = (_randn((B, H, S, D), torch.float32, gen) + _randn((B, H, 1, D), torch.float32, gen)).mul(0.5).to(dtype)
        v = _randn((B, H, S, D), dtype, gen)
        launch = attention_fp8.launch_for_device(q.device)
        out = ComparedOutput("out", attention_fp8.attention_fp8(q, k, v),
                             attention_fp8.attention_fp8_reference(q, k, v, launch=launch),
                             attention_fp8.attention_exact_reference(q, k, v).to(dtype))
        return [out], (q, k, v)
    return body


def _attention_fp8_cases(device: str, small: bool) -> list[ParityCase]:
    """The FP8 attention kernel against its eager FP8 reference: on the interpreter too (it rounds to e4m3's grid
    itself there, ops/attention_fp8.py), bf16 at a tiny shape; Flux-dev 1024's shape on an sm_89+ GPU."""
    skip = None
    if device.startswith("cuda") and torch.cuda.get_device_capability(device) < FP8_MIN_CAPABILITY:
        major, minor = torch.cuda.get_device_capability(device)
        skip = f"the FP8 attention kernel needs sm_89+, this GPU is sm_{major}{minor}"
    B, H, S, D = (1, 2, 48, 64) if small else (1, 24, 4608, 128)
    cases = []
    for dtype in (torch.bfloat16,) if small else (torch.bfloat16, torch.float16):
        cases.append(ParityCase(name=f"attention_fp8 B{B} H{H} S{S} D{D} {_short(dtype)}", op="attention_fp8",
                                family="attention_fp8", dtype=_dtype_name(dtype), shape=f"B{B} H{H} S{S} D{D}",
                                gate="fp8_attention", device=device, body=_attention_fp8(B, H, S, D, dtype),
                                skip_reason=skip, params={"B": B, "H": H, "S": S, "D": D}))
    return cases


def parity_cases(device: str, small: bool, launches: dict | None = None) -> list[ParityCase]:
    """Every parity case of the pack on `device`.

    small=True: tiny fp32 shapes for TRITON_INTERPRET=1 on CPU (FP8 cases are listed with a skip reason);
    small=False: the real DiT shapes of the GPU gates, FP8 included (skipped below sm_89).
    launches: launch settings other than the ops' defaults, by kind ("rms_rope_flux": an ops.rms_rope.FluxLaunch,
    "rms_rope_wan": a WanLaunch, also for the norm-only cases, "adaln": an AdalnLaunch, "gate_add": a
    GateAddLaunch), so a setting a sweep found can be held to the gates before it becomes the default.
    """
    unknown = set(launches or ()) - set(LAUNCH_KINDS)
    if unknown:
        raise ValueError(f"no launch setting kind {sorted(unknown)}; known: {', '.join(LAUNCH_KINDS)}")
    return _float_cases(device, small, launches or {}) + _fp8_cases(device, small) + _attention_fp8_cases(device, small)


# the kinds of launch setting parity_cases takes: (op module, the name of its default)
LAUNCH_KINDS = {"rms_rope_flux": ("rms_rope", "FLUX_LAUNCH"), "rms_rope_wan": ("rms_rope", "WAN_LAUNCH"),
                "adaln": ("adaln", "LAUNCH"), "gate_add": ("gate_add", "LAUNCH")}
