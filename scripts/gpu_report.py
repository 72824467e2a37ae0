"""Write docs/gpu-report.md from the GPU results kept in benchmarks/results/, so every figure in the report is one
of their JSON's, and put the kernel table into README.md.

    python3 scripts/gpu_report.py [RESULTS] [--out docs/gpu-report.md] [--readme README.md]

RESULTS (default benchmarks/results) holds the files `benchmarks/gpu_evidence.py --out DIR` writes:
gpu-evidence.json, kernels.json, gates.json, gpu-fp8-gates.json and blocks.json; each section of the report names
the file it reads and that file's date. Everything below the notes marker of the existing report (the analysis
written by hand) is kept as it is.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

FILES = {"evidence": "gpu-evidence.json", "kernels": "kernels.json", "gates": "gates.json",
         "fp8": "gpu-fp8-gates.json", "blocks": "blocks.json"}
NOTES_MARKER = "<!-- notes: written by hand; scripts/gpu_report.py keeps everything below this line -->"


def load(folder: Path, name: str):
    path = folder / name
    return json.loads(path.read_text()) if path.exists() else None


def date_of(data: dict) -> str:
    """The run's UTC date and time, from the header at the top or under "environment"."""
    found = data.get("date") or (data.get("environment") or {}).get("date") or "date unknown"
    return found[:16].replace("T", " ")


def source(folder: Path, name: str, data: dict) -> str:
    return f"From `{folder / name}` ({date_of(data)} UTC)."


def checks(entry: dict) -> list[dict]:
    data = (entry or {}).get("json") or {}
    return data.get("checks", [])


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def torch_section(ev: dict) -> list[str]:
    tp = ev["torch_patches"]
    stock = {c["name"]: c for c in checks(tp["verify_stock"])}
    applied = {c["name"]: c for c in checks(tp["verify_applied"])}
    lines = ["## torch patches on this GPU", "",
             f"Target: the machine's own env `{tp['target']}` (torch {ev['torch']}). `applier apply --only torch`, "
             "`applier verify --device cuda` before and after, `applier revert`.", "",
             "| patch | stock (verify before apply) | patched (verify after apply) |", "|---|---|---|"]
    for name in sorted(n for n in applied if n.startswith("effect:torch/")):
        s, a = stock.get(name, {}), applied[name]
        lines.append(f"| `{name[len('effect:'):]}` | {s.get('outcome')}: {s.get('reason', '')} | "
                     f"{a['outcome']}: {a['reason']} |")
    rec = tp["record_after_revert"]
    lines += ["", f"After `applier revert`: {rec['match_record']} of {rec['files']} `torch/cuda/*.py` files match "
                  f"torch's RECORD sha256" + (f" (differ: {rec['differ']})" if rec["differ"] else "") + ".", ""]
    return lines


def comfy_section(ev: dict) -> list[str]:
    c = ev["comfyui"]
    lines = ["## ComfyUI patches (a ComfyUI-shaped tree, the machine's Python)", "",
             "| check | outcome | reason |", "|---|---|---|"]
    for chk in checks(c["verify_applied"]):
        if chk["name"].startswith("effect:torch/"):
            continue
        lines.append(f"| `{chk['name']}` | {chk['outcome']} | {chk['reason']} |")
    oom = next((chk["numbers"].get("real_oom") for chk in checks(c["verify_applied"])
                if chk["name"] == "effect:comfyui/oom-retry"), None)
    if oom:
        lines += ["", f"Real out-of-memory: {oom['free_bytes_before'] / 2**30:.1f} GiB free of "
                      f"{oom['total_bytes'] / 2**30:.1f} GiB; \"weights\" of {oom['held_weights_bytes'] / 2**30:.1f} "
                      f"GiB loaded; the node asked for {oom['node_request_bytes'] / 2**30:.1f} GiB and got "
                      f"`{oom['first_error']}`; the retry after unloading allocated "
                      f"{(oom['retry_allocated_bytes'] or 0) / 2**30:.1f} GiB ({oom['calls']} calls)."]
    lines += ["", f"Byte-identical after `applier revert`: {c['byte_identical_after_revert']}.", ""]
    return lines


def kernels_section(k: dict) -> list[str]:
    kitchen = any("ms" in (r.get("comfy_kitchen_cuda") or {}) for r in k["results"])
    lines = ["## Kernels (GB/s; each input read once, each output written once)", "",
             f"Copy ceiling measured in the same run: {k['copy_ceiling_gbs']:.0f} GB/s. comfy-kitchen: "
             f"{k['comfy_kitchen']}.", "",
             "| op | L | eager | torch.compile | " + ("comfy-kitchen cuda | " if kitchen else "") +
             "overlay | % of copy | % of same-size copy | x compile | " + ("x comfy-kitchen | " if kitchen else "") +
             "x eager |",
             "|---|---|---|---|---|---|---|---|" + ("---|---|" if kitchen else "") + "---|"]
    for r in k["results"]:
        same = r["overlay"].get("of_same_size_copy")
        ck = r.get("comfy_kitchen_cuda") or {}
        lines.append(f"| {r['op']} | {r['L']} | {r['eager']['gbs']:.0f} | {r['torch_compile']['gbs']:.0f} | " +
                     (f"{ck['gbs']:.0f} | " if "ms" in ck else "- | " if kitchen else "") +
                     f"{r['overlay']['gbs']:.0f} | {pct(r['overlay']['of_copy_ceiling'])} | "
                     f"{'' if same is None else pct(same)} | {r['overlay_vs_compile']:.2f} | " +
                     (f"{r['overlay_vs_comfy_kitchen']:.2f} | " if "ms" in ck else "- | " if kitchen else "") +
                     f"{r['overlay_vs_eager']:.1f} |")
    lines += ["", "% of same-size copy: the overlay's time against a plain copy of the same bytes timed the same way "
                  "(at L=4096 a copy does not reach the 1 GiB copy's rate either).", ""]
    diffs = [(r["op"], r["L"], r["overlay"]["max_abs_diff_vs_eager"], r["comfy_kitchen_cuda"]["max_abs_diff_vs_eager"])
             for r in k["results"] if "ms" in (r.get("comfy_kitchen_cuda") or {})]
    if diffs:
        lines += ["Max |diff| against ComfyUI's eager chain on the timed inputs (the overlay's / comfy-kitchen's): " +
                  "; ".join(f"{op} L={L}: {o:.3g} / {c:.3g}" for op, L, o, c in diffs) + ".", ""]
    return lines


def parity_section(g: dict) -> list[str]:
    lines = ["## Parity (bf16/fp16 gate: <= 1 ulp on >= 99.9% and <= 2 ulp max vs ComfyUI's eager chain)", "",
             "`kernel vs fp64` and `eager vs fp64` are the max |diff| of the overlay and of ComfyUI's own eager "
             "chain against an fp64 reference: where they are equal, the overlay is as accurate as what it "
             "replaces.", "",
             "| case | status | max ulp vs eager | within 1 ulp | kernel vs fp64 | eager vs fp64 |",
             "|---|---|---|---|---|---|"]
    as_accurate = []
    for case in g["cases"]:
        k64 = max((o["max_abs_diff"] for o in case.get("vs_fp64") or []), default=None)
        e64 = max((o["max_abs_diff"] for o in case.get("eager_vs_fp64") or []), default=None)
        if k64 is not None and e64 is not None:
            as_accurate.append(k64 <= e64)
        ulp_gate = case.get("gate_kind") == "ulp"
        within = case.get("within_one_ulp_fraction") if ulp_gate else None
        lines.append(f"| {case['name']} | {case['status']} | {case.get('max_ulp') if ulp_gate else '-'} | "
                     f"{'-' if within is None else f'{100 * within:.4f}%'} | {'' if k64 is None else f'{k64:.3g}'} | "
                     f"{'' if e64 is None else f'{e64:.3g}'} |")
    failed = sum(c["status"] == "failed" for c in g["cases"])
    lines += ["", f"{failed} of {len(g['cases'])} cases fail the gate; in {sum(as_accurate)} of {len(as_accurate)} "
                  "cases the overlay's max |diff| against fp64 is no larger than the eager chain's own.", ""]
    return lines


def fp8_section(f: dict, b: dict) -> list[str]:
    gemm = b["gemm"]
    err = f["gemm_relative_frobenius_error"]
    quant_bytes = gemm["shape_MKN"][0] * gemm["shape_MKN"][1] * 3     # bf16 in, fp8 out
    lines = ["## FP8", "",
             f"- Quantisation codes byte-exact vs eager (dynamic, ComfyUI unit and static scale; bf16/fp16/fp32): "
             f"{f['quantize_codes_byte_exact']}; ComfyUI fp8 module output bit-identical: "
             f"{f['comfy_fp8_module_bit_identical']}.",
             f"- FP8 GEMM relative Frobenius error vs bf16: {err['fp8_vs_bf16']:.4f} (gate 0.05: "
             f"{f['gemm_error_gate_5pct']}).",
             f"- GEMM M,K,N = {gemm['shape_MKN']}"
             + (f" ({gemm['timing']})" if gemm.get("timing") else " (CUDA events around each call as it is issued)")
             + ": " + ", ".join(f"{k} {v:.3f} ms" for k, v in gemm["ms"].items()) + ".",
             f"- TFLOP/s: " + ", ".join(f"{k} {v:.0f}" for k, v in gemm["tflops"].items()) + ".",
             f"- fp8_linear including activation quantisation vs bf16: "
             f"{gemm['speedup_fp8_incl_quant_vs_bf16']:.2f}x (target 1.6x); pre-quantised GEMM alone: "
             f"{gemm['ms']['bf16_linear'] / gemm['ms']['fp8_prequantised_gemm']:.2f}x.",
             f"- Dynamic quantisation alone: {quant_bytes / gemm['ms']['triton_dynamic_quant_only'] / 1e6:.0f} GB/s "
             f"counting input once + output once (eager "
             f"{quant_bytes / gemm['ms']['eager_dynamic_quant_only'] / 1e6:.0f} GB/s)."]
    if (bound := gemm.get("bound")):
        lines.append(f"- Bound at this GEMM: with the quantisation at its two-pass floor ({bound['copy_gbs']:.0f} GB/s "
                     f"copy, {bound['two_pass_quant_floor_ms'] * 1000:.0f} us) the linear could reach "
                     f"{bound['speedup_if_quant_at_floor']:.2f}x; with free quantisation "
                     f"{bound['speedup_if_quant_free']:.2f}x"
                     + (f" (the GEMM {bound['fastest_prequantised_gemm_ms']:.3f} ms; 1.6x leaves the quantisation "
                        f"{bound['quant_budget_for_1.6x_ms'] * 1000:.0f} us)" if "quant_budget_for_1.6x_ms" in bound
                        else " (the exact-accumulation GEMM)") + ".")
    lines.append("")
    return lines


def blocks_section(b: dict) -> list[str]:
    lines = ["## Block stack (Flux-shaped: 2 double + 4 single blocks, 512 text tokens, bf16)", "",
             "Each run is one process; `graph` is the call captured in a CUDA graph and replayed (GPU time without "
             "host launch gaps). Peak total: torch.cuda.max_memory_allocated over one call, weights and FP8 codes "
             "included.", "",
             "| image tokens | variant | ms (median) | spread over rounds | speedup vs stock | graph speedup | "
             "peak total (MiB) | peak above start (MiB) | rel. error vs stock |",
             "|---|---|---|---|---|---|---|---|---|"]
    tokens = b["block_stack"]["shape"]["img_tokens"]
    for name, v in b["block_stack"]["variants"].items():
        spread = v.get("spread_ms")
        graph = v.get("graph_replay_speedup_vs_stock")
        total = v.get("peak_total_mib")
        lines.append(f"| {tokens} | {name} | {v['ms']:.2f} | "
                     f"{'' if not spread else f'{spread[0]:.2f}-{spread[1]:.2f}'} | {v['speedup_vs_stock']:.2f}x | "
                     f"{'' if graph is None else f'{graph:.2f}x'} | {'' if total is None else f'{total:.0f}'} | "
                     f"{v['peak_above_start_mib']:.0f} | {v['relative_frobenius_error_vs_stock']:.4f} |")
    b = b["block_stack"]
    lines += ["", f"FP8 codes of the block Linears: {b['fp8_weight_copies_mib']:.0f} MiB; all weights "
                  f"{b['weights_mib']:.0f} MiB in bf16. `overlays_fp8` holds the codes beside the bf16 weights; "
                  "`overlays_fp8_weights_replaced` (`enable(..., fp8_weights=\"replace\")`) keeps those Linears' "
                  "bf16 weights in host memory.", ""]
    return lines


def with_source(lines: list[str], note: str) -> list[str]:
    """A section with the line naming its file after its heading."""
    return lines[:2] + [note, ""] + lines[2:]


def kept_notes(report: Path) -> list[str]:
    """The hand-written part of the existing report: the marker and everything below it."""
    if not report.exists() or NOTES_MARKER not in report.read_text():
        return [NOTES_MARKER, ""]
    return [NOTES_MARKER + report.read_text().split(NOTES_MARKER, 1)[1].rstrip("\n")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, nargs="?", default=Path("benchmarks/results"))
    parser.add_argument("--out", type=Path, default=Path("docs/gpu-report.md"))
    parser.add_argument("--readme", type=Path, default=Path("README.md"),
                        help="its block between the gpu-table markers gets the kernel table")
    args = parser.parse_args()
    folder = args.results
    data = {key: load(folder, name) for key, name in FILES.items()}
    ev = data["evidence"]
    if ev is None:
        raise SystemExit(f"{folder / FILES['evidence']} not found: run benchmarks/gpu_evidence.py --out {folder}")
    head = [f"# GPU report: {ev['gpu']} (sm_{ev['capability'][0]}{ev['capability'][1]})", "",
            f"Generated by `scripts/gpu_report.py` from the JSON in `{folder}` (torch {ev['torch']}, triton "
            f"{ev['triton']}, CUDA {ev['cuda']}, Python {ev['python']}); every figure above the notes is read from "
            "the file its section names. What each file is and the command that produced it: "
            f"`{folder / 'README.md'}`.", ""]
    note = lambda key: source(folder, FILES[key], data[key])  # noqa: E731
    body = with_source(torch_section(ev), note("evidence")) + comfy_section(ev)
    if (k := data["kernels"]):
        body += with_source(kernels_section(k), note("kernels"))
    if (g := data["gates"]):
        body += with_source(parity_section(g), note("gates"))
    b = data["blocks"]
    if (f := data["fp8"]) and b:
        body += with_source(fp8_section(f, b), f"From `{folder / FILES['fp8']}` ({date_of(f)} UTC) and "
                            f"`{folder / FILES['blocks']}` ({date_of(b)} UTC).")
    if b:
        body += with_source(blocks_section(b), note("blocks"))
    notes = kept_notes(args.out)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(head + body + notes).rstrip() + "\n")
    if k and args.readme.exists():
        update_readme(args.readme, kernels_section(k)[2:], f"{k['gpu']}, torch {k['torch']}, triton "
                      f"{k['triton']}, {date_of(k)[:10]}, from `{folder / FILES['kernels']}`")


START, END = "<!-- gpu-table:start -->", "<!-- gpu-table:end -->"


def update_readme(readme: Path, table: list[str], source: str) -> None:
    text = readme.read_text()
    if START not in text or END not in text:
        return
    before, rest = text.split(START, 1)
    _, after = rest.split(END, 1)
    block = [START, f"Latest kernel table ({source}; generated by scripts/gpu_report.py):", "", *table, END]
    readme.write_text(before + "\n".join(block) + after)


if __name__ == "__main__":
    main()
