"""attention-kernels: attention kernels per DiT shape on one GPU, exact and FP8, speed and error.

Per shape (Flux-dev at 1024, 2048 and 4096, Wan 2.1 14B 480x832x81 self-attention): TFLOPS (4 B H Lq Lkv D / time)
of torch's SDPA backends (cuDNN, FLASH, EFFICIENT, each forced through torch.nn.attention.sdpa_kernel), of the
pack's FP8 kernel (fused_dit.ops.attention_fp8, quantisers included) at every launch of a small sweep (tiles,
warps, stages, V's layout; the best recorded), of the same kernel on SageAttention 2's recipe (`fp8_sage2`: Q's
INT8 scales per warp's rows, smoothed K, e4m3 P V with V's scales per channel, the two-level fp32 sum; the launch
`sage2_launch_for` gives the GPU, recorded as `fp8_sage2_launch`), of SageAttention where it is importable, as
ComfyUI's `--use-sage-attention` calls it (`sage`: whichever version is installed), of SageAttention 2's sm90 path
(`sage2`: `sageattn_qk_int8_pv_fp8_cuda_sm90` with its defaults, INT8 Q K^T per thread with smoothed K, FP8 P V,
fp32+fp32 accumulation; what `sageattn` runs on an sm_90 GPU) and of FlashAttention-4 (`fa4`: `flash_attn.cute`, bf16,
exact) where they are importable (else recorded as skipped, with the reason); as fractions of the H200's dense bf16
and FP8 peaks. And per call, against fp32
attention on the same inputs (a fixed subset of query rows against all keys): relative Frobenius error and cosine
similarity of the outputs of the FP8 kernel (both recipes), sage and bf16 SDPA, on plain Gaussian inputs and on
DiT-like ones (a few large-magnitude channels and a per-channel key offset, then RMSNorm with a learned-looking scale).
cuDNN's FP8 SDPA runs as the pack calls it (`cudnn_fp8`) and with q and k rotated by the normalised Hadamard matrix
inside the Triton quantiser (`cudnn_fp8_rotated`: ops/rotate_quantize_fp8.py; error also with V's token mean taken
out, `cudnn_fp8_rotated_v_mean`); `cudnn_fp8_rotated_parts` times cuDNN's kernel alone on operands quantised once
and the quantisation alone (the issue's target is the whole within a small fraction of the kernel alone).

    python -m benchmarks attention-kernels --out benchmarks/results/attention-kernels-h200.json --budget-s 210
    python -m benchmarks attention-kernels --compile-only --out benchmarks/results/attention-fp8-compile.json
    TRITON_INTERPRET=1 python -m benchmarks attention-kernels --smoke --out /tmp/smoke.json   # CPU, tiny shape
    python -m benchmarks attention-kernels --from FILE --write-table [PATH]   # the fp8 mode's yardstick table

`bash scripts/sage2_for_device.sh` builds SageAttention 2 on the device and runs this command with `--no-sweep`
(the first pass alone: the rows that decide the mode and its yardstick, `fp8_sage2` beside `sage2` included). That
is the device run that measures the kernel on SageAttention 2's recipe against SageAttention 2 itself, on the H200
(kit built here first, `scripts/sage2_for_device.sh --kit GIT_DIR`; then on the device, carrying `.sage2-device`;
the longer limits give the first pass room for the added row, unmeasured):

    BENCH_LIMIT=240 BUDGET_S=180 bash scripts/sage2_for_device.sh

The JSON is rewritten after every measurement, and each measurement records its error instead of stopping the
run, so a run cut off by its time limit still leaves what it measured. Measurements run in order of importance
(the exact backends ComfyUI picks, SageAttention 2 and FlashAttention-4, the FP8 kernel's default launch and its
launch on SageAttention 2's recipe, sage, the errors; then the sweep; EFFICIENT last) and stop when --budget-s is
spent, the rest recorded as skipped. `--compile-only` builds the FP8 kernels
for sm_89 and sm_90 without a GPU (Triton's ahead-of-time compile) at every launch of the sweep and the recipe's.

`--write-table` derives the `fp8` attention mode's yardstick from a run with SageAttention 2 in it
(fused_dit/attention_yardstick.json, citing the run's keys): per measured shape with `sage2` errors on both input
kinds, a band of key lengths (from the geometric midpoint with the next smaller measured shape, or half its own
length, to the midpoint with the next larger, or twice its length) at that head dim, SageAttention 2's errors there,
and `within`: the pack's lossy rows (`fp8`, `cudnn_fp8`, `fp8_sage2`, `cudnn_fp8_rotated`) whose error was at most
SageAttention 2's on every kind.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

from . import results

# NVIDIA's H200 SXM datasheet, dense (no sparsity): the benchmark's yardsticks, not the product's
H200_BF16_DENSE_TFLOPS = 989.4
H200_FP8_DENSE_TFLOPS = 1978.9
# name -> (B, H, Lq, Lkv, D): Flux-dev's joint attention (image tokens + 512 text tokens), Wan's self-attention
SHAPES = {
    "flux-dev-1024": (1, 24, 4608, 4608, 128),
    "flux-dev-2048": (1, 24, 16896, 16896, 128),
    "flux-dev-4096": (1, 24, 65792, 65792, 128),
    "wan2.1-14b-480x832x81": (1, 40, 32760, 32760, 128),
}
SMOKE_SHAPES = {"smoke": (1, 2, 80, 72, 64)}
REFERENCE_ROWS = 1024          # query rows compared against fp32 attention (all keys)
OUTLIER_CHANNELS = 4           # large-magnitude channels per head in DiT-like q and k
OUTLIER_GAIN = 10.0
SDPA_BACKENDS = ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION")
INPUT_KINDS = ("gaussian", "dit_like")
YARDSTICK = results.REPO / "overlays" / "fused_dit" / "attention_yardstick.json"
# the pack's lossy candidates, as the fp8 mode's table names them
LOSSY_ROWS = ("fp8", "cudnn_fp8", "fp8_sage2", "cudnn_fp8_rotated")


class Unavailable(Exception):
    """A row whose package (or GPU) is not here: recorded as skipped with this reason, not as an error."""


def sweep_launches(smoke: bool = False) -> list:
    """The FP8 kernel's launches to time: tiles, warps and stages around the default (after Triton's
    fused-attention tutorial for FP8 on Hopper), in the default formats (INT8 Q K^T, 16-bit P V), with e4m3 P V
    (V's layout both ways) and all e4m3; each point records its error too."""
    from fused_dit.ops.attention_fp8 import AttentionFP8Launch as L, sage2_recipe
    if smoke:
        return [L(32, 32, 4, 1), L(32, 32, 4, 1, pv_fp8=True), L(32, 32, 4, 1, qk_int8=False, pv_fp8=True)]
    exact_pv = [L(128, 128, 8, 3), L(128, 128, 8, 4), L(128, 64, 8, 3), L(128, 64, 4, 3), L(64, 128, 4, 3),
                L(128, 128, 4, 3)]
    fp8_pv = [L(128, 128, 8, 3, pv_fp8=True), L(128, 128, 8, 4, pv_fp8=True), L(128, 64, 8, 3, pv_fp8=True),
              L(128, 128, 8, 3, pv_fp8=True, v_transposed=False), L(128, 128, 8, 3, qk_int8=False, pv_fp8=True)]
    recipe = [sage2_recipe(L(128, 128, 8, 3)), sage2_recipe(L(128, 64, 4, 3))]      # SageAttention 2's recipe
    return exact_pv + fp8_pv + recipe


def add_arguments(parser) -> None:
    parser.add_argument("--out", type=Path, help="the JSON to write (rewritten after each measurement)")
    parser.add_argument("--from", dest="source", type=Path, help="derive the yardstick from this run, measure nothing")
    parser.add_argument("--write-table", nargs="?", const=YARDSTICK, type=Path, default=None,
                        help=f"with --from: write the fp8 mode's yardstick (default "
                             f"{YARDSTICK.relative_to(results.REPO)})")
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=list(SHAPES), metavar="SHAPE",
                        help=f"shapes to run (default all: {', '.join(SHAPES)})")
    parser.add_argument("--budget-s", type=float, default=210.0,
                        help="stop starting measurements after this many seconds (the rest recorded as skipped)")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per measurement (median), after one warmup")
    parser.add_argument("--compile-only", action="store_true",
                        help="build the FP8 kernels for sm_89 and sm_90 without a GPU, every launch of the sweep")
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny shape on the CPU under TRITON_INTERPRET=1 (the code paths, no figures)")
    parser.add_argument("--no-sweep", action="store_true",
                        help="the first pass alone (exact backends, SageAttention, FlashAttention-4, the FP8 kernel's "
                             "default launch, cuDNN's FP8 SDPA, the errors): no FP8 sweep, no EFFICIENT")


def import_paths(options) -> list[Path]:
    return [results.REPO / "overlays"]


def run(options, parser) -> int:
    if options.source is not None:
        report = json.loads(options.source.read_text(encoding="utf-8"))
        table = derive_yardstick(report)
        if not table["bands"]:
            parser.error(f"{options.source}: no shape with SageAttention 2's error on both input kinds")
        if options.write_table is None:
            print(json.dumps(table["bands"], indent=1))
        else:
            print(f"wrote {write_yardstick(report, options.source, options.write_table)}")
        return 0
    if options.out is None:
        parser.error("--out is required to measure (or --from FILE to derive the yardstick)")
    if options.compile_only:
        return compile_only(options)
    return Run(options).all()


# ------------------------------------------------------------------------------------------------ compile check
def compile_only(options) -> int:
    """The sm_89 / sm_90 build of the FP8 kernels at every launch of the sweep: target, tensor-core (MMA)
    instructions, shared memory, cubin size, or the compiler's error."""
    import re
    os.environ.pop("TRITON_INTERPRET", None)
    from fused_dit.ops import attention_fp8 as af
    report = {"environment": results.environment("cpu"), "what": "the FP8 attention kernels, and the quantiser of "
              "cuDNN FP8's fused rotation, compiled ahead of time for sm_89 (Ada) and sm_90 (Hopper) without a GPU",
              "builds": []}
    for arch in (89, 90):
        default, recipe = af.launch_for(divmod(arch, 10)), af.sage2_launch_for(divmod(arch, 10))
        for launch in [default, recipe] + [l for l in sweep_launches() if l not in (default, recipe)]:
            entry = {"arch": f"sm_{arch}", "launch": launch.label, "default": launch == default,
                     "sage2_recipe": launch == recipe}
            try:
                for name, asm in af.compile_for(arch, launch=launch).items():
                    entry[name] = {
                        "target": re.search(r"\.target\s+(\S+)", asm["ptx"]).group(1),
                        "mma": sorted(set(re.findall(r"(?:mma\.sync\.aligned|wgmma\.mma_async\.sync\.aligned)"
                                                     r"\.[\w.]+", asm["ptx"]))),
                        "shared_bytes": asm["shared_bytes"], "cubin_bytes": len(asm["cubin"])}
            except Exception as error:           # a launch that does not fit this GPU is a finding, not a stop
                entry["error"] = f"{type(error).__name__}: {error}"[:400]
            report["builds"].append(entry)
            results.write_json(report, options.out)
    from fused_dit.ops import rotate_quantize_fp8
    report["rotate_quantize_fp8"] = rotate_quantize_fp8.compile_report()   # cuDNN FP8's fused rotation
    results.write_json(report, options.out)
    print(f"wrote {options.out}")
    return 0


# ------------------------------------------------------------------------------------------------ the GPU run
class Run:
    """One run: the report, the clock, and a writer after every measurement."""

    def __init__(self, options):
        self.options = options
        self.started = time.monotonic()
        self.smoke = options.smoke
        if self.smoke:
            os.environ.setdefault("TRITON_INTERPRET", "1")
        import torch
        self.torch = torch
        self.device = "cpu" if self.smoke else "cuda"
        self.shapes = SMOKE_SHAPES if self.smoke else {name: SHAPES[name] for name in options.shapes}
        self.report = {"environment": results.environment(self.device),
                       "peaks_tflops": {"bf16_dense": H200_BF16_DENSE_TFLOPS, "fp8_dense": H200_FP8_DENSE_TFLOPS},
                       "budget_s": options.budget_s, "repeats": options.repeats, "reference_rows": REFERENCE_ROWS,
                       "shapes": {name: {"b_h_lq_lkv_d": list(shape), "flops": flops(shape)}
                                  for name, shape in self.shapes.items()}}
        self.inputs: dict = {}

    # plumbing
    def write(self) -> None:
        self.report["elapsed_s"] = round(time.monotonic() - self.started, 1)
        results.write_json(self.report, self.options.out)

    def measure(self, shape_name: str, section: str, key: str, fn) -> None:
        """report.shapes[shape][section][key] = fn(), or the error it raised, or skipped past the budget."""
        slot = self.report["shapes"][shape_name].setdefault(section, {})
        if time.monotonic() - self.started > self.options.budget_s:
            slot[key] = {"skipped": f"past the time budget of {self.options.budget_s:g} s"}
        else:
            try:
                slot[key] = fn()
            except Unavailable as why:
                slot[key] = {"skipped": str(why)[:400]}
            except Exception as error:
                slot[key] = {"error": f"{type(error).__name__}: {error}"[:400]}
            finally:
                if self.device == "cuda":
                    self.torch.cuda.empty_cache()
        self.write()

    def time_ms(self, fn) -> float:
        """Median milliseconds after one warmup: CUDA events on the GPU (the attention family's own timer), the
        wall clock on the CPU."""
        if self.device == "cuda":
            from fused_dit.integration.attention import cuda_timer
            return cuda_timer(fn, repeats=self.options.repeats)
        fn()
        started = time.perf_counter()
        fn()
        return (time.perf_counter() - started) * 1e3

    def speed(self, shape_name: str, fn, fp8: bool = False) -> dict:
        ms = self.time_ms(fn)
        tflops = flops(self.shapes[shape_name]) / (ms * 1e-3) / 1e12
        entry = {"ms": round(ms, 3), "tflops": round(tflops, 1),
                 "fraction_of_bf16_peak": round(tflops / H200_BF16_DENSE_TFLOPS, 3)}
        if fp8:
            entry["fraction_of_fp8_peak"] = round(tflops / H200_FP8_DENSE_TFLOPS, 3)
        if self.device == "cuda":
            torch = self.torch
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            fn()
            torch.cuda.synchronize()
            entry["peak_mib_over_inputs"] = round((torch.cuda.max_memory_allocated() - base) / 2 ** 20, 1)
        return entry

    # inputs
    def qkv(self, shape_name: str, kind: str):
        key = (shape_name, kind)
        if key not in self.inputs:
            self.inputs = {k: v for k, v in self.inputs.items() if k[0] == shape_name}   # one shape held at a time
            self.inputs[key] = make_inputs(self.torch, self.shapes[shape_name], kind, self.device)
        return self.inputs[key]

    def reference(self, shape_name: str, kind: str):
        """(query row indices, fp32 attention of those rows against all keys) for these inputs."""
        key = (shape_name, kind, "reference")
        if key not in self.inputs:
            q, k, v = self.qkv(shape_name, kind)
            rows = self.torch.linspace(0, q.shape[2] - 1, min(REFERENCE_ROWS, q.shape[2]),
                                       device=q.device).round().long().unique()
            exact = self.torch.nn.functional.scaled_dot_product_attention(q[:, :, rows].float(), k.float(), v.float())
            self.inputs[key] = (rows, exact)
        return self.inputs[key]

    def error(self, shape_name: str, kind: str, out) -> dict:
        rows, exact = self.reference(shape_name, kind)
        return error_against(self.torch, out[:, :, rows], exact)

    # the callables measured
    def sdpa(self, backend: str | None, q, k, v):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        attend = self.torch.nn.functional.scaled_dot_product_attention
        if backend is None:
            return lambda: attend(q, k, v)

        def call():
            with sdpa_kernel([getattr(SDPBackend, backend)]):
                return attend(q, k, v)
        return call

    def fp8(self, launch, q, k, v):
        from fused_dit.ops import attention_fp8 as af
        return lambda: af.attention_fp8_triton(q, k, v, launch=launch)

    def cudnn_fp8(self, q, k, v, **options):
        """cuDNN's FP8 SDPA with ac.Fp8Options(**options) (none: the plain path)."""
        from fused_dit.ops import attention_cudnn_fp8 as ac
        why = ac.refusal(q, k, v)
        if why:
            raise RuntimeError(why)
        return lambda: ac.attention_cudnn_fp8(q, k, v, ac.Fp8Options(**options))

    def cudnn_fp8_parts(self, q, k, v, **options) -> dict:
        """Milliseconds of cuDNN's FP8 SDPA alone (operands quantised once) and of the quantisation alone."""
        from fused_dit.ops import attention_cudnn_fp8 as ac
        self.cudnn_fp8(q, k, v)                          # refused: raised, recorded as the row's error
        chosen = ac.Fp8Options(**options)
        plan, codes = ac.plan_for(q, k), ac.operands(q, k, v, chosen)
        kernel_ms = self.time_ms(lambda: ac.execute(plan, codes, q.dtype))
        quantize_ms = self.time_ms(lambda: ac.operands(q, k, v, chosen))
        return {"kernel_ms": round(kernel_ms, 3), "quantize_ms": round(quantize_ms, 3),
                "whole_over_kernel": round((kernel_ms + quantize_ms) / kernel_ms, 4)}

    def sage(self, q, k, v, smooth_k: bool = False):
        from sageattention import sageattn     # ComfyUI's binding passes smooth_k=False
        return lambda: sageattn(q, k, v, tensor_layout="HND", is_causal=False, sm_scale=None, smooth_k=smooth_k)

    def on_gpu(self, what: str, capability: tuple | None = None) -> None:
        if self.device != "cuda":
            raise Unavailable(f"{what} needs a CUDA GPU")
        if capability is not None and self.torch.cuda.get_device_capability() != capability:
            raise Unavailable(f"{what} is measured on sm_{capability[0]}{capability[1]} only")

    def sage2(self, q, k, v):
        """SageAttention 2's sm90 kernel with its defaults (per-thread INT8 Q K^T, smoothed K, FP8 P V, fp32+fp32)."""
        module = sage2_module()
        self.on_gpu("SageAttention 2's sm90 path", (9, 0))
        return lambda: module.sageattn_qk_int8_pv_fp8_cuda_sm90(q, k, v, tensor_layout="HND", is_causal=False)

    def fa4(self, q, k, v):
        """FlashAttention-4 (CuTe DSL) on the `[B, L, H, D]` layout it takes; its output back as `[B, H, L, D]`."""
        attend = fa4_function()
        self.on_gpu("FlashAttention-4")
        qs, ks, vs = (t.transpose(1, 2).contiguous() for t in (q, k, v))   # as a model's [B, L, H * D] view

        def call():
            out = attend(qs, ks, vs, causal=False)
            return (out[0] if isinstance(out, tuple) else out).transpose(1, 2)
        return call

    # the run
    def all(self) -> int:
        from fused_dit.ops import attention_fp8 as af
        self.report["sageattention"] = sage_version()
        self.report["sageattention_source"] = os.environ.get("SAGEATTENTION_SOURCE")
        self.report["flash_attn_4"] = fa4_version()
        default = af.launch_for_device(self.torch.device(self.device)) if not self.smoke else sweep_launches(True)[0]
        recipe = af.sage2_launch_for_device(self.torch.device(self.device)) if not self.smoke else \
            af.sage2_recipe(default)
        self.report["fp8_default_launch"] = default.label
        self.report["fp8_sage2_launch"] = recipe.label
        launches = [default] + [l for l in sweep_launches(self.smoke) if l != default]
        exact_backends = SDPA_BACKENDS[:2] if not self.smoke else ()
        for name in self.shapes:                          # first pass: what decides the mode
            q, k, v = self.qkv(name, "dit_like")
            for backend in exact_backends:
                self.measure(name, "speed", f"sdpa_{backend}", lambda: self.speed(name, self.sdpa(backend, q, k, v)))
            self.measure(name, "speed", "sage2", lambda: self.speed(name, self.sage2(q, k, v), fp8=True))
            self.measure(name, "speed", "fa4", lambda: self.speed(name, self.fa4(q, k, v)))
            self.measure(name, "speed", "fp8_default", lambda: {"launch": default.label, **self.speed(
                name, self.fp8(default, q, k, v), fp8=True)})
            self.measure(name, "speed", "fp8_sage2", lambda: {"launch": recipe.label, **self.speed(
                name, self.fp8(recipe, q, k, v), fp8=True)})
            self.measure(name, "speed", "sage", lambda: self.speed(name, self.sage(q, k, v)))
            self.measure(name, "speed", "cudnn_fp8", lambda: self.speed(name, self.cudnn_fp8(q, k, v), fp8=True))
            self.measure(name, "speed", "cudnn_fp8_rotated",
                         lambda: self.speed(name, self.cudnn_fp8(q, k, v, rotate=True), fp8=True))
            self.measure(name, "speed", "cudnn_fp8_rotated_parts", lambda: self.cudnn_fp8_parts(q, k, v, rotate=True))
            self.measure(name, "speed", "fp8_quantize_kv", lambda: {"ms": round(self.time_ms(
                lambda: quantize_kv(af, k, v, default)), 3)})
            for kind in INPUT_KINDS:
                qk = self.qkv(name, kind)
                self.measure(name, f"error_{kind}", "sage2", lambda: self.error(name, kind, self.sage2(*qk)()))
                self.measure(name, f"error_{kind}", "fa4", lambda: self.error(name, kind, self.fa4(*qk)()))
                self.measure(name, f"error_{kind}", "fp8", lambda: self.error(name, kind, self.fp8(default, *qk)()))
                self.measure(name, f"error_{kind}", "fp8_sage2",
                             lambda: self.error(name, kind, self.fp8(recipe, *qk)()))
                self.measure(name, f"error_{kind}", "sage", lambda: self.error(name, kind, self.sage(*qk)()))
                self.measure(name, f"error_{kind}", "cudnn_fp8",
                             lambda: self.error(name, kind, self.cudnn_fp8(*qk)()))
                for row, options in (("cudnn_fp8_rotated", {}), ("cudnn_fp8_rotated_v_mean", {"v_mean": True})):
                    self.measure(name, f"error_{kind}", row,
                                 lambda: self.error(name, kind, self.cudnn_fp8(*qk, rotate=True, **options)()))
                self.measure(name, f"error_{kind}", "sage_smooth_k",
                             lambda: self.error(name, kind, self.sage(*qk, smooth_k=True)()))
                self.measure(name, f"error_{kind}", "sdpa_bf16", lambda: self.error(name, kind, self.sdpa(None, *qk)()))
        for name in self.shapes:                          # second pass: the FP8 sweep
            if self.options.no_sweep:
                break
            q, k, v = self.qkv(name, "dit_like")
            for launch in launches:
                self.measure(name, "fp8_sweep", launch.label, lambda: self.sweep_point(name, launch, q, k, v))
            self.report["shapes"][name]["fp8_best"] = best_of(self.report["shapes"][name]["fp8_sweep"])
            self.write()
        for name in self.shapes:                          # last: the slow exact backend
            if self.smoke or self.options.no_sweep:
                break
            q, k, v = self.qkv(name, "dit_like")
            self.measure(name, "speed", "sdpa_EFFICIENT_ATTENTION",
                         lambda: self.speed(name, self.sdpa("EFFICIENT_ATTENTION", q, k, v)))
        self.write()
        print(f"wrote {self.options.out} ({self.report['elapsed_s']} s)")
        return 0

    def sweep_point(self, name, launch, q, k, v) -> dict:
        call = self.fp8(launch, q, k, v)
        entry = self.speed(name, call, fp8=True)
        entry["error_dit_like"] = self.error(name, "dit_like", call())     # a fast launch must also be right
        return entry


# ------------------------------------------------------------------------------------------------ pure helpers
def flops(shape) -> int:
    b, h, lq, lkv, d = shape
    return 4 * b * h * lq * lkv * d


def make_inputs(torch, shape, kind: str, device: str, seed: int = 0):
    """q, k, v `[B, H, L, D]` bf16. "gaussian": N(0, 1). "dit_like": as the QK-normed attention of DiTs shows it,
    a few channels per head OUTLIER_GAIN times larger in q and k, a per-channel offset on k (what SageAttention's
    smoothing removes), then RMSNorm over D with a learned-looking per-channel scale; v Gaussian."""
    b, h, lq, lkv, d = shape
    gen = torch.Generator(device=device).manual_seed(seed)
    v = torch.randn(b, h, lkv, d, generator=gen, device=device, dtype=torch.bfloat16)
    if kind == "gaussian":
        return (torch.randn(b, h, lq, d, generator=gen, device=device, dtype=torch.bfloat16),
                torch.randn(b, h, lkv, d, generator=gen, device=device, dtype=torch.bfloat16), v)
    gain = torch.ones(h, d, device=device)
    for head in range(h):
        gain[head, torch.randperm(d, generator=gen, device=device)[:OUTLIER_CHANNELS]] = OUTLIER_GAIN
    offset = torch.randn(h, d, generator=gen, device=device)
    out = []
    for length, shift in ((lq, None), (lkv, offset)):
        x = torch.randn(b, h, length, d, generator=gen, device=device, dtype=torch.bfloat16) * gain[:, None].bfloat16()
        if shift is not None:
            x += shift[:, None].bfloat16()
        scale = (1 + 0.5 * torch.randn(h, 1, d, generator=gen, device=device)).bfloat16()
        x = torch.nn.functional.rms_norm(x, (d,), eps=1e-6) * scale
        out.append(x)
    return out[0], out[1], v


def error_against(torch, out, exact) -> dict:
    """Relative Frobenius error and cosine similarity of `out` against the fp32 `exact` (same rows)."""
    a, e = out.float().flatten(), exact.float().flatten()
    diff = float((a - e).norm() / e.norm().clamp_min(1e-30))
    cosine = float(torch.dot(a, e) / (a.norm() * e.norm()).clamp_min(1e-30))
    return {"relative_frobenius": round(diff, 6) if math.isfinite(diff) else str(diff),
            "cosine": round(cosine, 7) if math.isfinite(cosine) else str(cosine),
            "max_abs": round(float((a - e).abs().max()), 5)}


def quantize_kv(af, k, v, launch):
    """The FP8 kernel's quantisation of K (smoothed) and V, as attention_fp8_triton runs it."""
    af._quantize_padded(k, launch.block_n, af.key_mean(k), False, launch)
    af._quantize_padded(v, launch.block_n, None, launch.v_transposed, launch)


def best_of(sweep: dict) -> dict | None:
    timed = {label: entry for label, entry in sweep.items() if "tflops" in entry}
    if not timed:
        return None
    label = max(timed, key=lambda name: timed[name]["tflops"])
    return {"launch": label, **timed[label]}


def _error_of(shape: dict, kind: str, row: str) -> float | None:
    entry = shape.get(f"error_{kind}", {}).get(row)
    value = entry.get("relative_frobenius") if isinstance(entry, dict) else None
    return float(value) if isinstance(value, (int, float)) else None


def derive_yardstick(report: dict) -> dict:
    """{"bands": [...]} from a run's `sage2` errors (see the module): one band per shape measured on both kinds."""
    measured = []
    for name, shape in report.get("shapes", {}).items():
        errors = {kind: _error_of(shape, kind, "sage2") for kind in INPUT_KINDS}
        if None in errors.values():
            continue
        _, _, _, lkv, d = shape["b_h_lq_lkv_d"]
        within = [row for row in LOSSY_ROWS if all(
            (e := _error_of(shape, kind, row)) is not None and e <= errors[kind] for kind in INPUT_KINDS)]
        speed = shape.get("speed", {}).get("sage2", {})
        measured.append({"shape": name, "head_dim": d, "tokens": lkv, "sage2_error": errors, "within": within,
                         "sage2_tflops": speed.get("tflops"),
                         "evidence": f"shapes.{name}"})
    bands = []
    for d in sorted({m["head_dim"] for m in measured}):
        row = sorted((m for m in measured if m["head_dim"] == d), key=lambda m: m["tokens"])
        for i, m in enumerate(row):
            low = math.isqrt(row[i - 1]["tokens"] * m["tokens"]) + 1 if i else m["tokens"] // 2
            high = math.isqrt(m["tokens"] * row[i + 1]["tokens"]) if i + 1 < len(row) else m["tokens"] * 2
            bands.append({"shape": m["shape"], "head_dim": d, "min_tokens": low, "max_tokens": high,
                          **{k: m[k] for k in ("sage2_error", "within", "sage2_tflops", "evidence")}})
    return {"bands": bands}


def write_yardstick(report: dict, source: Path, path: Path) -> Path:
    try:
        cited = str(source.resolve().relative_to(results.RESULTS))
    except ValueError:
        cited = source.name
    about = json.loads(YARDSTICK.read_text(encoding="utf-8"))["about"] if YARDSTICK.exists() else ""
    data = {"about": about, "measured": True,
            "derived": f"python -m benchmarks attention-kernels --from benchmarks/results/{cited} --write-table (the "
                       f"GPU of that run: {report.get('environment', {}).get('gpu')})",
            "evidence": {"file": cited, "key": "shapes"},
            "kernel": {"sageattention": report.get("sageattention"), "source": report.get("sageattention_source")},
            **derive_yardstick(report)}
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    return path


def sage2_module():
    """The `sageattention` module where it is SageAttention 2 or later with its sm90 path built; else Unavailable."""
    try:
        import sageattention
    except Exception as error:
        raise Unavailable(f"sageattention not importable: {type(error).__name__}: {error}") from None
    if not hasattr(sageattention, "sageattn_qk_int8_pv_fp8_cuda_sm90"):
        raise Unavailable(f"sageattention {sage_version()} has no sm90 path (SageAttention 2 has)")
    if getattr(sys.modules.get("sageattention.core"), "SM90_ENABLED", True) is False:
        raise Unavailable("sageattention was built without its sm90 extension (_qattn_sm90)")
    return sageattention


def fa4_function():
    """FlashAttention-4's `flash_attn.cute.flash_attn_func`; Unavailable where it does not import."""
    try:
        from flash_attn.cute import flash_attn_func
    except Exception as error:
        raise Unavailable(f"flash_attn.cute (FlashAttention-4) not importable: {type(error).__name__}: {error}") \
            from None
    return flash_attn_func


def fa4_version() -> str | None:
    try:
        import importlib.metadata
        return importlib.metadata.version("flash-attn-4")
    except Exception:
        try:
            fa4_function()
            return "importable, version unknown"
        except Unavailable as why:
            return str(why)[:200]


def sage_version() -> str | None:
    try:
        import importlib.metadata
        return importlib.metadata.version("sageattention")
    except Exception:
        try:
            import sageattention
            return getattr(sageattention, "__version__", "importable, version unknown")
        except Exception as error:
            return f"not importable: {type(error).__name__}: {error}"[:200]
