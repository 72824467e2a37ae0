"""How a result is written and indexed: `python -m benchmarks index [--check]` rewrites benchmarks/results/README.md.

Every command writes its JSON the same way: a header (GPU, versions, UTC date, the command as typed) and the data,
with the paths of the machine that ran it written as placeholders (REPO, TMP, HOME), so a committed result names no
machine's folders; `dumps` keeps a table of cases one line per case. The index reads those headers; what a file is,
and the command of older files whose header has none, come from KINDS below: add a line there with each new kind.

    python -m benchmarks index            # rewrite the index
    python -m benchmarks index --check    # exit 1 when the index is stale or a file is not described
"""
from __future__ import annotations

import datetime
import fnmatch
import json
import os
import platform
import re
import shlex
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
# Folders of the machine that runs a script, longest first, and what a committed file says instead.
_TEMP_ROOTS = ("/tmp", "/var/tmp", tempfile.gettempdir())
_HOME_PATTERN = re.compile(r"(?<![\w./])/(?:home/[^/\s\"']+|root)(?=/|\b)")
# the interpreter's virtual environment (the device machine's, say): VENV; a system interpreter's
# prefix (/usr) is no folder of anyone's and stays
_VENV = sys.prefix if sys.prefix != sys.base_prefix else None


def placeholder_paths(text: str) -> str:
    """text with this machine's repository, virtual environment, temporary and home folders replaced by REPO, VENV,
    TMP and HOME."""
    text = text.replace(str(REPO), "REPO")
    if _VENV and not _VENV.startswith(str(REPO)):
        text = re.sub(r"(?<![\w./])" + re.escape(_VENV.rstrip("/")) + r"(?=/|\b)", "VENV", text)
    for root in sorted(set(_TEMP_ROOTS), key=len, reverse=True):
        text = re.sub(r"(?<![\w./])" + re.escape(root.rstrip("/")) + r"(?=/|\b)", "TMP", text)
    return _HOME_PATTERN.sub("HOME", text)


def scrub(value):
    """value (JSON data) with placeholder_paths applied to every string, keys included."""
    if isinstance(value, str):
        return placeholder_paths(value)
    if isinstance(value, dict):
        return {scrub(k): scrub(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrub(v) for v in value]
    return value


def command_line(argv: list[str] | None = None) -> str:
    """The command as typed from the repository root: `python -m benchmarks generation --comfyui ...`."""
    argv = list(sys.argv if argv is None else argv)
    env = " ".join(f"{name}={os.environ[name]}" for name in ("PYTHONPATH",) if os.environ.get(name))
    script = argv[0] if argv else ""
    try:
        script = str(Path(script).resolve().relative_to(REPO))
    except ValueError:
        pass
    program = ["-m", "benchmarks"] if script == "benchmarks/__main__.py" else [script]
    words = ["python", *program, *argv[1:]]
    return placeholder_paths(" ".join(filter(None, [env, shlex.join(words)])))


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def environment(device: str = "cuda") -> dict:
    """A file's header: the GPU and its capability (device "cuda"), torch/triton/CUDA/Python versions, the UTC time
    and the command."""
    import torch
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    env = {"gpu": None, "torch": torch.__version__, "triton": triton_version, "python": platform.python_version(),
           "date": now(), "command": command_line()}
    if device == "cuda":
        env.update({"gpu": torch.cuda.get_device_name(), "capability": list(torch.cuda.get_device_capability()),
                    "cuda": torch.version.cuda,
                    "gpu_memory_gib": round(torch.cuda.get_device_properties(0).total_memory / 2 ** 30, 1)})
    return env


INLINE_WIDTH = 120
EXPANDED_DEPTH = 2


def dumps(value, *, expanded_depth: int = EXPANDED_DEPTH, _depth: int = 0, _indent: str = "") -> str:
    """JSON for a committed result: containers whose one-line form is short, or that sit deeper than
    expanded_depth, stay on one line; others get one member per line. A table of cases is then one line per case
    (readable in a diff) instead of one line per number. A report nested deeper (a check report per tree) asks for
    more levels, so that no line holds a whole tree."""
    inline = json.dumps(value, separators=(", ", ": "), default=str)
    if not isinstance(value, (dict, list)) or not value or len(inline) <= INLINE_WIDTH or _depth >= expanded_depth:
        return inline
    inner = _indent + " "
    deeper = {"expanded_depth": expanded_depth, "_depth": _depth + 1, "_indent": inner}
    if isinstance(value, dict):
        members = [f"{inner}{json.dumps(str(k))}: {dumps(v, **deeper)}" for k, v in value.items()]
        return "{\n" + ",\n".join(members) + "\n" + _indent + "}"
    members = [inner + dumps(v, **deeper) for v in value]
    return "[\n" + ",\n".join(members) + "\n" + _indent + "]"


def write_json(report: dict, out: Path, stem: str | None = None, *, expanded_depth: int = EXPANDED_DEPTH) -> Path:
    """Write report (paths as placeholders) to `out` (a file), or to `out/<stem>.json` when out is a folder; the
    file is replaced whole, so a command that writes after every run leaves a readable file when it is cut off.

    The stable name is deliberate: a new run replaces the file, and git keeps the earlier ones."""
    path = out / f"{stem}.json" if stem and out.is_dir() else out
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(path.suffix + ".partial")
    partial.write_text(dumps(scrub(report), expanded_depth=expanded_depth) + "\n")
    partial.replace(path)
    return path


# ---------------------------------------------------------------------------------------------------- the index
HISTORY = "5227c0c"  # the last commit whose tree holds the run folders (benchmarks/results/h200-2026-11-30-run*)
# the last commit whose tree holds the retired probes (their question answered: their JSON stay, the code is in git)
RETIRED_AT = "b07e3cd"


class Kind(NamedTuple):
    what: str       # what the file is
    command: str    # the command that produced it, where the file's header does not say
    was: str        # the file it was in HISTORY
    gpu: str = ""   # where the header does not say: the GPU it ran on, or "none (CPU)"


H200, CPU = "NVIDIA H200", "none (CPU)"
KINDS: dict[str, Kind] = {
    "gpu-evidence.json": Kind(
        "the product on a CUDA machine: torch patches applied, verified (`--device cuda`) and reverted in place with "
        "the RECORD check; a ComfyUI-shaped tree with `--real-import` and a real out-of-memory; overlay install and "
        "kernel parity. The report's torch and ComfyUI sections",
        "python3 benchmarks/gpu_evidence.py --out DIR", "h200-2026-11-30-run10/evidence.json"),
    "kernels.json": Kind(
        "every overlay kernel at L=4096 and 16384 against eager, torch.compile, comfy-kitchen's CUDA backend and the "
        "copy ceiling, with the launch defaults; the report's and the README's kernel table",
        "PYTHONPATH=overlays:. python benchmarks/kernels.py --out DIR/kernels.json (comfy-kitchen 0.2.40 carried to "
        "the device: scripts/comfy_kitchen_for_device.sh)", "h200-2026-11-30-run30/kernels.json"),
    "kernels-sweep.json": Kind(
        "per op, the launch sweep its shipped setting comes from (each section copied from that sweep's file, "
        "named in its `from`); the quantiser's L2 hints from the removed benchmarks/tune_adaln_quant.py",
        "PYTHONPATH=overlays:. python benchmarks/kernels.py --sweep --ops OP --out DIR/kernels-sweep.json",
        "h200-2026-11-30-run{20,26,31,8}/kernels*.json, tune-adaln-quant-2026-11-30.json", H200),
    "gates.json": Kind(
        "bf16/fp16/fp32 parity of every op against ComfyUI's eager chain and fp64 (27 cases, ulp gates); the "
        "report's parity table",
        "PYTHONPATH=overlays:. python benchmarks/gpu_gates.py --out DIR/gates.json", "h200-2026-11-30-run34/gates.json"),
    "blocks.json": Kind(
        "the FP8 GEMM at M=16384 and a Flux-shaped block stack (stock, overlays, FP8, FP8 with weights replaced): "
        "time, CUDA-graph time, peak memory, error",
        "PYTHONPATH=overlays:. python benchmarks/blocks.py --out DIR", "h200-2026-11-30-run34/blocks.json"),
    "real-blocks-h200.json": Kind(
        "the overlays on ComfyUI 0.3.64's own Flux and Wan blocks and two small models, bf16 on the GPU: parity "
        "against stock and per-block timings",
        "python3 scripts/validate_real_blocks.py --comfyui .realcomfy/ComfyUI --device cuda --dtype bfloat16 "
        "--out DIR/real-blocks-h200.json", "h200-2026-11-30-run34/real-blocks-h200.json"),
    "overlay-eras.json": Kind(
        "the overlay's variants on real ComfyUI trees (0.3.64, 0.8.0, 0.24.1, 0.33.0) and the assembled 0.38.1: "
        "`applier overlay check` per "
        "model and op family, the node's run-time recognition, exactness and attn1_patch on each tree's own blocks "
        "(CPU, fp32), and the RoPE seam against comfy-kitchen 0.2.31 on the H200 (bits, ulp, ms); `model_table`: "
        "the pack's model table (overlays/fused_dit/models.json) against the 0.33.0 tree, each model the node tiles "
        "built at full size on the meta device by the release's own class and put through its model detection "
        "(python -m benchmarks validate model-table --comfyui TREE --deps DIR --into THIS FILE)",
        "", "", CPU),
    "assembled-tree-0.38.1.json": Kind(
        "the provenance of the assembled newest tree: every file of the real 0.33.0 tree plus the files a code index "
        "holds of Comfy-Org/ComfyUI up to 0.38.1, each with its source, commit and path (the index's with sha256)",
        "python -m benchmarks assemble --base TREE --files DIR --record SOURCES --base-commit HASH", "", CPU),
    "real-blocks-cpu.json": Kind(
        "the same real blocks on the CPU in fp32 under the Triton interpreter: recognised, within 3e-7 of stock, "
        "`disable()` restores stock",
        "python3 scripts/validate_real_blocks.py --mirror MIRROR --python VENV/bin/python --out "
        "benchmarks/results/real-blocks-cpu.json", "real-blocks-2026-11-30.json", CPU),
    "host-overhead.json": Kind(
        "host microseconds per call, overlay against ComfyUI's eager chain, direct launch against the JIT's",
        "PYTHONPATH=overlays:.:benchmarks python benchmarks/host_overhead.py --out DIR/host-overhead.json",
        "h200-2026-11-30-run34/host-overhead.json"),
    "launch-overhead.json": Kind(
        "host microseconds of a Triton launch, the direct launcher, the FP8 quantiser and an FP8 linear forward",
        "PYTHONPATH=overlays:. python benchmarks/launch_overhead.py --out DIR/launch-overhead.json",
        "h200-2026-11-30-run33/launch-overhead.json"),
    "fp8-eras.json": Kind(
        "the FP8 seam on real ComfyUI trees (0.3.64 to 0.33.0): ComfyUI's cast found, LoRA weight functions kept, "
        "mixed-precision fp8 layers run on their own codes and scale (CPU, FP8 GEMM emulated)", "", "", CPU),
    "fp8-linear-shapes-h200.json": Kind(
        "FP8 Linear against bf16 F.linear per (M, K, N) of Flux-dev, Wan 14B and Qwen-Image: CUDA-event, host and wall "
        "time per call of cached, per-call and row-wise FP8 paths, and the per-call rule's table derived from them",
        "python -m benchmarks fp8-linear-shapes --out benchmarks/results/fp8-linear-shapes-h200.json", ""),
    "fp8-host-calls.json": Kind(
        "aten ops, launches and host microseconds per FP8 Linear call, and FP8 plans rebuilt per step through the "
        "node, before and after issue 21.3 (CPU, the GPU work stubbed)", "", "", CPU),
    "torch-probes.json": Kind(
        "each torch patch's effect probe (verify/probes/, run by hand) on stock and patched copies of torch/cuda, "
        "against both expectations, on the GPU", "",
        "torch_probes_h200_2026-11-30.json", H200),
    "detect-speed.json": Kind(
        "`applier detect` against `python -c \"import torch\"` with the same interpreter, whole commands",
        "python benchmarks/detect_speed.py --target VENV --out benchmarks/results/detect-speed.json",
        "detect-speed-2026-11-30.json", CPU),
    "comfyui-sweep.json": Kind(
        "apply / status / revert on ComfyUI commits spread over a mirror's history plus every release tag, with "
        "byte identity after revert: every commit where a patch refuses, and why",
        "python -m benchmarks validate comfyui-sweep --mirror MIRROR -n N --work DIR", "", CPU),
    "compiler-*.json": Kind(
        "the node's configs under ComfyUI's model compiler on one release (in the name), as its main.py starts it: "
        "compiler off, the release's own, and a harness that wraps each block in comfy-aimdo's malloc graph and "
        "torch.cuda.graph as comfy/model_prefetch.py does; errors, graph breaks, captures, output against "
        "compiler off, speed against stock",
        "python -m benchmarks compiler --comfyui TREE --out benchmarks/results/compiler-RELEASE.json", "", H200),
    "generation-*.json": Kind(
        "whole generations through one ComfyUI release's own loader and sampler, started as its main.py starts "
        "(the release in the name; seeded random weights): speed, memory, VRAM mode, SDPA backend and which code "
        "ran, stock against the overlays, ComfyUI's fp8 --fast, sage attention and torch.compile",
        "python -m benchmarks generation --comfyui TREE --out benchmarks/results/generation-RELEASE.json", ""),
    "attention-kernels-h200.json": Kind(
        "attention per DiT shape (Flux-dev 1024/2048/4096, Wan 2.1 14B 480x832x81) on the H200: TFLOPS of SDPA's "
        "cuDNN, FLASH and EFFICIENT, SageAttention 2 (built from source there, the fp8 mode's yardstick) and 1.0.6, "
        "the pack's FP8 kernel (both recipes), cuDNN's FP8 SDPA plain and Hadamard-rotated, against the bf16 and FP8 "
        "peaks; per call error against fp32 attention (relative Frobenius, cosine) on Gaussian and DiT-like inputs; "
        "the FP8 kernel's launch sweep of the run before (earlier_sweep)",
        "python -m benchmarks attention-kernels --out benchmarks/results/attention-kernels-h200.json", "", H200),
    "attention-fp8-compile.json": Kind(
        "the FP8 attention kernels compiled ahead of time for sm_89 and sm_90 without a GPU, at every launch of the "
        "sweep: target, FP8 MMA instructions, shared memory, cubin size",
        "python -m benchmarks attention-kernels --compile-only --out benchmarks/results/attention-fp8-compile.json",
        "", CPU),
    "step-profile-*.json": Kind(
        "one sampling step per config on one ComfyUI release (in the name), as its main.py starts it, by kernel "
        "category (GEMM, FP8 GEMM, attention, fused_dit, other) and idle gap (host work and launch gaps), and the "
        "no-FP8 ceiling with GEMMs and attention untouched",
        "python -m benchmarks step-profile --comfyui TREE --models flux-dev --out "
        "benchmarks/results/step-profile-RELEASE.json", "", H200),
    "fp8-codes-comfyui.json": Kind(
        "the node's fp8_weights=replace through a real ComfyUI 0.3.64 ModelPatcher (tiny models): same bits as "
        "alongside, memory saved, stock restored bit for bit after every switch, LoRA baked, low-VRAM partial unload",
        "python scripts/validate_fp8_codes.py --comfyui .realcomfy/ComfyUI --out "
        "benchmarks/results/fp8-codes-comfyui.json", "", H200),
    "comfy-server-*.json": Kind(
        "a real ComfyUI server of one release (in the name), started as its main.py starts, with the overlay pack "
        "installed by `applier overlay install`: prompts queued through its HTTP API, the node registered, which "
        "code ran, seconds per step from two step counts",
        "bash scripts/comfy_server_for_device.sh RELEASE (on the device machine; --kit TREE here first)", "", H200),
    "demo-disk.json": Kind(
        "disk used by `make test` and `make demo` inside a fresh clone (du of .venv, .cache and sandbox)",
        "git clone REPO CLONE && cd CLONE && .ci/run && make demo && du -sh .venv .cache sandbox", "", CPU),
    "reliability-*.json": Kind(
        "the reliability suite's figures (tests/reliability: failpoints, random SIGKILLs, concurrent writers, "
        "confinement, bad inputs, fuzzing): tests tried and passed per section",
        "python -m benchmarks reliability", "", CPU),
    "node-pack-*.json": Kind(
        "the node pack installed the ComfyUI way (git clone into custom_nodes/, as ComfyUI-Manager's Install via Git "
        "URL) into a real ComfyUI release (in the name), `main.py --cpu`: listed by /object_info, prompts with the "
        "node run, `applier status` on the clone",
        "python -m benchmarks validate node-pack --mirror MIRROR --work WORK --out "
        "benchmarks/results/node-pack-RELEASE.json",
        "", CPU),
    "canvas-pipeline-*.json": Kind(
        "a 32768x18432 canvas through a real ComfyUI server of one release (in the name), started as its main.py "
        "starts: EmptySD3LatentImage, VAEDecodeTiled, SaveImage, then LoadImage and ImageScaleBy, after `applier "
        "apply` of max-resolution and pil-pixel-limit (per node: accepted, seconds, peak RSS and GPU memory) and on "
        "the stock server (the first cap, in ComfyUI's words)",
        "COMMAND=canvas-pipeline bash scripts/comfy_server_for_device.sh RELEASE (on the device machine)", "", H200),
    "tiled-route-*.json": Kind(
        "the tiled 32K route (issue 37) through a real ComfyUI server of one release (in the name), started as its "
        "main.py starts, after `applier apply` of max-resolution and pil-pixel-limit: generate at 2048, upscale, "
        "VAEEncodeTiled, KSampler with the pack's TiledSampling, VAEDecodeTiled, SaveImage, LoadImage; per node "
        "seconds, torch's and the device's peaks, the node's tiles and batch; the memory check (8192 against the "
        "largest canvas), ComfyUI-TiledDiffusion side by side, the memory limit that held",
        "COMMAND=tiled-route bash scripts/comfy_server_for_device.sh RELEASE (on the device machine)", "", H200),
    "budget-validation.json": Kind(
        "`applier budget`'s predicted seconds per step against the committed H200 measurements, run by run",
        "python -m benchmarks validate budget --out benchmarks/results/budget-validation.json", "", H200),
    "real-torch-envs.json": Kind(
        "real torch 2.14.1+cu130 and 2.13.0+cpu venvs: apply, verify, revert, RECORD",
        "python3 scripts/validate_torch_env.py --target VENV214 VENV213 --out benchmarks/results/real-torch-envs.json",
        "real-torch-envs-2026-11-30.json", CPU),
}


# results whose script is retired (the question it asked is answered): the script, as it was at RETIRED_AT
RETIRED = {
    "blocks.json": "benchmarks/blocks.py",
    "detect-speed.json": "benchmarks/detect_speed.py",
    "fp8-codes-comfyui.json": "scripts/validate_fp8_codes.py",
    "fp8-host-calls.json": "scripts/fp8_host_calls.py",
    "gates.json": "benchmarks/gpu_gates.py",
    "gpu-evidence.json": "benchmarks/gpu_evidence.py",
    "host-overhead.json": "benchmarks/host_overhead.py",
    "kernels-sweep.json": "benchmarks/kernels.py",
    "kernels.json": "benchmarks/kernels.py",
    "launch-overhead.json": "benchmarks/launch_overhead.py",
    "real-blocks-cpu.json": "scripts/validate_real_blocks.py",
    "real-blocks-h200.json": "scripts/validate_real_blocks.py",
    "real-torch-envs.json": "scripts/validate_torch_env.py",
}


# results retired from the folder (issue 39: at most 40 files, under 15% of the repository's lines): the question each
# asked is answered and no message or test reads it; each is in git history at RESULTS_RETIRED_AT
RESULTS_RETIRED_AT = "8db9900"
RETIRED_RESULTS = {
    "adaln-registers.json": "AdaLN's registers per launch setting (sm_90a compile): the shipped setting chose from it",
    "conflict-report.json": "the conflict report's speed before and after the linear search",
    "fp8-host-overhead.json": "host time per FP8 linear call of an earlier FP8 path, before and after trimming it",
    "fp8-stack-profile.json": "the FP8 block stack of an earlier FP8 path, profiled",
    "gpu-fp8-gates.json": "the first FP8 gates (codes byte-exact, ComfyUI's fp8 module bit-identical)",
    "gpu-tests.txt": "tests/overlays on the GPU for the code of gates.json and blocks.json: 175 passed, 0 failed",
    "ncu-adaln.json": "AdaLN under Nsight Compute: why it stops at 75% of the copy ceiling",
    "norm-order.json": "torch's LayerNorm/RMSNorm reduction order reproduced bit for bit",
    "real-comfyui.json": "six real ComfyUI commits (2023-04 to 0.3.64) through apply, the server and revert; "
                         "comfyui-sweep.json applies and reverts on every release tag",
    "rms-rope-sweep.json": "the first rms_rope kernels' launch configurations (before the kernels.py sweeps)",
}


def header(data) -> dict:
    """date, gpu and command from a result's header: at the top, or under "environment"."""
    if not isinstance(data, dict):
        return {}
    env = data.get("environment") if isinstance(data.get("environment"), dict) else {}
    pick = lambda *keys: next((src[k] for src in (data, env) for k in keys if src.get(k)), None)  # noqa: E731
    script = pick("script")
    runs = data.get("runs") if isinstance(data.get("runs"), list) else []
    gpus = sorted({run["gpu"] for run in runs if isinstance(run, dict) and run.get("gpu")})
    gpu = ", ".join(gpus) if len(gpus) > 1 else pick("gpu")      # a combined file of calls on several GPUs
    return {"date": pick("date", "generated", "started"), "gpu": gpu, "command": pick("command"),
            "script": f"python {script}" if script else None, "what": pick("what", "about", "description", "note")}


def rows() -> list[dict]:
    found = []
    for path in sorted(RESULTS.iterdir()):
        if path.name == "README.md" or not path.is_file():
            continue
        head = {}
        if path.suffix == ".json":
            try:
                head = header(json.loads(path.read_text()))
            except json.JSONDecodeError:
                head = {}
        kind = next((k for pattern, k in KINDS.items() if fnmatch.fnmatch(path.name, pattern)), Kind("", "", ""))
        found.append({"file": path.name, "what": kind.what or head.get("what"), "date": head.get("date"),
                      "gpu": head.get("gpu") or kind.gpu, "command": head.get("command") or kind.command or head.get("script"),
                      "command_from_header": bool(head.get("command")), "was": kind.was})
    return found


def cell(text) -> str:
    return "-" if not text else str(text).replace("|", "\\|").replace("\n", " ")


def render(found: list[dict]) -> str:
    lines = ["# benchmarks/results: the evidence behind the figures in the docs", "",
             "Generated by `python -m benchmarks index` (do not edit by hand). One current file per benchmark kind, "
             "under a stable name: a new run replaces the file, and git keeps the earlier ones. Machine paths in "
             "the files are placeholders: REPO (this repository), TMP (a temporary folder), HOME, MIRROR (a ComfyUI "
             "git mirror), CACHE (an upstream cache). The GPU figures are summarised in `docs/gpu-report.md` "
             "(written from them by `scripts/gpu_report.py`, retired with the scripts below).", "",
             "| file | what it is | date (UTC) | GPU | command |", "|---|---|---|---|---|"]
    for row in found:
        date = (row["date"] or "")[:16].replace("T", " ")
        command = f"`{row['command']}`" if row["command"] else None
        if command and not row["command_from_header"]:
            command += " (not in the file's header)"
        lines.append(f"| `{row['file']}` | {cell(row['what'])} | {cell(date)} | {cell(row['gpu'])} "
                     f"| {cell(command)} |")
    lines += ["", f"Earlier runs (35 run folders, `h200-2026-11-30-run1` to `run34` and the files before them) are "
                  f"in git history: `git show {HISTORY}:benchmarks/results/<path>`. Where each kept file was:", "",
              "| file | was (at " + HISTORY + ") |", "|---|---|"]
    lines += [f"| `{row['file']}` | `{row['was']}` |" for row in found if row["was"]]
    lines += ["", f"Retired scripts: the question each asked is answered, so the script left the tree and its JSON "
                  f"stays. Read or rerun one from git: `git show {RETIRED_AT}:<script>` "
                  f"(`scripts/gpu_report.py`, which wrote docs/gpu-report.md from these files, went with them).", "",
              "| file | written by (at " + RETIRED_AT + ") |", "|---|---|"]
    lines += [f"| `{row['file']}` | `{RETIRED[row['file']]}` |" for row in found if row["file"] in RETIRED]
    lines += ["", f"Retired results: their question is answered and no message or test reads them (a doc that cites "
                  f"one says it is in git history), so they left the folder. Read one from git: "
                  f"`git show {RESULTS_RETIRED_AT}:benchmarks/results/<file>`.", "",
              "| file | what it answered |", "|---|---|"]
    lines += [f"| `{name}` | {cell(what)} |" for name, what in sorted(RETIRED_RESULTS.items())]
    return "\n".join(lines) + "\n"


def add_arguments(parser) -> None:
    parser.add_argument("--check", action="store_true", help="exit 1 when the index is stale or a file undescribed")


def run(args, parser=None) -> int:
    found = rows()
    text = render(found)
    index = RESULTS / "README.md"
    if args.check:
        undescribed = [row["file"] for row in found if not row["what"]]
        stale = not index.exists() or index.read_text() != text
        for name in undescribed:
            print(f"{name}: not described (add it to KINDS in benchmarks/results.py)", file=sys.stderr)
        if stale:
            print(f"{index.relative_to(REPO)} is stale: run python -m benchmarks index", file=sys.stderr)
        return 1 if stale or undescribed else 0
    index.write_text(text)
    print(f"wrote {index.relative_to(REPO)} ({len(found)} files)")
    return 0

