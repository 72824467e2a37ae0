"""The attention family's `fp8` mode (issue 28): ComfyUI's attention call run by the pack's low-precision kernel
(ops/attention_fp8.py: 8-bit Q K^T, its formats there), opt-in, through the same seam as the exact mode
(`optimized_attention_override`).

ComfyUI's `wrap_attn` calls the override as `override(func, q, k, v, heads, mask=None, attn_precision=None,
skip_reshape=False, skip_output_reshape=False, **kwargs)`: q, k, v are `[B, S, heads * D]`, or `[B, heads, S, D]`
with skip_reshape; the output is `[B, Sq, heads * D]`, or `[B, heads, Sq, D]` with skip_output_reshape, as
ComfyUI's attention_pytorch returns it. The kernel takes the `[B, heads, S, D]` views as they are (any strides).

A call the kernel cannot take goes to the exact mode (`exact`: FastestSdpa where the registry runs it, else
ComfyUI's own function), and the reason is said once through the pack's once-only log: a mask, grouped-query
attention, a model that asks for full precision (`low_precision_attention=False`, as ComfyUI's sage binding
honours), a head dim, dtype, device or GPU the kernel does not cover (ops.attention_fp8.refusal).

Faster than exact, or exact: the first call of each shape (an eager call) times the pack's kernel, cuDNN's FP8 SDPA
(ops/attention_cudnn_fp8, where it takes the call) and the exact mode on that call's own inputs, and the shape keeps
the fastest. A lossy candidate must also be as accurate as the yardstick, SageAttention 2
(integration/attention_yardstick.py): where the table has a band for the shape, only the kernels the band lists run,
and only where their relative error against the exact output on the call is at most the band's `limit()`. Where no
band covers the shape the earlier rule holds: the kernel runs (it holds SageAttention 1's error by design), and
cuDNN's candidate only where its error is at most `ERROR_SLACK` times the kernel's (cuDNN's per-tensor e4m3 Q K^T was
not, on DiT-like inputs: attention-kernels-h200.json). Where exact attention is faster (cuDNN's bf16 SDPA on the
H200), `fp8` runs exact: never slower than the exact mode, said once per shape.
The pack's kernel on SageAttention 2's recipe (`RECIPE`: ops.attention_fp8.sage2_recipe, finer Q scales and per-channel
V scales, FP8 P V) is a lossy candidate only under the yardstick: where the shape's band lists it (row `fp8_sage2`) or
SageAttention 2 runs on the call; never by the earlier rule, so with no band and no SageAttention 2 it is not even
timed. cuDNN's FP8 SDPA with q and k rotated by the normalised Hadamard matrix inside the quantisation
(`CUDNN_ROTATED`: ops.attention_cudnn_fp8.ROTATED, issue 38 item 3) is gated alike (row `cudnn_fp8_rotated`).
Where the user's environment imports SageAttention 2 (integration/attention_optional.py) it is one more lossy
candidate, timed the same way, and the yardstick itself measured on the call: every lossy candidate whose error there
is at most SageAttention 2's may run, the table is not consulted. Where it is absent, that is said once.

Capture-safe (ComfyUI's model compiler captures blocks in CUDA graphs): that measurement happens on a shape's first
call, outside the compiler's recorded allocations (model_compiler); after it the choice reads only shapes, dtypes
and devices; the kernel derives its scales on the GPU, syncs nothing with the host and allocates alike on every
call of a shape (the recipe's per-channel V scales are torch ops on the GPU, likewise). Under torch.compile
(TorchCompileModel) an accepted call is traced as one custom op (`torch.ops.fused_dit.attention_fp8`, the default
launch, whatever the shape chose eagerly; it falls back to SDPA itself where the GPU refuses); a refused one is
ComfyUI's own call, traced as it is, with nothing said while tracing.
"""
from __future__ import annotations

import functools
import logging

import torch

from .. import state
from ..ops import attention_cudnn_fp8 as cudnn_fp8
from ..ops import attention_fp8 as kernel
from . import attention_optional as optional
from . import attention_yardstick as yardstick
from . import model_compiler
from .attention import cuda_timer

CHOICE_LINE = "Fused DiT Ops: attention fp8 for %s: %s (%s)"       # INFO: what runs, in one short line
CHOICE_DETAIL = "fused_dit: attention fp8 for %s -> %s (%s)"      # DEBUG: every candidate's time, why others may not
NO_LOSSY_WIN = "no lossy candidate faster within SageAttention 2's error"
KERNEL, CUDNN_FP8, EXACT = "fp8 kernel", "cuDNN FP8 SDPA", "exact"
RECIPE = "fp8 kernel on SageAttention 2's recipe"
CUDNN_ROTATED = "cuDNN FP8 SDPA, Hadamard-rotated"
SAGE2 = optional.SAGE2
ERROR_SLACK = 1.05
# the candidates as the yardstick table names them (the rows of benchmarks/attention_kernels.py)
TABLE_ROWS = {KERNEL: "fp8", CUDNN_FP8: "cudnn_fp8", RECIPE: "fp8_sage2", CUDNN_ROTATED: "cudnn_fp8_rotated",
              SAGE2: "sage2"}

FALLBACK_LINE = "Fused DiT Ops: attention fp8 -> exact for %s"
RUNS = ("low-precision attention (INT8 Q K^T, P V in the model's dtype, fp32 accumulation, scales on the GPU) "
        "where it is faster than exact for the shape (timed on its first call); exact elsewhere and where a call "
        "is refused")


def call_refusal(q, k, v, heads, mask, skip_reshape: bool, kwargs: dict) -> str | None:
    """Why this attention call stays exact, from its arguments alone (None: the kernel's own checks next)."""
    if mask is not None:
        return "calls with a mask"
    if kwargs.get("low_precision_attention", True) is False:
        return "calls whose model asks for full precision (low_precision_attention=False)"
    if kwargs.get("enable_gqa", False):
        return "grouped-query attention (enable_gqa)"
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        return "calls whose q, k, v are not tensors"
    want = 4 if skip_reshape else 3
    if q.dim() != want or k.dim() != want or v.dim() != want:
        return f"q, k, v that are not {want}-D ({'skip_reshape' if skip_reshape else '[B, S, heads * D]'})"
    if not skip_reshape and (not isinstance(heads, int) or heads <= 0 or q.shape[-1] % heads
                             or k.shape[-1] != q.shape[-1] or v.shape[-1] != q.shape[-1]):
        return f"q, k, v whose last dims do not split into {heads} heads alike"
    return None


def to_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """`[B, S, heads * D]` -> the `[B, heads, S, D]` view (ComfyUI's reshape and transpose, no copy)."""
    b, s, hd = t.shape
    return t.reshape(b, s, heads, hd // heads).transpose(1, 2)


class Fp8Attention:
    """An `optimized_attention_override` running ComfyUI's attention calls in FP8 (see the module)."""

    def __init__(self, exact=None, timer=cuda_timer, devices=("cuda",)):
        self.exact = exact          # the exact mode's override for refused calls; None: ComfyUI's own function
        self.timer = timer
        self.devices = devices      # where a shape's first call measures (elsewhere the kernel runs: interpreter)
        self.choices: dict[tuple, str] = {}      # shape key -> a lossy candidate's name (TABLE_ROWS) or EXACT
        self.sageattn = None                     # SageAttention 2's function, where a shape measured it

    def __call__(self, func, q, k, v, heads, mask=None, attn_precision=None, skip_reshape=False,
                 skip_output_reshape=False, **kwargs):
        call = dict(mask=mask, attn_precision=attn_precision, skip_reshape=skip_reshape,
                    skip_output_reshape=skip_output_reshape, **kwargs)
        why = call_refusal(q, k, v, heads, mask, skip_reshape, kwargs)
        if why is None:
            q4, k4, v4 = (q, k, v) if skip_reshape else (to_heads(t, heads) for t in (q, k, v))
            why = None if torch.compiler.is_compiling() else kernel.refusal(q4, k4, v4)
        if why is not None:
            if not torch.compiler.is_compiling():
                state.say_once(FALLBACK_LINE, why)
            return self._exact(func, q, k, v, heads, **call)
        if torch.compiler.is_compiling() or q4.device.type not in self.devices:
            return self._kernel(q4, k4, v4, kwargs.get("scale"), skip_output_reshape)
        key = (tuple(q4.shape), tuple(k4.shape), q4.dtype, q4.device, kwargs.get("scale"))
        if key not in self.choices:
            if model_compiler.capturing(q4):     # no timing inside a graph: exact this once, measured when eager
                return self._exact(func, q, k, v, heads, **call)
            with model_compiler.outside_recorded_allocations():
                self.choices[key] = self._measure(key, func, (q, k, v, heads), call, (q4, k4, v4))
        choice = self.choices[key]
        if choice == EXACT:
            return self._exact(func, q, k, v, heads, **call)
        if choice == CUDNN_FP8:
            return _output(cudnn_fp8.attention_cudnn_fp8(q4, k4, v4), skip_output_reshape)
        if choice == SAGE2:
            return _output(optional.sage2_call(self.sageattn, q4, k4, v4, kwargs.get("scale")), skip_output_reshape)
        if choice == RECIPE:
            return _output(kernel.attention_fp8_sage2(q4, k4, v4, kwargs.get("scale")), skip_output_reshape)
        if choice == CUDNN_ROTATED:
            return _output(cudnn_fp8.attention_cudnn_fp8(q4, k4, v4, cudnn_fp8.ROTATED), skip_output_reshape)
        return self._kernel(q4, k4, v4, kwargs.get("scale"), skip_output_reshape)

    @staticmethod
    def _kernel(q4, k4, v4, scale, skip_output_reshape):
        return _output(kernel.attention_fp8(q4, k4, v4, scale), skip_output_reshape)

    def _exact(self, func, *args, **kwargs):
        if self.exact is None or torch.compiler.is_compiling():
            return func(*args, **kwargs)
        return self.exact(func, *args, **kwargs)

    def _measure(self, key, func, args, call, qkv4) -> str:
        """The fastest of exact and the lossy candidates within the yardstick on these inputs (see the module)."""
        skip_output_reshape, scale = call["skip_output_reshape"], call.get("scale")
        exact = functools.partial(self._exact, func, *args, **call)
        lossy = {KERNEL: lambda: self._kernel(*qkv4, scale, skip_output_reshape)}
        cudnn_takes = scale is None and cudnn_fp8.refusal(*qkv4) is None
        if cudnn_takes:
            lossy[CUDNN_FP8] = lambda: _output(cudnn_fp8.attention_cudnn_fp8(*qkv4), skip_output_reshape)
        sageattn = optional.sage2()
        band = yardstick.band_for(qkv4[0].shape[-1], qkv4[1].shape[-2])

        def under_yardstick(name: str) -> bool:      # offered only where a yardstick may admit it (see the module)
            return sageattn is not None or (band is not None and band.admits(TABLE_ROWS[name]))
        if under_yardstick(RECIPE):
            lossy[RECIPE] = lambda: _output(kernel.attention_fp8_sage2(*qkv4, scale), skip_output_reshape)
        if cudnn_takes and under_yardstick(CUDNN_ROTATED):
            lossy[CUDNN_ROTATED] = lambda: _output(cudnn_fp8.attention_cudnn_fp8(*qkv4, cudnn_fp8.ROTATED),
                                                   skip_output_reshape)
        if sageattn is not None:
            self.sageattn = sageattn
            lossy[SAGE2] = lambda: _output(optional.sage2_call(sageattn, *qkv4, scale), skip_output_reshape)
        notes: dict[str, str] = {}
        candidates = {**self._accurate_enough(lossy, exact, band, notes), EXACT: exact}
        timings = {name: self.timer(fn) for name, fn in candidates.items()}
        best = min(timings, key=timings.get)
        said = [f"{name} {ms:.3f} ms" for name, ms in timings.items()] + [f"{n}: {w}" for n, w in notes.items()]
        brief = (f"{timings[best]:.3f} ms; {NO_LOSSY_WIN}" if best == EXACT
                 else f"{timings[best]:.3f} ms; exact {timings[EXACT]:.3f} ms")
        state.say_once(CHOICE_LINE, key[0], best, brief)
        state.say_once(CHOICE_DETAIL, key[0], best, "; ".join(said), level=logging.DEBUG)
        return best


    @staticmethod
    def _accurate_enough(lossy: dict, exact, band, notes: dict) -> dict:
        """The lossy candidates that may run for this shape: at most SageAttention 2's error on this call where it
        ran, else within the band's yardstick where a band covers the shape, else the earlier rule (the kernel;
        cuDNN's FP8 SDPA as accurate as the kernel; RECIPE and CUDNN_ROTATED are never offered there). Why the
        others may not, in `notes`."""
        if band is None and len(lossy) == 1:
            return lossy                     # the kernel alone, as before: nothing to compare
        reference = exact().float()
        errors = {}
        for name, fn in lossy.items():
            try:
                errors[name] = relative_error(fn().float(), reference)
            except Exception as error:       # a shape this cuDNN builds no graph for
                notes[name] = f"unavailable ({type(error).__name__})"
        if SAGE2 in errors:                  # the yardstick on these very inputs
            kept = {name: lossy[name] for name, error in errors.items() if error <= errors[SAGE2]}
            for name in errors.keys() - kept.keys():
                notes[name] = f"error {errors[name]:.3g} beyond SageAttention 2's {errors[SAGE2]:.3g} on this call"
            return kept
        if band is not None:
            kept = {name: lossy[name] for name, error in errors.items()
                    if band.admits(TABLE_ROWS[name]) and error <= band.limit()}
            for name in errors.keys() - kept.keys():
                notes[name] = (f"error {errors[name]:.3g} beyond SageAttention 2's at this shape"
                               if band.admits(TABLE_ROWS[name]) else "not within SageAttention 2's error here") + \
                    f" ({band.evidence.cite()})"
            return kept
        kept = {KERNEL: lossy[KERNEL]}
        if CUDNN_FP8 in errors and KERNEL in errors:
            if errors[CUDNN_FP8] <= ERROR_SLACK * errors[KERNEL]:
                kept[CUDNN_FP8] = lossy[CUDNN_FP8]
            else:
                notes[CUDNN_FP8] = "less accurate than the kernel"
        return kept


def _output(out: torch.Tensor, skip_output_reshape: bool) -> torch.Tensor:
    """The kernel's `[B, heads, Sq, D]` as ComfyUI's attention returns it."""
    if skip_output_reshape:
        return out
    b, h, sq, d = out.shape
    return out.transpose(1, 2).reshape(b, sq, h * d)


def relative_error(out: torch.Tensor, reference: torch.Tensor) -> float:
    """|out - reference| / |reference| in the Frobenius norm (one host read: measured once per shape)."""
    return float((out - reference).norm() / reference.norm().clamp_min(1e-30))
