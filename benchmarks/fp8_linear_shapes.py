"""FP8 Linear against bf16 F.linear per shape, and the table the pack's per-call rule reads (issue 29.2).

For M rows (powers of two, 64 to 65536) and the (K, N) of the Linears of Flux-dev, Wan 2.1 14B and Qwen-Image, on
the GPU, each path timed three ways over a loop of eager calls (no CUDA graph):
- gpu_us: CUDA events around the loop, the loop queued behind a sleep kernel so the GPU runs it back to back;
- host_us: the host's time to issue one call (measured while that sleep keeps the GPU busy: the queue never
  pushes back);
- wall_us: the loop from a synchronised start to a synchronised end, per call (what a host-bound step sees).
Paths: `bf16` (F.linear), `fp8_cached` (per-tensor codes kept: the legacy codes beside the weights),
`fp8_cached_rowwise` (row-wise codes kept: DynamicVRAM's resident codes), `fp8_per_call` (the weight quantised
per call by the earlier path: two launches per tensor, then the GEMM) and `fp8_per_call_rowwise` (the fused path:
one launch for both operands' row-wise codes, then the row-wise GEMM).

    python -m benchmarks fp8-linear-shapes --out FILE [--time-budget S]     # measure (a CUDA GPU, sm_89+)
    python -m benchmarks fp8-linear-shapes --from FILE --write-table [PATH] # the pack's table from a measurement

Each shape runs in its own try/except and the JSON is rewritten after each, so a run cut short by its budget or a
failure leaves what it measured. `--write-table` derives, per mechanism (per_call: fp8_per_call_rowwise; cached:
the slower of fp8_cached and fp8_cached_rowwise) and per measured K, the fewest rows from which FP8's wall time
was at most bf16's at that row count and every larger one, for every N of that K (null where it never was), and
writes fused_dit/fp8_linear_shapes.json citing this file's `table` key.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from . import results

REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / "overlays" / "fused_dit" / "fp8_linear_shapes.json"
ROWS = tuple(2 ** p for p in range(6, 17))
# (K, N) -> the Linears that have it
SHAPES = {
    (3072, 3072): "Flux-dev attn proj, Qwen-Image to_out / add projections",
    (3072, 9216): "Flux-dev double-block qkv",
    (3072, 12288): "Flux-dev / Qwen-Image MLP in",
    (12288, 3072): "Flux-dev / Qwen-Image MLP out",
    (3072, 21504): "Flux-dev single-block linear1",
    (15360, 3072): "Flux-dev single-block linear2",
    (5120, 5120): "Wan 2.1 14B attention q/k/v/o",
    (5120, 13824): "Wan 2.1 14B FFN in",
    (13824, 5120): "Wan 2.1 14B FFN out",
}
PATHS = ("bf16", "fp8_cached", "fp8_cached_rowwise", "fp8_per_call", "fp8_per_call_rowwise")
MECHANISM_PATHS = {"per_call": ("fp8_per_call_rowwise",), "cached": ("fp8_cached", "fp8_cached_rowwise")}
SLEEP_CYCLES = 40_000_000          # about 20 ms on an H200: longer than any loop takes to issue


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=results.RESULTS / "fp8-linear-shapes-h200.json")
    parser.add_argument("--time-budget", type=float, default=150.0, help="seconds of measuring before it stops")
    parser.add_argument("--from", dest="source", type=Path, help="derive from this measurement instead of measuring")
    parser.add_argument("--write-table", nargs="?", const=TABLE, type=Path, default=None,
                        help=f"write the pack's table (default {TABLE.relative_to(REPO)})")
    parser.add_argument("--rows", type=int, nargs="*", default=list(ROWS))


def import_paths(options) -> list[Path]:
    return [REPO / "overlays"]


def _paths(x, w, b):
    import torch.nn.functional as F
    from fused_dit.integration import fp8_weights
    from fused_dit.ops import fp8_linear as fl
    cached = fl.Fp8Weight(*fl.quantize_weight_fp8(w), False, None, ())
    rowwise = fl.Fp8Weight(*fl.quantize_weight_fp8_rows(w), False, None, ())
    return {
        "bf16": lambda: F.linear(x, w, b),
        "fp8_cached": lambda: fl.linear_fp8_triton(x, cached, b),
        "fp8_cached_rowwise": lambda: fl.linear_fp8_triton(x, rowwise, b),
        "fp8_per_call": lambda: fl.linear_fp8_triton(x, fp8_weights.fp8_weight(*fl.quantize_weight_fp8(w)), b),
        "fp8_per_call_rowwise": lambda: fl.linear_fp8_triton(x, fl.per_call_weight(w), b),
    }


def time_path(fn) -> dict:
    import torch
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    calls = max(5, min(30, int(0.02 / max(time.perf_counter() - t0, 1e-6))))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(SLEEP_CYCLES)
    start.record()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host = time.perf_counter() - t0
    end.record()
    torch.cuda.synchronize()
    gpu_ms = start.elapsed_time(end)
    walls = []
    for _ in range(2):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - t0)
    return {"calls": calls, "gpu_us": round(gpu_ms * 1e3 / calls, 2), "host_us": round(host * 1e6 / calls, 2),
            "wall_us": round(min(walls) * 1e6 / calls, 2)}


def measure(options) -> dict:
    import torch
    from fused_dit.integration import fp8_shapes
    fp8_shapes.use_table(None)
    report = {"benchmark": "fp8-linear-shapes", "environment": results.environment(), "shapes": {
        f"{k}x{n}": what for (k, n), what in SHAPES.items()}, "paths": list(PATHS), "cases": [], "cut_by_budget": []}
    began = time.perf_counter()
    torch.manual_seed(0)
    with torch.inference_mode():
        for m in options.rows:                  # fewest rows first: the crossovers before the largest GEMMs
            for (k, n) in SHAPES:
                if time.perf_counter() - began > options.time_budget:
                    report["cut_by_budget"].append([m, k, n])
                    continue
                case = {"m": m, "k": k, "n": n}
                try:
                    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
                    b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
                    for name, fn in _paths(x, w, b).items():
                        try:
                            case[name] = time_path(fn)
                        except Exception as exc:  # one path failing leaves the others
                            case[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                    del x, w, b
                except Exception as exc:
                    case["error"] = f"{type(exc).__name__}: {exc}"[:300]
                torch.cuda.empty_cache()
                report["cases"].append(case)
                report["elapsed_s"] = round(time.perf_counter() - began, 1)
                report["table"] = derive_table(report["cases"])
                results.write_json(report, options.out)
    return report


def _wall(case: dict, path: str) -> float | None:
    timing = case.get(path)
    return timing.get("wall_us") if isinstance(timing, dict) else None


def fp8_wins(case: dict, mechanism: str) -> bool | None:
    """Whether the mechanism's FP8 wall time was at most bf16's for this case (None: not measured)."""
    stock = _wall(case, "bf16")
    walls = [_wall(case, path) for path in MECHANISM_PATHS[mechanism]]
    walls = [w for w in walls if w is not None]
    if stock is None or not walls:
        return None
    return max(walls) <= stock


def derive_table(cases: list[dict]) -> dict:
    """{mechanism: [{"max_k": K, "rows": fewest rows from which FP8 won at every larger row count and every N of
    that K, or None}]} over the measured Ks."""
    table = {}
    for mechanism in MECHANISM_PATHS:
        bands = []
        for k in sorted({case["k"] for case in cases}):
            verdicts: dict[int, bool] = {}
            for case in cases:
                if case["k"] != k:
                    continue
                won = fp8_wins(case, mechanism)
                if won is not None:
                    verdicts[case["m"]] = verdicts.get(case["m"], True) and won
            rows = None
            for m in sorted(verdicts, reverse=True):
                if not verdicts[m]:
                    break
                rows = m
            if verdicts:
                bands.append({"max_k": k, "rows": rows})
        table[mechanism] = bands
    return table


def write_table(report: dict, source: Path, path: Path) -> Path:
    table = report.get("table") or derive_table(report["cases"])
    try:
        cited = str(source.resolve().relative_to(results.RESULTS))
    except ValueError:
        cited = source.name
    data = {"about": json.loads(TABLE.read_text(encoding="utf-8"))["about"] if TABLE.exists() else "",
            "measured": True,
            "derived": f"python -m benchmarks fp8-linear-shapes --from benchmarks/results/{cited} --write-table "
                       f"(the GPU of that run: {report.get('environment', {}).get('gpu')})",
            "evidence": {"file": cited, "key": "table"},
            "min_rows": table}
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    return path


def run(options, parser) -> int:
    if options.source is not None:
        report = json.loads(options.source.read_text(encoding="utf-8"))
        source = options.source
    else:
        import torch
        if not torch.cuda.is_available():
            parser.error("measuring needs a CUDA GPU (sm_89+); --from FILE derives the table from a measurement")
        report = measure(options)
        source = options.out
    if options.write_table is not None:
        if not report.get("cases"):
            parser.error(f"{source}: no cases measured")
        print(f"wrote {write_table(report, source, options.write_table)}")
    else:
        print(json.dumps(report.get("table") or derive_table(report.get("cases", []))))
    return 0
