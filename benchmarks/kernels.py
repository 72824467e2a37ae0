"""Kernel benchmark of the fused DiT ops on CUDA: eager, torch.compile of the eager chain, the Triton overlay.

Bandwidth counts each input read once and each output written once, against a copy ceiling (x.copy_ of a large
bf16 tensor) measured in the same run. CUDA-event timing, warm-up, median of repeats. comfy-kitchen's CUDA backend
is timed too where it is importable and has the op (adaln, Flux rms_rope). Each row also times a
plain copy of the same number of bytes (`same_size_copy`): at L=4096 a copy does not reach the 1 GiB ceiling
either. `--sweep` first tries launch configurations per op at each L and uses the fastest for that L's rows.

    PYTHONPATH=overlays:. python benchmarks/kernels.py --sweep --out benchmarks/results/
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import itertools
import math
import statistics
import sys
from pathlib import Path

import torch

from fused_dit.ops import adaln, gate_add, quantize_fp8, rms_rope
from results_io import environment, write_json

DEVICE = "cuda"
BF16 = torch.bfloat16
FLUX_HEADS, HEAD_DIM, FLUX_C = 24, 128, 3072
WAN_HEADS, WAN_C = 40, 5120
_L2_FLUSH = None   # a 256 MiB buffer zeroed before each timed call (set in main)


def time_ms(fn, warmup: int = 10, repeats: int = 50, l2_flush: torch.Tensor | None = None) -> float:
    """Median per-call GPU time: CUDA events around each call, L2 flushed before each, no host sync inside.

    A long `torch.cuda._sleep` first lets the host queue every call before the GPU starts, so the events time
    the kernels and not Python's launch overhead (which the eager chain and the wrappers both have). The buffer
    zeroed to flush L2 is `l2_flush`, else the one main() set up (none: no flush).
    """
    l2_flush = _L2_FLUSH if l2_flush is None else l2_flush
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    torch.cuda._sleep(100_000_000)
    for start, end in zip(starts, ends):
        if l2_flush is not None:
            l2_flush.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def nbytes(*tensors) -> int:
    """Bytes of each distinct tensor read or written once (a broadcast modulation counts its own size)."""
    return sum(t.numel() * t.element_size() for t in tensors)


def copy_ceiling_gbs() -> float:
    src = torch.randn(512 * 1024 * 1024, device=DEVICE, dtype=BF16)   # 1 GiB
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), warmup=5, repeats=20)
    del src, dst
    return 2 * 1024 ** 3 / ms / 1e6


def rotation_table(leading, half):
    angle = torch.rand((*leading, half), device=DEVICE) * 2 * math.pi
    cos, sin = angle.cos(), angle.sin()
    return torch.stack([cos, -sin, sin, cos], dim=-1).view(*leading, half, 2, 2)


def problems(L: int):
    """(op, overlay fn taking the op's launch setting, eager fn, inputs, bytes moved) at sequence length L with Flux
    (and Wan for rms_rope) shapes."""
    qkv = torch.randn(1, L, 3 * FLUX_C, device=DEVICE, dtype=BF16)
    q, k, _ = qkv.view(1, L, 3, FLUX_HEADS, HEAD_DIM).permute(2, 0, 3, 1, 4)
    sq, sk = torch.ones(HEAD_DIM, device=DEVICE, dtype=BF16), torch.ones(HEAD_DIM, device=DEVICE, dtype=BF16)
    pe = rotation_table((1, 1, L), HEAD_DIM // 2)
    flux_bytes = 2 * nbytes(q) + nbytes(pe) + 2 * nbytes(q)
    yield ("rms_rope_flux", lambda launch: rms_rope.flux_rms_rope(q, k, sq, sk, pe, launch=launch),
           lambda q, k, sq, sk, pe: rms_rope.flux_reference_comfy(q, k, sq, sk, pe), (q, k, sq, sk, pe), flux_bytes)

    wq_in, wk_in = (torch.randn(1, L, WAN_C, device=DEVICE, dtype=BF16) for _ in range(2))
    ww = torch.ones(WAN_C, device=DEVICE, dtype=BF16)
    freqs = rotation_table((1, L, 1), HEAD_DIM // 2)
    wan_bytes = 4 * nbytes(wq_in) + nbytes(freqs)
    yield ("rms_rope_wan", lambda launch: rms_rope.wan_rms_rope(wq_in, wk_in, ww, ww, freqs, WAN_HEADS, launch=launch),
           lambda q, k, wq, wk, f: rms_rope.wan_reference_comfy(q, k, wq, wk, f, WAN_HEADS),
           (wq_in, wk_in, ww, ww, freqs), wan_bytes)

    x = torch.randn(1, L, FLUX_C, device=DEVICE, dtype=BF16)
    y = torch.randn_like(x)
    e = torch.randn(1, 1, 6, FLUX_C, device=DEVICE, dtype=BF16)
    shift, scale, gate = e[:, :, 0], e[:, :, 1], e[:, :, 2]
    yield ("adaln", lambda launch: adaln.adaln(x, shift, scale, launch=launch), adaln.reference_comfy,
           (x, shift, scale), 2 * nbytes(x) + nbytes(shift, scale))
    yield ("gate_add_wan", lambda launch: gate_add.gate_add(x, y, gate, gate_add.WAN, launch=launch),
           lambda x, y, g: gate_add.reference_comfy(x, y, g, gate_add.WAN), (x, y, gate),
           3 * nbytes(x) + nbytes(gate))
    yield ("gate_add_flux", lambda launch: gate_add.gate_add(x, y, gate, gate_add.FLUX, launch=launch),
           lambda x, y, g: gate_add.reference_comfy(x, y, g, gate_add.FLUX), (x, y, gate),
           3 * nbytes(x) + nbytes(gate))
    if torch.cuda.get_device_capability() >= quantize_fp8.FP8_MIN_CAPABILITY:
        # a Flux block's Linear input [L, 3072]; bytes: x read once, the e4m3 codes written once (a per-tensor
        # scale needs the whole absmax before the first code, so the kernel reads x twice: see notes)
        a = torch.randn(L, FLUX_C, device=DEVICE, dtype=BF16)
        yield ("quantize_fp8_dynamic", lambda launch: quantize_fp8.quantize_fp8_dynamic(a, launch=launch),
               quantize_fp8.quantize_fp8_dynamic_reference, (a,), nbytes(a) + a.numel())


# each op's shipped launch setting (fused_dit.ops.*: one frozen value per op); gate_add_flux shares gate_add's
DEFAULT_LAUNCHES = {"rms_rope_flux": rms_rope.FLUX_LAUNCH, "rms_rope_wan": rms_rope.WAN_LAUNCH, "adaln": adaln.LAUNCH,
                    "gate_add_wan": gate_add.LAUNCH, "gate_add_flux": gate_add.LAUNCH,
                    "quantize_fp8_dynamic": quantize_fp8.LAUNCH}

SWEEPS = {
    # Grids of the launch settings' fields around the shipped defaults; the wider grids they were narrowed from are
    # in git history (the run files kernels-sweep.json's sections name). benchmarks/rms_rope_sweep.py covers the
    # rms_rope settings more widely, with parity
    "rms_rope_flux": {"tokens_per_program": (1, 2), "heads_per_step": (4, 8), "num_warps": (2, 4),
                      "split_qk": (False,), "prefetch": (False, True)},
    "rms_rope_wan": {"tokens_per_program": (1,), "heads_per_step": (8,), "num_warps": (2, 4), "stats_unroll": (5,),
                     "loop_unroll": (5,), "prefetch": (False,), "held_max_steps": (0, 16)},
    "adaln": {"rows_per_program": (1, 2), "num_warps": (1, 2), "shared_modulation": (True,), "stats_unroll": (2,),
              "loop_unroll": (2,), "loop_stages": (None,), "prefetch": (True,), "held_max_steps": (8,),
              "mod_ahead": (0, 1)},
    "gate_add_wan": {"elements_per_program": (2048, 4096, 8192), "max_block_c": (512, 1024), "num_warps": (4, 8)},
    "quantize_fp8_dynamic": {"dynamic_elements_per_iteration": (4096, 8192), "dynamic_num_warps": (8, 16),
                             "dynamic_programs_per_sm": (0, 8)},
}




def launch_config(launches: dict) -> dict:
    """The launch settings `launches` holds, as plain dicts (for the JSON)."""
    return {op: dataclasses.asdict(launch) for op, launch in launches.items()}


def same_size_copy_ms(moved: int) -> float:
    """A device copy moving `moved` bytes in all (half read, half written), timed like the ops."""
    src = torch.empty(max(moved // 4, 1), device=DEVICE, dtype=BF16).normal_()
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src))
    del src, dst
    return ms


def sweep(L: int, ops=None) -> tuple[dict, dict]:
    """Try each launch setting at length L (of `ops`, default all); (the report of all, the fastest per op)."""
    report, fastest = {}, {}
    by_op = {p[0]: p for p in problems(L)}
    for op, grid in SWEEPS.items():
        if op not in by_op or (ops and op not in ops):      # quantize_fp8_dynamic below sm_89
            continue
        overlay = by_op[op][1]
        trials = []
        for values in itertools.product(*grid.values()):
            config = dict(zip(grid.keys(), values))
            launch = dataclasses.replace(DEFAULT_LAUNCHES[op], **config)
            try:
                trials.append((time_ms(lambda: overlay(launch), warmup=3, repeats=20), config, launch))
            except Exception as exc:  # a configuration the compiler rejects (registers) is reported, not fatal
                trials.append((float("inf"), {**config, "error": f"{type(exc).__name__}: {exc}"[:200]}, None))
        best_ms, best, fastest[op] = min(trials, key=lambda t: t[0])
        report[op] = {"L": L, "best": best, "best_ms": best_ms,
                      "trials": [{"ms": ms, **cfg} for ms, cfg, _ in trials]}
        print(f"sweep {op}: best {best} {best_ms:.4f} ms", flush=True)
    # gate_add_flux shares gate_add_wan's launch setting
    if "gate_add_wan" in fastest:
        fastest["gate_add_flux"] = fastest["gate_add_wan"]
    return report, fastest


def comfy_kitchen_status() -> str:
    try:
        import comfy_kitchen
        from comfy_kitchen.registry import registry
    except Exception as exc:
        return f"not importable ({type(exc).__name__}: {exc})"
    cuda = registry.list_backends().get("cuda") or {}
    if cuda.get("available") and not cuda.get("disabled"):
        state = "available"
    else:
        why = cuda.get("unavailable_reason") or ("disabled" if cuda else "not registered")
        state = f"unavailable ({why})"
    try:
        version = importlib.metadata.version("comfy-kitchen")
    except importlib.metadata.PackageNotFoundError:
        version = getattr(comfy_kitchen, "__version__", "version unknown")
    return f"{version}, cuda backend {state}"


# comfy-kitchen's function and keyword arguments for an op's inputs, where it has the same op: its adaln takes scale
# before shift (and computes `layer_norm(x) * (1 + scale) + shift`), its rms_rope is Flux's per-head norm and
# interleaved rope. Wan's full-C norm, the gated residual and dynamic per-tensor quantisation are not among its ops
KITCHEN_CALLS = {
    "adaln": lambda x, shift, scale: ("adaln", {"x": x, "scale": scale, "shift": shift, "eps": 1e-6}),
    "rms_rope_flux": lambda q, k, sq, sk, pe: ("rms_rope", {"q": q, "k": k, "freqs_cis": pe, "q_scale": sq,
                                                            "k_scale": sk, "epsilon": 1e-6}),
}


def comfy_kitchen_cuda(op: str, inputs):
    """(a call of comfy-kitchen's CUDA backend on the op's inputs, None), or (None, why there is none)."""
    if op not in KITCHEN_CALLS:
        return None, "comfy-kitchen has no such op"
    try:
        from comfy_kitchen.registry import registry
        name, kwargs = KITCHEN_CALLS[op](*inputs)
        impl = registry.get_implementation(name, backend="cuda", kwargs=kwargs)
    except Exception as exc:   # not installed, no CUDA backend, or it declines these inputs
        return None, f"{type(exc).__name__}: {exc}"[:300]
    return (lambda: impl(**kwargs)), None


def max_abs_diff(got, expected) -> float:
    """Largest |got - expected| over an output or a tuple of outputs."""
    pairs = zip(got, expected) if isinstance(got, tuple) else [(got, expected)]
    return max((a.float() - b.float()).abs().max().item() for a, b in pairs)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="JSON file, or a folder for kernels-<date>.json")
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--sweep", action="store_true", help="tune launch configurations first")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    parser.add_argument("--ops", nargs="+", help="only these ops (sweep and table)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("kernels: no CUDA device", file=sys.stderr)
        return 2
    global _L2_FLUSH
    _L2_FLUSH = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device=DEVICE)
    ceiling = copy_ceiling_gbs()
    print(f"copy ceiling {ceiling:.0f} GB/s", flush=True)
    sweep_report = {} if args.sweep else None
    rows = []
    for L in args.lengths:
        launches = dict(DEFAULT_LAUNCHES)
        if args.sweep:
            # each length gets its own best setting, swept around the defaults; the rows at L use it
            sweep_report[str(L)], fastest = sweep(L, args.ops)
            launches.update(fastest)
        for op, overlay, eager, inputs, moved in problems(L):
            if args.ops and op not in args.ops:
                continue
            copy_ms = same_size_copy_ms(moved)
            launch = launches[op]
            row = {"op": op, "L": L, "bytes": moved, "launch_config": dataclasses.asdict(launch),
                   "same_size_copy": {"ms": copy_ms, "gbs": moved / copy_ms / 1e6}}
            candidates = {"eager": lambda: eager(*inputs), "overlay": lambda: overlay(launch)}
            if not args.no_compile:
                compiled = torch.compile(eager, dynamic=False)
                candidates["torch_compile"] = lambda: compiled(*inputs)
            kitchen, why_not = comfy_kitchen_cuda(op, inputs)
            if kitchen is None:
                row["comfy_kitchen_cuda"] = {"not_measured": why_not}
            else:
                candidates["comfy_kitchen_cuda"] = kitchen
            expected = eager(*inputs)
            for name, fn in candidates.items():
                ms = time_ms(fn)
                row[name] = {"ms": ms, "gbs": moved / ms / 1e6, "of_copy_ceiling": moved / ms / 1e6 / ceiling,
                             "of_same_size_copy": copy_ms / ms, "max_abs_diff_vs_eager": max_abs_diff(fn(), expected)}
            if "torch_compile" in row:
                row["overlay_vs_compile"] = row["torch_compile"]["ms"] / row["overlay"]["ms"]
            if kitchen is not None:
                row["overlay_vs_comfy_kitchen"] = row["comfy_kitchen_cuda"]["ms"] / row["overlay"]["ms"]
            row["overlay_vs_eager"] = row["eager"]["ms"] / row["overlay"]["ms"]
            rows.append(row)
            print(f"{op:14s} L={L:6d} " + "  ".join(
                f"{n} {row[n]['ms']:.4f} ms {row[n]['gbs']:.0f} GB/s" for n in candidates), flush=True)
    report = {
        **environment(),
        "copy_ceiling_gbs": ceiling, "comfy_kitchen": comfy_kitchen_status(),
        "launch_config_defaults": launch_config(DEFAULT_LAUNCHES),
        "shapes": {"flux": f"B=1 H={FLUX_HEADS} D={HEAD_DIM} C={FLUX_C}", "wan": f"B=1 H={WAN_HEADS} C={WAN_C}",
                   "modulation": "[1, 1, C] strided chunks of a [1, 1, 6, C] tensor"},
        "results": rows, "sweep": sweep_report,
    }
    if args.out:
        write_json(report, args.out, "kernels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
