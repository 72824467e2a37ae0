"""attention-projection: the attention kernels measured on one GPU, projected onto another from published peaks.

A projection, never a measurement: each kernel keeps, on the other GPU, the fraction of peak it reached on the
measured one (attention-kernels' JSON), at the peaks of applier's GPU table (applier/data/gpus.toml, each row with
its vendor source). An exact kernel (cuDNN, FLASH: bf16 Q K^T and P V) scales with the bf16 peak. The pack's FP8
kernel in its default formats does half its work as INT8 Q K^T and half as 16-bit P V: its time is modelled as two
equal halves at one efficiency e, T = F/2 / (e * int8_peak) + F/2 / (e * bf16_peak), e fitted on the measured GPU
and kept; SageAttention 2's formats (INT8 Q K^T, e4m3 P V: SageAttention 2 itself, the pack's kernel on its recipe)
are the same two halves at the INT8 and FP8 peaks; cuDNN's FP8 SDPA (e4m3 both products, with or without the
rotation) scales with the FP8 peak; FlashAttention-4 (bf16, exact) with the bf16 peak. On an RTX 4090 INT8 runs at 4x the bf16
rate with FP32 accumulate (the H200: 2x), which is where a 4090 stands to gain more from the FP8 mode than the
H200 does; whether it does is for a 4090 to measure.

    python -m benchmarks attention-projection --from benchmarks/results/attention-kernels-h200.json --gpu rtx-4090 \\
        --out benchmarks/results/attention-projection-rtx-4090.json
"""
from __future__ import annotations

import json
from pathlib import Path

from . import results

# kernel key in attention-kernels' "speed" -> how its time scales to another GPU
EXACT_KERNELS = ("sdpa_CUDNN_ATTENTION", "sdpa_FLASH_ATTENTION", "sdpa_EFFICIENT_ATTENTION", "fa4")
INT8_QK_KERNELS = ("fp8_default", "sage")      # INT8 Q K^T, 16-bit P V (sage 1.0.6: the same formats)
INT8_QK_FP8_PV_KERNELS = ("fp8_sage2", "sage2")  # INT8 Q K^T, e4m3 P V (SageAttention 2.2's sm90 kernel, the recipe)
FP8_KERNELS = ("cudnn_fp8", "cudnn_fp8_rotated")


def gpu_table() -> dict:
    """applier's GPU table (key -> applier.budget.Gpu)."""
    from applier.budget.data import load_budget_data
    return load_budget_data().gpus


def projected_ms(kernel: str, flops: float, measured_ms: float, source, target) -> float | None:
    """The kernel's time on `target` at the fraction of peak it reached on `source` (None: no peak to scale by)."""
    if kernel in EXACT_KERNELS:
        return measured_ms * source.bf16_tflops / target.bf16_tflops
    if kernel in INT8_QK_KERNELS:
        return two_halves(flops, measured_ms, (source.int8_tops, source.bf16_tflops),
                          (target.int8_tops, target.bf16_tflops))
    if kernel in INT8_QK_FP8_PV_KERNELS:
        return two_halves(flops, measured_ms, (source.int8_tops, source.fp8_tflops),
                          (target.int8_tops, target.fp8_tflops))
    if kernel in FP8_KERNELS:
        if not (source.fp8_tflops and target.fp8_tflops):
            return None
        return measured_ms * source.fp8_tflops / target.fp8_tflops
    return None


def two_halves(flops: float, measured_ms: float, source_peaks: tuple, target_peaks: tuple) -> float | None:
    """Q K^T and P V as two equal halves of the work at the peaks of their formats and one efficiency e: e from the
    measured time, T = F/2 (1/(e*P_qk) + 1/(e*P_pv)), kept on the target (None: a peak is not known)."""
    if not (all(source_peaks) and all(target_peaks)):
        return None
    half = flops / 2 / 1e12
    e = half * sum(1 / p for p in source_peaks) / (measured_ms / 1e3)
    return 1e3 * half * sum(1 / (e * p) for p in target_peaks)


def project(measured: dict, source, target) -> dict:
    """Per shape and kernel: projected ms and TFLOPS on `target`, and speed against the projected cuDNN exact."""
    shapes = {}
    for name, shape in (measured.get("shapes") or {}).items():
        flops = shape.get("flops")
        rows = {}
        for kernel, speed in (shape.get("speed") or {}).items():
            ms = speed.get("ms") if isinstance(speed, dict) else None
            if not flops or not ms:
                continue
            projected = projected_ms(kernel, flops, ms, source, target)
            if projected is not None:
                rows[kernel] = {"measured_ms": ms, "projected_ms": round(projected, 3),
                                "projected_tflops": round(flops / projected / 1e9, 1)}
        exact = rows.get("sdpa_CUDNN_ATTENTION", {}).get("projected_ms")
        for row in rows.values():
            row["vs_cudnn_exact"] = round(exact / row["projected_ms"], 3) if exact else None
        errors = shape.get("error_dit_like") or {}
        shapes[name] = {"b_h_lq_lkv_d": shape.get("b_h_lq_lkv_d"), "flops": flops, "kernels": rows,
                        "error_dit_like": {k: v.get("relative_frobenius") for k, v in errors.items()
                                           if isinstance(v, dict)}}
    return shapes


def add_arguments(parser) -> None:
    parser.add_argument("--from", dest="source_file", type=Path, required=True,
                        help="attention-kernels' JSON (measured)")
    parser.add_argument("--gpu", required=True, help="the GPU to project onto: a key of applier/data/gpus.toml")
    parser.add_argument("--measured-on", default="h200", help="the measured GPU's key in that table (h200)")
    parser.add_argument("--out", type=Path, required=True)


def run(options, parser) -> int:
    gpus = gpu_table()
    for key in (options.gpu, options.measured_on):
        if key not in gpus:
            parser.error(f"--gpu / --measured-on {key!r}: not in applier/data/gpus.toml ({', '.join(sorted(gpus))})")
    source, target = gpus[options.measured_on], gpus[options.gpu]
    measured = json.loads(options.source_file.read_text(encoding="utf-8"))
    report = {"benchmark": "attention-projection", "script": "benchmarks/attention_projection.py",
              "projection": True,
              "what": f"attention kernels measured on the {source.name}, projected onto the {target.name} from "
                      "published peaks (not measured there; see the script's docstring for the model)",
              "from": results.placeholder_paths(str(options.source_file)),
              "measured_on": {"gpu": source.name, "bf16_tflops": source.bf16_tflops,
                              "fp8_tflops": source.fp8_tflops, "int8_tops": source.int8_tops,
                              "source": source.source},
              "projected_onto": {"gpu": target.name, "bf16_tflops": target.bf16_tflops,
                                 "fp8_tflops": target.fp8_tflops, "int8_tops": target.int8_tops,
                                 "source": target.source},
              "command": results.command_line(),
              "shapes": project(measured, source, target)}
    results.write_json(report, options.out)
    print(f"wrote {options.out}")
    return 0
