"""The Fused DiT Ops node through a real ComfyUI server: install, start, queue prompts over HTTP, measure.

Steps, each recorded in the JSON:
  0. with --make-checkpoint DIR (instead of --checkpoint FILE): the random-weight checkpoint, written in a child
     process by `python -m benchmarks checkpoint` (models.py: the release's own model class names the keys; drawn
     on the GPU where there is one) and kept in DIR for later runs;
  1. a venv inside the ComfyUI folder (--system-site-packages, so it sees this interpreter's torch), unless
     --python names one; then `python -m applier overlay install --target DIR` installs the pack as a user would;
  2. a probe custom node written into custom_nodes/ by this script: it counts torch._scaled_mm calls (the GEMM of
     both ComfyUI's fp8 path and the overlay's FP8 linears) behind GET /generation_probe/counts, and offers a
     zero CONDITIONING of the text encoder's shape (no text encoder or VAE is needed);
  3. `main.py --listen 127.0.0.1` with the random-weight checkpoint linked into models/diffusion_models/, started
     as the release starts by default (on an NVIDIA GPU with torch >= 2.8, 0.33.0 runs DynamicVRAM through
     comfy-aimdo; --server-args adds flags) and an empty --front-end-root (no frontend package is needed). The
     JSON records the release (comfyui_version.py, REVISION), how the server says it started (its log: vram mode,
     device, versions) and whether the pack's node loaded (its import line, /object_info/FusedDiTOps);
  4. prompts of ComfyUI's own nodes: UNETLoader -> [FusedDiTOps] -> KSampler (euler, simple, cfg 1.0) with the
     latent from EmptyLatentImage (Flux) or EmptyHunyuanLatentVideo (Wan) -> SaveLatent. Each config runs at two
     step counts; seconds per step = the difference of the two prompts' execution times (from the server's own
     execution_start / execution_success timestamps) over the difference of steps, so model loading, FP8
     quantisation and prompt overhead cancel. Order: stock, the node with FP8, stock again (it must be
     bit-identical to the first stock latent and run no FP8 GEMM), then the node without FP8 (bit-identical too),
     then, where the node offers its `attention` input, the node without FP8 with attention on.

The weights are random: speed, memory and which code ran, never image quality.

Examples (the GPU run on 0.33.0 without network: scripts/comfy_server_for_device.sh):
    python -m benchmarks comfy-server --comfyui DIR --checkpoint /tmp/ckpt/flux-dev-random-seed0.safetensors \\
        --model flux-dev --out benchmarks/results/comfy-server-RELEASE.json
    python -m benchmarks comfy-server --comfyui DIR --make-checkpoint CKPT_DIR --tiny --server-args=--cpu \\
        --out OUT.json        # CPU smoke test: 1+1 Flux blocks at 64x64
"""
from __future__ import annotations

import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from . import comfy_release, results

REPO_ROOT = Path(__file__).resolve().parent.parent
PROBE_NAME = "generation_probe.py"
NOTE = ("Weights are seeded random numbers, not trained ones: the figures are for speed and which code ran "
        "(torch._scaled_mm calls), never for image quality.")

PROBE_SOURCE = '''\
"""Benchmark probe written by benchmarks/comfy_server.py (applier project); not part of ComfyUI.

Counts torch._scaled_mm calls (GET /generation_probe/counts, POST /generation_probe/reset) and offers a zero
CONDITIONING of a text encoder's output shape, so a prompt needs no text encoder. GET /generation_probe/memory: torch's
CUDA peaks (max_memory_allocated / max_memory_reserved) per node the server ran since the last call (read at each
"executing" message, where the executor moves from one node to the next, then reset), the peaks since the last node,
the device's free and total memory; each call resets them (torch.cuda.reset_peak_memory_stats). With
GENERATION_PROBE_MEMORY_FRACTION=F in its environment it sets torch.cuda.set_per_process_memory_fraction(F) at
import."""
import os

import torch
from aiohttp import web
from server import PromptServer

COUNTS = {"scaled_mm": 0}
_scaled_mm = torch._scaled_mm


def _counted_scaled_mm(*args, **kwargs):
    COUNTS["scaled_mm"] += 1
    return _scaled_mm(*args, **kwargs)


torch._scaled_mm = _counted_scaled_mm


@PromptServer.instance.routes.get("/generation_probe/counts")
async def counts(request):
    return web.json_response(COUNTS)


@PromptServer.instance.routes.post("/generation_probe/reset")
async def reset(request):
    COUNTS["scaled_mm"] = 0
    return web.json_response(COUNTS)


CUDA = torch.cuda.is_available()
FRACTION = os.environ.get("GENERATION_PROBE_MEMORY_FRACTION") or None
if FRACTION and CUDA:
    torch.cuda.set_per_process_memory_fraction(float(FRACTION))
MEMORY = {"nodes": [], "running": None}


def _peaks():
    if not CUDA:
        return {}
    return {"max_allocated": torch.cuda.max_memory_allocated(), "max_reserved": torch.cuda.max_memory_reserved(),
            "allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved()}


_send_sync = PromptServer.instance.send_sync


def _send_sync_with_peaks(event, data, *args, **kwargs):
    # the executor's thread says "executing" as it moves from one node to the next (node None: the prompt is done)
    if event == "executing" and isinstance(data, dict):
        if MEMORY["running"] is not None:
            MEMORY["nodes"].append({**MEMORY["running"], **_peaks()})
        node = data.get("node")
        MEMORY["running"] = None if node is None else {"prompt_id": data.get("prompt_id"), "node": node}
        if CUDA:
            torch.cuda.reset_peak_memory_stats()
    return _send_sync(event, data, *args, **kwargs)


PromptServer.instance.send_sync = _send_sync_with_peaks


@PromptServer.instance.routes.get("/generation_probe/memory")
async def memory(request):
    answer = {"cuda": CUDA, "memory_fraction": float(FRACTION) if FRACTION else None, "nodes": MEMORY["nodes"],
              "since_last_node": _peaks()}
    if CUDA:
        free, total = torch.cuda.mem_get_info()
        answer.update({"device_free": free, "device_total": total})
        torch.cuda.reset_peak_memory_stats()
    MEMORY["nodes"] = []
    return web.json_response(answer)


class GenerationProbeZeroConditioning:
    CATEGORY = "_for_testing"
    RETURN_TYPES = ("CONDITIONING",)
    FUNCTION = "make"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"tokens": ("INT", {"default": 256, "min": 1, "max": 4096}),
                             "channels": ("INT", {"default": 4096, "min": 1, "max": 16384}),
                             "pooled": ("INT", {"default": 768, "min": 0, "max": 16384}),
                             "guidance": ("FLOAT", {"default": 3.5, "min": -1.0, "max": 100.0})}}

    def make(self, tokens, channels, pooled, guidance):
        extra = {}
        if pooled:
            extra["pooled_output"] = torch.zeros(1, pooled)
        if guidance >= 0:
            extra["guidance"] = guidance
        return ([[torch.zeros(1, tokens, channels), extra]],)


NODE_CLASS_MAPPINGS = {"GenerationProbeZeroConditioning": GenerationProbeZeroConditioning}
'''

MODELS = {
    "flux-dev": {"latent": "flux", "tokens": 256, "pooled": 768, "guidance": 3.5, "resolution": (1024, 1024),
                 "tiny_resolution": (64, 64)},
    "wan2.1-t2v-14b": {"latent": "wan", "tokens": 512, "pooled": 0, "guidance": -1.0, "resolution": (480, 832, 33),
                       "tiny_resolution": (64, 64, 5)},
}
# the node's inputs: the overlay families on; FP8 off, on; attention (an optional input since the node has it) on
OVERLAY = {"norm_rope": True, "adaln": True, "gate": True}

ANSI = re.compile(r"\x1b\[[0-9;]*m")
# lines of the server's log that say how it started (matched as substrings)
START_MARKERS = ("ComfyUI version:", "comfy-aimdo version:", "comfy-kitchen version:", "pytorch version:",
                 "Total VRAM", "Set vram state to:", "Device:", "DynamicVRAM", "comfy-aimdo", "legacy ModelPatcher",
                 "Using ", "attention", "Python version:")


# ------------------------------------------------------------------------------------------------ HTTP helpers
def http_json(url: str, payload: dict | None = None, timeout: float = 30.0):
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"},
                                     method="GET" if payload is None else "POST")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        body = response.read()
    return json.loads(body) if body else None


def wait_for_server(base: str, server: subprocess.Popen, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode} before answering")
        try:
            return http_json(f"{base}/system_stats", timeout=5)
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            time.sleep(0.5)
    raise TimeoutError(f"no answer from {base}/system_stats within {timeout} s")


# --------------------------------------------------------------------------------------------------- prompts
def build_prompt(model: dict, checkpoint_name: str, resolution: tuple, steps: int, seed: int, node: dict | None,
                 prefix: str) -> dict:
    """The API-format graph: UNETLoader -> [FusedDiTOps] -> KSampler -> SaveLatent."""
    prompt = {"1": {"class_type": "UNETLoader", "inputs": {"unet_name": checkpoint_name, "weight_dtype": "default"}},
              "3": {"class_type": "GenerationProbeZeroConditioning",
                    "inputs": {"tokens": model["tokens"], "channels": 4096, "pooled": model["pooled"],
                               "guidance": model["guidance"]}}}
    if model["latent"] == "flux":
        height, width = resolution
        prompt["4"] = {"class_type": "EmptyLatentImage", "inputs": {"width": width, "height": height, "batch_size": 1}}
    else:
        height, width, frames = resolution
        prompt["4"] = {"class_type": "EmptyHunyuanLatentVideo",
                       "inputs": {"width": width, "height": height, "length": frames, "batch_size": 1}}
    model_output = ["1", 0]
    if node is not None:
        prompt["2"] = {"class_type": "FusedDiTOps", "inputs": {"model": ["1", 0], **node}}
        model_output = ["2", 0]
    prompt["5"] = {"class_type": "KSampler",
                   "inputs": {"model": model_output, "seed": seed, "steps": steps, "cfg": 1.0, "sampler_name": "euler",
                              "scheduler": "simple", "positive": ["3", 0], "negative": ["3", 0],
                              "latent_image": ["4", 0], "denoise": 1.0}}
    prompt["6"] = {"class_type": "SaveLatent", "inputs": {"samples": ["5", 0], "filename_prefix": prefix}}
    return prompt


def queue_and_wait(base: str, prompt: dict, timeout: float) -> dict:
    """Queue one prompt; its history entry once done (status, messages with the server's timestamps)."""
    client_id = uuid.uuid4().hex
    answer = http_json(f"{base}/prompt", {"prompt": prompt, "client_id": client_id})
    if answer.get("node_errors"):
        raise RuntimeError(f"the server refused the prompt: {answer['node_errors']}")
    prompt_id = answer["prompt_id"]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        history = http_json(f"{base}/history/{prompt_id}")
        entry = history.get(prompt_id) if history else None
        if entry and entry.get("status", {}).get("completed") is not None and (
                entry["status"].get("status_str") in ("success", "error")):
            return entry
        time.sleep(0.1)
    raise TimeoutError(f"prompt {prompt_id} did not finish within {timeout} s")


def execution_summary(entry: dict) -> dict:
    messages = {name: data for name, data in entry["status"].get("messages", [])}
    start = messages.get("execution_start", {}).get("timestamp")
    end = (messages.get("execution_success") or messages.get("execution_error") or {}).get("timestamp")
    summary = {"status": entry["status"].get("status_str"),
               "execution_s": (end - start) / 1000 if start is not None and end is not None else None,
               "cached_nodes": messages.get("execution_cached", {}).get("nodes", [])}
    if "execution_error" in messages:
        error = messages["execution_error"]
        summary["error"] = f"{error.get('exception_type')}: {error.get('exception_message')}"
        summary["traceback"] = "".join(error.get("traceback", []))[-3000:]
    return summary


def load_latent(output_dir: Path, prefix: str):
    from safetensors.torch import load_file
    files = sorted(output_dir.glob(f"{prefix}_*.latent"))
    if not files:
        return None
    return load_file(str(files[-1]))["latent_tensor"]


def compare(a, b) -> dict:
    if a is None or b is None:
        return {"bit_identical": None, "rel_err": None}
    a, b = a.double(), b.double()
    return {"bit_identical": bool((a == b).all()) and a.shape == b.shape,
            "rel_err": float((a - b).norm() / b.norm().clamp_min(1e-30))}


# ---------------------------------------------------------------------------------------------------- set-up
def make_checkpoint(comfyui: Path, directory: Path, model: str, seed: int, tiny: bool, timeout: float) -> dict:
    """The random-weight checkpoint for this release (kept in DIRECTORY; written once) by a child process (ComfyUI
    and its torch stay out of this one, so it holds no GPU memory while the server runs): `python -m benchmarks
    checkpoint`; {"path", "write_s" (0.0: it was there), "drawn_on", "seconds"}."""
    directory = directory.resolve()
    started = time.perf_counter()
    command = [sys.executable, "-m", "benchmarks", "checkpoint", "--comfyui", str(comfyui), "--dir", str(directory),
               "--model", model, "--seed", str(seed), *(["--tiny"] if tiny else [])]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines = [line for line in done.stdout.splitlines() if line.startswith("CHECKPOINT ")]
    if done.returncode or not lines:
        raise RuntimeError(f"writing the checkpoint failed ({done.returncode}): "
                           f"{(done.stdout + done.stderr)[-3000:]}")
    record = json.loads(lines[-1].split(" ", 1)[1])
    record.update({"seconds": round(time.perf_counter() - started, 1), "tiny": tiny,
                   "written_by": "benchmarks/models.py ensure_checkpoint (random_state_dict)"})
    return record


def log_lines(log_text: str) -> list[str]:
    """The server log's lines without the colours of ComfyUI's logger."""
    return [ANSI.sub("", line).strip() for line in log_text.splitlines()]


def server_start(log_text: str) -> dict:
    """How the server says it started: its vram mode (DynamicVRAM through comfy-aimdo, or the legacy
    ModelPatcher), vram state, device, versions, and the log lines these come from."""
    lines = log_lines(log_text)
    said = [line for line in lines if any(marker in line for marker in START_MARKERS)][:40]

    def after(prefix):
        found = [line.split(prefix, 1)[1].strip() for line in lines if prefix in line]
        return found[0] if found else None

    if any("DynamicVRAM support detected and enabled" in line for line in lines):
        mode, why = "dynamic", "the log: DynamicVRAM support detected and enabled"
    elif any("legacy ModelPatcher" in line for line in lines):
        mode, why = "legacy", next(line for line in lines if "legacy ModelPatcher" in line)
    else:
        mode, why = "legacy", ("the log says nothing of DynamicVRAM (--cpu, --disable-dynamic-vram or a release "
                               "without it)")
    return {"vram_mode": mode, "vram_mode_reason": why, "vram_state": after("Set vram state to:"),
            "device": after("Device:"), "comfyui_version": after("ComfyUI version:"),
            "pytorch_version": after("pytorch version:"), "comfy_aimdo_version": after("comfy-aimdo version:"),
            "comfy_kitchen_version": after("comfy-kitchen version:"), "log_lines": said}


def pack_loaded(log_text: str, node_info: dict) -> dict:
    """Whether ComfyUI loaded the pack's custom node: its lines under "Prestartup times for custom nodes" and
    "Import times for custom nodes" (" (IMPORT FAILED)" / "(PRESTARTUP FAILED)" when it failed), import errors,
    the prestartup script's own "[applier]" line, and /object_info/FusedDiTOps with the node's inputs."""
    lines = log_lines(log_text)
    timed, errors = custom_node_import(lines, "comfyui_fused_dit")
    info = node_info.get("FusedDiTOps") or {}
    inputs = info.get("input", {})
    return {"registered": bool(info), "import_line": timed["import"], "prestartup_line": timed["prestartup"],
            "import_failed": timed["import"] is None or "FAILED" in timed["import"] or bool(errors),
            "errors": errors[:5], "applier_lines": [line for line in lines if line.startswith("[applier]")][:5],
            "fused_dit_lines": [line for line in lines if line.startswith("fused_dit:")
                                or "] fused_dit:" in line][:20],
            "inputs": {kind: sorted(inputs.get(kind, {})) for kind in ("required", "optional")}}


def custom_node_import(lines: list[str], folder: str) -> tuple[dict, list[str]]:
    """A custom node folder's lines under "Prestartup times for custom nodes" and "Import times for custom nodes"
    ({"prestartup", "import"}: None where it has none; " (IMPORT FAILED)" where it failed) and the log's lines that
    say its import or prestartup script failed."""
    section, timed = None, {"prestartup": None, "import": None}
    for line in lines:
        if "times for custom nodes" in line:
            section = "prestartup" if line.lower().startswith("prestartup") else "import"
        elif section and folder in line and "seconds" in line:
            timed[section] = line
        elif not line:
            section = None
    errors = [line for line in lines if folder in line and ("Cannot import" in line or "Failed to execute" in line)]
    return timed, errors


def make_venv(comfyui: Path) -> Path:
    """DIR/venv, the layout applier detects, seeing this interpreter's packages (torch, triton).

    --system-site-packages alone reaches the base interpreter's packages; when this interpreter is itself a venv,
    a .pth file adds its site-packages too."""
    import site
    venv = comfyui / "venv"
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
                       check=True)
    if sys.prefix != sys.base_prefix:
        purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        Path(purelib, "_parent_environment.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return python


def install_overlay(comfyui: Path, python: Path) -> dict:
    """`python -m applier overlay install --target DIR --python PY --json`, run from the repo as a user would."""
    return run_applier(comfyui, python, ("overlay", "install"))


def run_applier(comfyui: Path, python: Path, verb: tuple, more: tuple = (), timeout: float | None = None) -> dict:
    """`python -m applier VERB --target DIR --python PY --json MORE`, run from the repo as a user would: the command
    (the tree as DIR), its exit status, seconds and the JSON it printed."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "applier", *verb, "--target", str(comfyui), "--python", str(python),
                           "--json", *more], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)
    record = {"command": " ".join(["python -m applier", *verb, "--target DIR --python DIR/venv/bin/python --json",
                                   *more]),
              "returncode": done.returncode, "seconds": round(time.perf_counter() - started, 2)}
    try:
        record["result"] = json.loads(done.stdout)
    except json.JSONDecodeError:
        record["stdout"] = done.stdout[-2000:]
    if done.returncode:
        record["stderr"] = done.stderr[-2000:]
    return record


def write_probe(comfyui: Path) -> None:
    """The probe custom node (PROBE_SOURCE) in DIR/custom_nodes/."""
    (comfyui / "custom_nodes").mkdir(exist_ok=True)   # a tree of Python files only may lack it
    (comfyui / "custom_nodes" / PROBE_NAME).write_text(PROBE_SOURCE)


def link_checkpoint(comfyui: Path, checkpoint: Path) -> str:
    folder = comfyui / "models" / "diffusion_models"
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / checkpoint.name
    if not target.exists():
        try:
            os.link(checkpoint, target)
        except OSError:
            target.symlink_to(checkpoint.resolve())
    return checkpoint.name


def add_arguments(parser) -> None:
    parser.add_argument("--comfyui", type=Path, required=True, help="the ComfyUI folder to install into and run")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--checkpoint", type=Path, help="the random-weight safetensors file")
    which.add_argument("--make-checkpoint", type=Path, metavar="DIR",
                       help="write it (`python -m benchmarks checkpoint`, for this release) into DIR, or reuse the "
                            "one there")
    parser.add_argument("--tiny", action="store_true",
                        help="with --make-checkpoint: the tiny model (CPU smoke test; default resolution 64x64)")
    parser.add_argument("--checkpoint-timeout", type=float, default=300)
    parser.add_argument("--model", choices=tuple(MODELS), default="flux-dev")
    parser.add_argument("--resolution", default="", help="HxW (Flux) or HxWxFRAMES (Wan); default per model")
    parser.add_argument("--python", type=Path, help="the server's interpreter (default: a venv inside --comfyui)")
    parser.add_argument("--steps", type=int, nargs=2, default=(2, 6), metavar=("LOW", "HIGH"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--port", type=int, default=8199)
    parser.add_argument("--server-args", default="", help="more main.py arguments, e.g. '--cpu'")
    parser.add_argument("--startup-timeout", type=float, default=180)
    parser.add_argument("--prompt-timeout", type=float, default=300)
    parser.add_argument("--out", type=Path, required=True)


def run(options, parser) -> int:
    low, high = options.steps
    if not 1 <= low < high:
        parser.error("--steps LOW HIGH needs 1 <= LOW < HIGH")
    comfyui = options.comfyui.resolve()
    if not (comfyui / "main.py").exists():
        parser.error(f"{comfyui} has no main.py")
    if options.checkpoint is not None and not options.checkpoint.exists():
        parser.error(f"{options.checkpoint} does not exist")
    if options.tiny and options.make_checkpoint is None:
        parser.error("--tiny needs --make-checkpoint")
    model = MODELS[options.model]
    resolution = (tuple(int(v) for v in options.resolution.split("x")) if options.resolution
                  else model["tiny_resolution" if options.tiny else "resolution"])

    report = {"benchmark": "comfy-server", "script": "benchmarks/comfy_server.py", "note": NOTE,
              "date": results.now(),
              "python": platform.python_version(), "model": options.model,
              "resolution": "x".join(map(str, resolution)), "steps": [low, high], "seed": options.seed,
              "sampler": {"sampler_name": "euler", "scheduler": "simple", "cfg": 1.0},
              "command": results.command_line(), "comfyui": comfy_release.read_release(comfyui).as_dict(),
              "prompts": []}

    def write():   # this machine's folders as placeholders (REPO, TMP, HOME)
        results.write_json(report, options.out)

    checkpoint = options.checkpoint
    if options.make_checkpoint is not None:
        try:
            report["checkpoint"] = make_checkpoint(comfyui, options.make_checkpoint, options.model, options.seed,
                                                   options.tiny, options.checkpoint_timeout)
        except (RuntimeError, subprocess.TimeoutExpired) as error:
            report["error"] = f"{type(error).__name__}: {error}"
            write()
            print(report["error"], flush=True)
            return 1
        checkpoint = Path(report["checkpoint"]["path"])
        print(f"checkpoint {checkpoint.name}: {report['checkpoint']['seconds']} s", flush=True)
    python = options.python or make_venv(comfyui)
    report["install"] = install_overlay(comfyui, python)
    print(f"overlay install: exit {report['install']['returncode']}", flush=True)
    write_probe(comfyui)
    checkpoint_name = link_checkpoint(comfyui, checkpoint)
    front_end = comfyui / "temp_empty_frontend"   # no frontend package is installed: serve an empty folder
    front_end.mkdir(exist_ok=True)
    output_dir = comfyui / "output"
    shutil.rmtree(output_dir / "generation_probe", ignore_errors=True)
    log_path = options.out.with_suffix(".server.log")
    base = f"http://127.0.0.1:{options.port}"
    command = [str(python), "main.py", "--listen", "127.0.0.1", "--port", str(options.port),
               "--front-end-root", str(front_end), *options.server_args.split()]
    report["server_command"] = " ".join(["python", *command[1:]]).replace(str(comfyui), "DIR")
    write()
    # a `timeout` around this script sends SIGTERM: leave through `finally`, which stops the server
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(f"terminated (SIGTERM) after {time.perf_counter() - started:.0f} s"))
    started = time.perf_counter()
    node_info = {}
    with open(log_path, "w") as log:
        server = subprocess.Popen(command, cwd=comfyui, stdout=log, stderr=subprocess.STDOUT,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            report["system_stats"] = wait_for_server(base, server, options.startup_timeout)
            report["startup_s"] = round(time.perf_counter() - started, 1)
            log_text = log_path.read_text(errors="replace")
            report["server_start"] = server_start(log_text)
            try:
                node_info = http_json(f"{base}/object_info/FusedDiTOps") or {}
            except urllib.error.HTTPError as error:   # a release that answers an unknown node with an error
                node_info = {"error": f"HTTP {error.code}"}
            report["node_registered"] = "FusedDiTOps" in node_info
            report["pack"] = pack_loaded(log_text, node_info)
            print(f"server up in {report['startup_s']} s: ComfyUI {report['server_start']['comfyui_version']}, "
                  f"vram mode {report['server_start']['vram_mode']}, FusedDiTOps registered "
                  f"{report['node_registered']}", flush=True)
            write()
            configs = {"stock": None, "node_fp8": {**OVERLAY, "fp8_linear": True},
                       "node": {**OVERLAY, "fp8_linear": False}}
            # (config, steps, role); "stock_after_node" reruns the stock graph on the same cached UNETLoader model
            sequence = [("stock", low, "warm-up (loads the checkpoint)"), ("stock", high, "timed"),
                        ("stock", low, "timed"),
                        ("node_fp8", low, "warm-up"), ("node_fp8", high, "timed"), ("node_fp8", low, "timed"),
                        ("stock_after_node", high, "stock again after the node ran"),
                        ("node", low, "warm-up"), ("node", high, "timed"), ("node", low, "timed")]
            if not report["node_registered"]:   # the stock prompts alone: the install or the import failed
                sequence = sequence[:3]
            elif "attention" in report["pack"]["inputs"]["optional"] + report["pack"]["inputs"]["required"]:
                configs["node_attention"] = {**OVERLAY, "fp8_linear": False, "attention": True}
                sequence += [("node_attention", low, "warm-up"), ("node_attention", high, "timed"),
                             ("node_attention", low, "timed")]
            for index, (config, steps, role) in enumerate(sequence):
                prefix = f"generation_probe/p{index:02d}_{config}_{steps}"
                node = configs["stock" if config == "stock_after_node" else config]
                prompt = build_prompt(model, checkpoint_name, resolution, steps, options.seed, node, prefix)
                http_json(f"{base}/generation_probe/reset", {})
                entry = queue_and_wait(base, prompt, options.prompt_timeout)
                record = {"index": index, "config": config, "steps": steps, "role": role,
                          **execution_summary(entry), "scaled_mm_calls": http_json(
                              f"{base}/generation_probe/counts")["scaled_mm"], "latent_prefix": prefix}
                record["ksampler_ran"] = "5" not in record["cached_nodes"]
                report["prompts"].append(record)
                print(f"{index:2d} {config:16s} steps {steps}: {record['status']} {record['execution_s']} s, "
                      f"_scaled_mm {record['scaled_mm_calls']}", flush=True)
                write()
            report["system_stats_after"] = http_json(f"{base}/system_stats")
        except (Exception, SystemExit) as error:
            report["error"] = f"{type(error).__name__}: {error}"
            print(report["error"], flush=True)
        finally:
            server.terminate()
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
    log_text = log_path.read_text(errors="replace")
    report["server_log_tail"] = log_text[-4000:]
    if "server_start" not in report:   # it never answered: what its log says all the same
        report["server_start"] = server_start(log_text)
    # again from the whole log: what the node said while the prompts ran (fused_dit_lines)
    report["pack"] = pack_loaded(log_text, node_info)
    report["server_log"] = log_path.name
    summarise(report, output_dir, low, high)
    write()
    print(f"wrote {options.out}")
    return 0 if "error" not in report else 1


def summarise(report: dict, output_dir: Path, low: int, high: int) -> None:
    """Seconds per step and FP8 GEMMs per step for each config, and the bit checks against stock."""
    prompts = [p for p in report["prompts"] if p.get("status") == "success"]

    def timed(config, steps):
        found = [p for p in prompts if p["config"] == config and p["steps"] == steps and p["role"] == "timed"]
        return found[-1] if found else None

    summary = {}
    for config in ("stock", "node_fp8", "node", "node_attention"):
        a, b = timed(config, low), timed(config, high)
        if a is None or b is None or a["execution_s"] is None or b["execution_s"] is None:
            continue
        summary[config] = {"s_per_step": round((b["execution_s"] - a["execution_s"]) / (high - low), 4),
                           "fp8_linear_calls_per_step": (b["scaled_mm_calls"] - a["scaled_mm_calls"]) / (high - low),
                           "prompt_s": {str(low): a["execution_s"], str(high): b["execution_s"]}}
    stock = summary.get("stock", {}).get("s_per_step")
    for entry in summary.values():
        entry["speedup_vs_stock"] = round(stock / entry["s_per_step"], 3) if stock and entry["s_per_step"] else None
    latents = {}
    for p in prompts:
        if p["steps"] == high:
            latents[p["config"]] = load_latent(output_dir, p["latent_prefix"])
    stock_latent = latents.get("stock")
    for config in ("node_fp8", "node", "node_attention", "stock_after_node"):
        if config in latents:
            summary.setdefault(config, {}).update(compare(latents[config], stock_latent))
    after = next((p for p in prompts if p["config"] == "stock_after_node"), None)
    if after is not None:
        summary["stock_after_node"].update({"scaled_mm_calls": after["scaled_mm_calls"],
                                            "ksampler_ran": after["ksampler_ran"],
                                            "execution_s": after["execution_s"]})
    report["summary"] = summary

