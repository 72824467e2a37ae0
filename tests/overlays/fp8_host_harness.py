"""The FP8 linears' host path on a CPU: everything an FP8 Linear call does on the host, with the GPU work stubbed.

`host_only_fp8()` lets dispatch accept the fp8_linear op for CPU tensors (as `fused_dit.testing.fp8_emulated`
does) but, unlike the emulation, keeps the real FP8 path: the plan lookup, the quantisers' allocations and launch
bookkeeping. Only the GPU work is replaced: the Triton launches by a counter, torch._scaled_mm by the allocation of
its output (on a GPU both are asynchronous, so they cost host time but no waiting; a CPU build of torch computes
_scaled_mm, slowly). What is measured
with it is the host work per call that a GPU run pays between kernels; the outputs are not meaningful (the
quantisers' buffers are never written).

`count_torch_ops(fn)` counts the aten ops a call dispatches (TorchDispatchMode): deterministic, so a test may assert
it, unlike a time.
"""
from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode


@dataclass
class HostCalls:
    launches: Counter = field(default_factory=Counter)    # Triton kernel name -> launches


@contextlib.contextmanager
def host_only_fp8():
    from fused_dit import dispatch
    from fused_dit.ops import fp8_linear as fl
    from fused_dit.ops import gelu_quantize_fp8 as gq
    from fused_dit.ops import quantize_fp8 as q
    from fused_dit.ops import quantize_fp8_rows as qr

    calls = HostCalls()
    real = dispatch.choose, q.run_kernel, gq.run_kernel, qr.run_kernel, fl._scaled_mm

    def choose(op, *tensors, min_capability=None):
        if op == fl.OP:
            return dispatch.Choice("triton", "host_only_fp8: Triton launches counted, not run")
        return real[0](op, *tensors, min_capability=min_capability)

    def launch(kernel, grid, key, *args, **options):
        calls.launches[getattr(kernel, "__name__", None) or getattr(kernel.fn, "__name__", "kernel")] += 1

    def scaled_mm(a_codes, a_scale, w_codes_t, w_scale, bias, out_dtype, fast_accum=False):
        # the GEMM's output allocation stands for the launch (torch._scaled_mm on a CPU computes, slowly)
        calls.launches["_scaled_mm"] += 1
        return torch.empty((a_codes.shape[0], w_codes_t.shape[1]), dtype=out_dtype, device=a_codes.device)

    dispatch.choose, q.run_kernel, gq.run_kernel, qr.run_kernel, fl._scaled_mm = (choose, launch, launch, launch,
                                                                                  scaled_mm)
    try:
        yield calls
    finally:
        dispatch.choose, q.run_kernel, gq.run_kernel, qr.run_kernel, fl._scaled_mm = real


class _OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))


def count_torch_ops(fn, *args, **kwargs) -> Counter:
    """{aten op name: calls} dispatched while fn(*args, **kwargs) runs."""
    with _OpCounter() as counter:
        fn(*args, **kwargs)
    return counter.ops
