"""Parity helpers shared by the overlay tests, the GPU gate script and the FP8 checks.

The gates compare a kernel's output with a reference in units in the last place (ulp) of the output dtype:
for bf16/fp16 the drop-in promise is "<= 1 ulp on >= 99.9% of elements and <= 2 ulp everywhere" against the
exact eager chain; fp32 outputs use an absolute/relative tolerance; FP8 codes are compared as raw bytes.
Outputs are poisoned (NaN, or a NaN byte pattern) before each kernel run so that an element the kernel never
wrote shows up as a mismatch instead of passing by luck.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import dispatch
from .ops import fp8_linear as fl

# Sign bit and bit width of each float dtype's storage word; the ulp metric orders the bit patterns.
_FLOAT_BITS: dict[torch.dtype, tuple[torch.dtype, int]] = {
    torch.float32: (torch.int32, 32),
    torch.float16: (torch.int16, 16),
    torch.bfloat16: (torch.int16, 16),
}
for _name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"):
    if hasattr(torch, _name):
        _FLOAT_BITS[getattr(torch, _name)] = (torch.uint8, 8)

# Distance reported where exactly one side is NaN: larger than any real ulp distance of these widths.
NAN_DISTANCE = 1 << 40

BF16_MAX_ULP = 2
BF16_WITHIN_ONE_ULP_FRACTION = 0.999
FP32_TOLERANCE = 1e-5


def random_seed() -> int:
    """A fresh seed per run (the gates want fresh inputs each time); report it so a failure can be replayed."""
    return int.from_bytes(os.urandom(4), "little")


def generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def poison_(tensor: torch.Tensor) -> torch.Tensor:
    """Fill `tensor` in place with a value no kernel computes from finite inputs (NaN; 0x7F bytes for FP8)."""
    if tensor.dtype.is_floating_point and tensor.element_size() > 1:
        return tensor.fill_(float("nan"))
    if tensor.dtype in _FLOAT_BITS:   # FP8: 0x7F is NaN in e4m3fn and e5m2
        tensor.view(torch.uint8).fill_(0x7F)
        return tensor
    if tensor.dtype == torch.bool:
        return tensor.fill_(True)
    return tensor.fill_(torch.iinfo(tensor.dtype).max)


def poisoned_empty(shape, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    return poison_(torch.empty(shape, dtype=dtype, device=device))


def poisoned_like(tensor: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    return poison_(torch.empty(tensor.shape, dtype=dtype or tensor.dtype, device=tensor.device))


def _ordered_bits(tensor: torch.Tensor) -> torch.Tensor:
    """Map float bit patterns to int64 so that adjacent representable values differ by one (+0 == -0)."""
    int_dtype, width = _FLOAT_BITS[tensor.dtype]
    bits = tensor.contiguous().view(int_dtype).to(torch.int64) & ((1 << width) - 1)
    sign = 1 << (width - 1)
    magnitude = bits & (sign - 1)
    return torch.where((bits & sign) != 0, -magnitude, magnitude)


def ulp_distance(actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """Per-element distance in ulps of the (shared) dtype; NaN on one side only counts as NAN_DISTANCE."""
    if actual.dtype != expected.dtype:
        raise TypeError(f"ulp distance needs one dtype, got {actual.dtype} and {expected.dtype}")
    if actual.shape != expected.shape:
        raise ValueError(f"shape mismatch: {tuple(actual.shape)} vs {tuple(expected.shape)}")
    if actual.dtype not in _FLOAT_BITS:
        raise TypeError(f"no ulp metric for {actual.dtype}")
    actual, expected = actual.detach(), expected.detach()   # stays on its device: GPU gates compare there
    distance = (_ordered_bits(actual) - _ordered_bits(expected)).abs()
    nan_a, nan_e = torch.isnan(actual.float()), torch.isnan(expected.float())
    distance = torch.where(nan_a & nan_e, torch.zeros_like(distance), distance)
    return torch.where(nan_a ^ nan_e, torch.full_like(distance, NAN_DISTANCE), distance)


@dataclass(frozen=True)
class ParityReport:
    """How far an output is from its reference; `as_dict` is what the gate scripts write as JSON."""
    dtype: str
    numel: int
    max_ulp: int
    mismatch_fraction: float       # elements not bit-identical (NaN == NaN counts as identical)
    over_one_ulp_fraction: float   # elements more than 1 ulp away
    max_abs_diff: float
    unwritten: int                 # NaN in the output where the reference is finite (poison left behind)

    def passes_ulp_gate(self, max_ulp: int = BF16_MAX_ULP,
                        within_one_ulp_fraction: float = BF16_WITHIN_ONE_ULP_FRACTION) -> bool:
        return (self.unwritten == 0 and self.max_ulp <= max_ulp
                and 1.0 - self.over_one_ulp_fraction >= within_one_ulp_fraction)

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def compare(actual: torch.Tensor, expected: torch.Tensor) -> ParityReport:
    distance = ulp_distance(actual, expected)
    numel = max(distance.numel(), 1)
    a, e = actual.detach().float(), expected.detach().float()
    both_finite = torch.isfinite(a) & torch.isfinite(e)
    abs_diff = (a - e).abs()[both_finite]
    return ParityReport(
        dtype=str(actual.dtype).replace("torch.", ""),
        numel=distance.numel(),
        max_ulp=int(distance.max()) if distance.numel() else 0,
        mismatch_fraction=float((distance != 0).sum()) / numel,
        over_one_ulp_fraction=float((distance > 1).sum()) / numel,
        max_abs_diff=float(abs_diff.max()) if abs_diff.numel() else 0.0,
        unwritten=int((torch.isnan(a) & ~torch.isnan(e)).sum()),
    )


def byte_mismatch(actual: torch.Tensor, expected: torch.Tensor) -> tuple[int, float]:
    """(count, fraction) of elements whose raw bytes differ: how FP8 codes are compared."""
    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        raise ValueError(f"byte comparison needs equal dtype/shape: {actual.dtype}{tuple(actual.shape)} vs "
                         f"{expected.dtype}{tuple(expected.shape)}")
    a = actual.detach().contiguous().view(torch.uint8).reshape(actual.numel(), -1)
    e = expected.detach().contiguous().view(torch.uint8).reshape(expected.numel(), -1)
    differing = int((a != e).any(dim=1).sum())
    return differing, differing / max(actual.numel(), 1)


def assert_ulp_gate(actual: torch.Tensor, expected: torch.Tensor, what: str = "output", *,
                    max_ulp: int = BF16_MAX_ULP,
                    within_one_ulp_fraction: float = BF16_WITHIN_ONE_ULP_FRACTION) -> ParityReport:
    """The bf16/fp16 drop-in gate; raises AssertionError with the numbers when it fails."""
    report = compare(actual, expected)
    if not report.passes_ulp_gate(max_ulp, within_one_ulp_fraction):
        raise AssertionError(f"{what}: ulp gate failed ({max_ulp} ulp max, {within_one_ulp_fraction:.1%} within "
                             f"1 ulp): {report.as_dict()}")
    return report


def assert_close_fp32(actual: torch.Tensor, expected: torch.Tensor, what: str = "output", *,
                      atol: float = FP32_TOLERANCE, rtol: float = FP32_TOLERANCE) -> float:
    """fp32 gate: |a - e| <= atol + rtol * |e| everywhere and no poison left; returns max |a - e|."""
    if actual.shape != expected.shape:
        raise AssertionError(f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}")
    a, e = actual.detach().double(), expected.detach().double()
    unwritten = int((torch.isnan(a) & ~torch.isnan(e)).sum())
    diff = (a - e).abs()
    bad = ~(diff <= atol + rtol * e.abs()) & ~(torch.isnan(a) & torch.isnan(e))
    max_diff = float(diff.nan_to_num(nan=float("inf")).max()) if diff.numel() else 0.0
    if unwritten or bool(bad.any()):
        raise AssertionError(f"{what}: {int(bad.sum())} of {a.numel()} elements outside atol={atol} rtol={rtol}; "
                             f"unwritten (NaN poison left) {unwritten}; max |diff| {max_diff:.3g}")
    return max_diff


@contextlib.contextmanager
def fp8_emulated(calls: list[str]):
    """While inside: dispatch accepts the fp8_linear op wherever its kernels cannot run (CPU, below sm_89), and the
    FP8 path's GEMM is emulated from the same codes and scales (`ops.fp8_linear.linear_fp8`); each call is appended
    to `calls` ("linear", or "gelu_linear" for an FFN's second Linear). For CPU tests and checks of the FP8 module
    logic; nothing it computes stands for a real FP8 GEMM's bits."""
    real = dispatch.choose, fl.linear_fp8_triton, fl.gelu_linear_fp8_triton

    def choose(op, *tensors, min_capability=None):
        if op == fl.OP:
            return dispatch.Choice("triton", "fp8_emulated: the FP8 GEMM emulated from the codes")
        return real[0](op, *tensors, min_capability=min_capability)

    def linear(x, weight, bias, settings=fl.SETTINGS):
        calls.append("linear")
        return fl.linear_fp8(x, weight, bias, settings=settings)

    def gelu_linear(h, weight, bias, settings=fl.SETTINGS):
        calls.append("gelu_linear")
        return fl.linear_fp8(F.gelu(h, approximate="tanh"), weight, bias, settings=settings)

    dispatch.choose, fl.linear_fp8_triton, fl.gelu_linear_fp8_triton = choose, linear, gelu_linear
    try:
        yield calls
    finally:
        dispatch.choose, fl.linear_fp8_triton, fl.gelu_linear_fp8_triton = real
