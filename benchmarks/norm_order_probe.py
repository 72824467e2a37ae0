"""Does `fused_dit.ops.norm_order` reproduce torch's CUDA LayerNorm / RMSNorm statistics bit for bit? Writes JSON.

For the row lengths of ComfyUI's Flux and Wan blocks, random bf16 rows go through torch's own kernels
(`torch.native_layer_norm`: output, mean and rstd; `F.rms_norm`: output) and through the emulation of their
reduction order in `norm_order`, once per candidate block size (128 threads, torch's num_threads() on CUDA, and
256). A plain float32 reduction in torch's generic order (`x.float().mean(-1)`) is counted beside them: that is
what an order-agnostic fused kernel can expect. Counts rows whose statistic differs and output elements that
differ. The fused kernels themselves are held to the eager chain by benchmarks/gpu_gates.py.

    PYTHONPATH=overlays:. python benchmarks/norm_order_probe.py --out benchmarks/results/
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from fused_dit.ops import norm_order
from fused_dit.testing import byte_mismatch
from results_io import environment, write_json

DEVICE = "cuda"
EPS = 1e-6
LENGTHS = {128: "Flux/Wan head (rms_rope Flux)", 1536: "Wan 1.3B C", 3072: "Flux C (adaln)", 5120: "Wan 14B C"}


def _set_threads(threads: int) -> None:
    norm_order.TORCH_THREADS = threads
    norm_order.CHUNK = threads * norm_order.TORCH_VEC


def _differs(ours: torch.Tensor, torchs: torch.Tensor) -> int:
    """Elements whose bits differ, ours cast to torch's dtype (the stats are float32 on CUDA)."""
    return byte_mismatch(ours.to(torchs.dtype).reshape(torchs.shape), torchs)[0]


def probe_length(n: int, rows: int, seed: int) -> dict:
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    x = (torch.randn(rows, n, device=DEVICE, generator=gen) * 1.7 + 0.2).bfloat16()
    w = (1 + 0.3 * torch.randn(n, device=DEVICE, generator=gen)).bfloat16()
    xf = x.float()
    ln_out, ln_mean, ln_rstd = torch.native_layer_norm(x, [n], None, None, EPS)
    ln_mean, ln_rstd = ln_mean.view(rows), ln_rstd.view(rows)
    rms_out = F.rms_norm(x, (n,), weight=w, eps=EPS)
    entry = {"n": n, "what": LENGTHS.get(n, ""), "rows": rows, "seed": seed, "candidates": {}}

    def layer_norm_from(mean, var):
        rstd = torch.rsqrt(var + EPS)
        out = (rstd[:, None] * (xf - mean[:, None])).bfloat16()
        return {"mean_rows_differ": _differs(mean, ln_mean), "rstd_rows_differ": _differs(rstd, ln_rstd),
                "output_elements_differ": _differs(out, ln_out)}

    def rms_from(mean_square):
        rstd = torch.rsqrt(mean_square + EPS)
        out = (w.float() * (rstd[:, None] * xf)).bfloat16()
        return {"output_elements_differ": _differs(out, rms_out)}

    for threads in (128, 256):
        _set_threads(threads)
        try:
            mean, var = norm_order.layer_norm_stats_emulated(x)
            entry["candidates"][f"torch_order_{threads}_threads"] = {
                "layer_norm": layer_norm_from(mean, var), "rms_norm": rms_from(norm_order.rms_stat_emulated(x))}
        finally:
            _set_threads(128)
    mean = xf.mean(-1)
    entry["candidates"]["plain_fp32_reduction"] = {
        "layer_norm": layer_norm_from(mean, (xf - mean[:, None]).square().mean(-1)),
        "rms_norm": rms_from(xf.square().mean(-1))}
    entry["output_elements"] = rows * n
    return entry


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="JSON file, or a folder for norm-order.json")
    parser.add_argument("--rows", type=int, default=8192)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("norm_order_probe: no CUDA device", file=sys.stderr)
        return 2
    results = []
    for i, n in enumerate(LENGTHS):
        rows = args.rows * (16 if n <= 128 else 1)
        entry = probe_length(n, rows, seed=1000 + i)
        results.append(entry)
        for name, cand in entry["candidates"].items():
            print(f"n={n:5d} {name:24s} LN mean/rstd rows differ {cand['layer_norm']['mean_rows_differ']}/"
                  f"{cand['layer_norm']['rstd_rows_differ']}, LN out {cand['layer_norm']['output_elements_differ']}"
                  f", RMS out {cand['rms_norm']['output_elements_differ']} of {entry['output_elements']}",
                  flush=True)
    matched = all(c["layer_norm"]["mean_rows_differ"] == c["layer_norm"]["rstd_rows_differ"]
                  == c["layer_norm"]["output_elements_differ"] == c["rms_norm"]["output_elements_differ"] == 0
                  for r in results for name, c in r["candidates"].items() if name == "torch_order_128_threads")
    report = {
        **environment(),
        "eps": EPS, "torch_order_128_threads_bit_exact": matched, "results": results,
    }
    if args.out:
        write_json(report, args.out, "norm-order")
    return 0


if __name__ == "__main__":
    sys.exit(main())
