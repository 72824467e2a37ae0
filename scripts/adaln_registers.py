"""Registers of the AdaLN kernel for sm_90a with each Welford tree, from Triton's compile and ptxas -v (no GPU).

Compiles `_adaln_kernel` as the H200 launches it for Flux (bf16, C=3072: unit channel strides and 16-divisible
sizes, as Triton specialises them) with the pair-sum tree (EQUAL_HALVES) and with the general tree, at a few
rows x warps settings, and writes what ptxas reports (registers, spill bytes) as JSON.

    PYTHONPATH=overlays python scripts/adaln_registers.py --out benchmarks/results/adaln-registers.json
"""
from __future__ import annotations

import argparse
import datetime
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from fused_dit.ops import adaln

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import results_io  # noqa: E402

SETTINGS = [(8, 4), (2, 2), (1, 2), (16, 8)]
DIVISIBLE = ("x_ptr", "shift_ptr", "scale_ptr", "out_ptr", "rcp_ptr", "rows", "L", "C", "sxb", "sxl", "shb", "shr", "scb",
             "scr")
UNIT = ("sxc", "shc", "scc")


def ptxas_binaries() -> list[Path]:
    """The ptxas builds Triton ships; which one assembles a given PTX version differs by release."""
    folder = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    return [p for p in sorted(folder.glob("ptxas*")) if p.is_file()]


def assemble(ptx: str) -> tuple[str, str]:
    """(ptxas -v report, the binary's name) from the first ptxas build that accepts the PTX."""
    errors = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.ptx"
        path.write_text(ptx)
        for binary in ptxas_binaries():
            done = subprocess.run([str(binary), "-arch=sm_90a", "-v", str(path), "-o", str(Path(tmp) / "k.cubin")],
                                  capture_output=True, text=True)
            if done.returncode == 0:
                return done.stderr, binary.name
            errors.append(f"{binary.name}: {done.stderr.strip()[:200]}")
    raise RuntimeError("no ptxas accepted the PTX: " + "; ".join(errors))


def compile_once(rows: int, warps: int, equal_halves: bool) -> dict:
    kernel = adaln._adaln_kernel
    signature = {name: ("*fp32" if name == "rcp_ptr" else "*bf16" if name.endswith("_ptr") else
                        "fp32" if name == "eps" else "i32") for name in kernel.arg_names}
    # what _launch passes for Flux's rows (C=3072, 4096 tokens, per-sample modulation), with the tree chosen here
    schedule = adaln.kernel_constexprs(3072, 4096, (4096, 4096), rows_per_program=rows)
    schedule["EQUAL_HALVES"] = equal_halves
    constexprs = {**schedule, **{name: 1 for name in UNIT}}
    signature.update({name: "constexpr" for name in constexprs})
    attrs = {(kernel.arg_names.index(name),): [["tt.divisibility", 16]] for name in DIVISIBLE}
    compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": warps, "enable_fp_fusion": False})
    report, binary = assemble(compiled.asm["ptx"])
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    return {"rows": rows, "warps": warps, "tree": "pair sums" if equal_halves else "general", "schedule": schedule,
            "ptxas": binary,
            "registers": int(re.search(r"Used (\d+) registers", report).group(1)),
            "spill_store_bytes": int(spills.group(1)), "spill_load_bytes": int(spills.group(2)),
            "layout_conversions": compiled.asm["ttgir"].count("convert_layout")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    results = [compile_once(rows, warps, equal) for rows, warps in SETTINGS for equal in (True, False)]
    report = {"triton": triton.__version__, "target": "sm_90a",
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": results_io.command_line(), "kernel": "fused_dit.ops.adaln._adaln_kernel, bf16, C a multiple of 512", "results": results}
    results_io.write_json(report, args.out, "adaln-registers")
    for r in results:
        print(f"{r['rows']:2d} rows x {r['warps']} warps, {r['tree']:9s}: {r['registers']:3d} registers, "
              f"{r['layout_conversions']} layout conversions, spills {r['spill_store_bytes']} B")


if __name__ == "__main__":
    main()
