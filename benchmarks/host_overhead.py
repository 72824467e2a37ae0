"""Host time per call of each fused op against ComfyUI's eager chain it replaces, on a CUDA GPU.

In eager ComfyUI a block is bound by host time wherever the GPU finishes its kernels faster than Python issues
them; an overlay that saves GPU time but costs host time can then make a block slower. This times, per op, the
mean host microseconds per call on inputs small enough that the GPU never waits (launch_overhead.host_us): the
overlay's public call, the same call with its Triton kernel replaced by a stub that launches nothing (the
wrapper's own Python: dispatch, checks, allocation, the launch key; the difference is the launch itself: the
compiled kernel's launcher on repeats where fused_dit.launch goes direct, else the JIT's), the same call with the
direct path off (FUSED_DIT_DIRECT_LAUNCH=0: every launch through the JIT), and the eager chain.
One JSON; no assertions.

    PYTHONPATH=overlays:.:benchmarks python benchmarks/host_overhead.py --out benchmarks/results/host-overhead.json
"""
from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

import torch

from fused_dit import launch
from fused_dit.ops import adaln, gate_add, rms_rope
from launch_overhead import host_us
from results_io import environment, write_json

DEVICE, BF16 = "cuda", torch.bfloat16


def rotation_table(leading, half):
    angle = torch.rand((*leading, half), device=DEVICE) * 2 * math.pi
    return torch.stack([angle.cos(), -angle.sin(), angle.sin(), angle.cos()], dim=-1).view(*leading, half, 2, 2)


def cases(tokens: int) -> dict:
    """{op: (overlay call, eager chain call)} at `tokens` tokens of Flux / Wan widths."""
    qkv = torch.randn(1, tokens, 3, 24, 128, device=DEVICE, dtype=BF16)
    q, k, _ = qkv.permute(2, 0, 3, 1, 4)
    scale_q = torch.ones(128, device=DEVICE, dtype=BF16)
    pe = rotation_table((1, 1, tokens), 64)
    wq, wk = (torch.randn(1, tokens, 5120, device=DEVICE, dtype=BF16) for _ in range(2))
    ww = torch.ones(5120, device=DEVICE, dtype=BF16)
    freqs = rotation_table((1, tokens, 1), 64)
    x = torch.randn(1, tokens, 3072, device=DEVICE, dtype=BF16)
    y = torch.randn_like(x)
    e = torch.randn(1, 1, 6, 3072, device=DEVICE, dtype=BF16)
    shift, scale, gate = e[:, :, 0], e[:, :, 1], e[:, :, 2]
    return {
        "rms_rope_flux": (lambda: rms_rope.flux_rms_rope(q, k, scale_q, scale_q, pe),
                          lambda: rms_rope.flux_reference_comfy(q, k, scale_q, scale_q, pe)),
        "rms_rope_wan": (lambda: rms_rope.wan_rms_rope(wq, wk, ww, ww, freqs, 40),
                         lambda: rms_rope.wan_reference_comfy(wq, wk, ww, ww, freqs, 40)),
        "adaln": (lambda: adaln.adaln(x, shift, scale), lambda: adaln.reference_comfy(x, shift, scale)),
        "gate_add_wan": (lambda: gate_add.gate_add(x, y, gate, gate_add.WAN),
                         lambda: gate_add.reference_comfy(x, y, gate, gate_add.WAN)),
        "gate_add_flux": (lambda: gate_add.gate_add(x, y, gate, gate_add.FLUX),
                          lambda: gate_add.reference_comfy(x, y, gate, gate_add.FLUX)),
    }


# the Triton kernel each op's wrapper launches
KERNELS = {"rms_rope_flux": (rms_rope, "_flux_rms_rope_kernel"), "rms_rope_wan": (rms_rope, "_wan_rms_rope_kernel"),
           "adaln": (adaln, "_adaln_kernel"), "gate_add_wan": (gate_add, "_gate_add_kernel"),
           "gate_add_flux": (gate_add, "_gate_add_kernel")}


class _NoLaunch:
    """Stands in for a Triton kernel (its parameter names, for fused_dit.launch): `kernel[grid](...)` does nothing."""

    def __init__(self, kernel):
        self.arg_names = kernel.arg_names

    def __getitem__(self, grid):
        return lambda *args, **options: None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokens", type=int, default=16, help="tokens per call (small: the GPU never waits)")
    parser.add_argument("--calls", type=int, default=1000)
    args = parser.parse_args()
    result = {**environment(), "tokens": args.tokens, "calls_per_round": args.calls,
              "direct_launch": launch.direct_enabled(),
              "method": "mean host time per call over a round of calls without synchronising, median of 5 rounds",
              "host_us": {}}
    for op, (overlay, eager) in cases(args.tokens).items():
        module, kernel_name = KERNELS[op]
        kernel = getattr(module, kernel_name)
        setattr(module, kernel_name, _NoLaunch(kernel))
        try:
            wrapper_only = host_us(overlay, args.calls)["us"]
        finally:
            setattr(module, kernel_name, kernel)
        os.environ["FUSED_DIT_DIRECT_LAUNCH"] = "0"
        try:
            jit_path = host_us(overlay, args.calls)["us"]
        finally:
            del os.environ["FUSED_DIT_DIRECT_LAUNCH"]
        result["host_us"][op] = {"overlay": host_us(overlay, args.calls)["us"], "overlay_without_launch": wrapper_only,
                                 "overlay_jit_launch": jit_path, "eager_chain": host_us(eager, args.calls)["us"]}
        print(op, {k: round(v, 1) for k, v in result["host_us"][op].items()}, flush=True)
    write_json(result, args.out, "host-overhead")


if __name__ == "__main__":
    main()
