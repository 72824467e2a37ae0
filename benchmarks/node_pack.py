"""The node pack installed the ComfyUI way into a real ComfyUI, on the CPU: listed by the server, run in a prompt.

Steps (each recorded in the JSON; no network but PyPI for the venv):
  1. the ComfyUI tree: REV of a fetched mirror (`fetch github:jwijaya83/ComfyUI`: a bare git folder whose largest
     blobs may be absent; those files are listed and left out) written into WORK/ComfyUI with ls-tree + cat-file;
  2. a throwaway venv WORK/venv (unless --python): torch 2.13.0 and its torchvision from the registry, then the tree's
     requirements.txt with both held there (make_venv says why not the local CPU wheel);
  3. the pack as ComfyUI-Manager's "Install via Git URL" installs it: `applier overlay export` into a git repository
     WORK/fused-dit, then `git clone` of it into custom_nodes/ComfyUI-fused-dit (Manager clones a URL there and runs
     pip only for a requirements.txt, which the pack has none of);
  4. `python main.py --cpu --listen 127.0.0.1 --port N --front-end-root temp_empty_frontend` (an empty folder: no
     frontend package is needed); GET /object_info/FusedDiTOps says whether the node is listed;
  5. a prompt of ComfyUI's own nodes: UNETLoader (a tiny random Wan 2.1 written by the release's own WanModel: dim 256,
     1 block) -> FusedDiTOps (its defaults) -> KSampler (1 step) with zero CONDITIONING from a one-file probe node this
     script writes, EmptyHunyuanLatentVideo 64x64x5 -> SaveLatent. On the CPU every family falls back to stock
     math; the node's own console lines say which;
  6. `applier status` and `overlay check` on the tree: how they name the clone.

    python -m benchmarks validate node-pack --mirror MIRROR_GIT_DIR --work WORK \\
        --out benchmarks/results/node-pack-0.33.0.json
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SOURCE = "github:jwijaya83/ComfyUI"
FOLDER = "ComfyUI-fused-dit"            # a clone of https://.../ComfyUI-fused-dit lands in custom_nodes/ under this
TORCH = ("torch==2.13.0", "torchvision==0.28.0")
CHECKPOINT = "node-pack-tiny-wan.safetensors"
EMPTY_FRONTEND = "temp_empty_frontend"  # --front-end-root, relative to the tree (the server's working folder)
TINY_WAN = dict(model_type="t2v", patch_size=(1, 2, 2), text_len=512, in_dim=16, dim=256, ffn_dim=512, freq_dim=256,
                text_dim=4096, out_dim=16, num_heads=2, num_layers=1, window_size=(-1, -1), qk_norm=True,
                cross_attn_norm=True, eps=1e-6)
WRITE_CHECKPOINT = """
import json, sys, torch
from comfy.cli_args import args
args.cpu = True
import comfy.ops
from comfy.ldm.wan.model import WanModel
from safetensors.torch import save_file
torch.manual_seed(0)
model = WanModel(**json.loads(sys.argv[2]), operations=comfy.ops.disable_weight_init)
save_file({k: torch.randn(v.shape) * 0.02 for k, v in model.state_dict().items()}, sys.argv[1])
"""
PROBE = '''"""Zero CONDITIONING of a text encoder's shape (written by applier's scripts/validate_node_pack.py)."""
import torch


class NodePackProbeZeroConditioning:
    CATEGORY = "testing"
    RETURN_TYPES = ("CONDITIONING",)
    FUNCTION = "make"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"tokens": ("INT", {"default": 8}), "channels": ("INT", {"default": 4096})}}

    def make(self, tokens, channels):
        return ([[torch.zeros(1, tokens, channels), {}]],)


NODE_CLASS_MAPPINGS = {"NodePackProbeZeroConditioning": NodePackProbeZeroConditioning}
'''


def sh(cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], check=True, capture_output=True, text=True, **kw)


def export_tree(mirror: Path, rev: str, into: Path) -> tuple[str, list[str]]:
    """(commit, files absent from the mirror) after writing rev's tree under into."""
    commit = sh(["git", f"--git-dir={mirror}", "rev-parse", rev]).stdout.strip()
    listing = subprocess.run(["git", f"--git-dir={mirror}", "ls-tree", "-r", "-z", commit], check=True,
                             capture_output=True).stdout
    blobs = [(meta.split()[2], path.decode()) for meta, path in
             (item.split(b"\t", 1) for item in listing.split(b"\0") if item) if meta.split()[1] == b"blob"]
    missing = []
    batch = subprocess.Popen(["git", f"--git-dir={mirror}", "cat-file", "--batch"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)
    for sha, path in blobs:
        batch.stdin.write(sha + b"\n")
        batch.stdin.flush()
        header = batch.stdout.readline().split()
        if header[1] == b"missing":
            missing.append(path)
            continue
        data = batch.stdout.read(int(header[2]))
        batch.stdout.read(1)
        (into / path).parent.mkdir(parents=True, exist_ok=True)
        (into / path).write_bytes(data)
    batch.stdin.close()
    batch.wait()
    return commit, missing


def make_venv(work: Path, comfyui: Path) -> Path:
    """ComfyUI's requirements with the registry's torch 2.13.0 (a CUDA build; the server runs --cpu): the
    registry's torchvision links torch's CUDA libraries, so next to a CPU-only torch it cannot load and 0.33.0's
    imports of it fail. pip's configuration of this machine (a local CPU wheel first) is left out for that."""
    venv = work / "venv"
    python = venv / "bin" / "python"
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": ""}
    if not python.exists():
        sh([sys.executable, "-m", "venv", venv])
        sh([python, "-m", "pip", "install", "-q", *TORCH], timeout=3600, env=env)
        (work / "torch-pin.txt").write_text("\n".join(TORCH) + "\n")
        sh([python, "-m", "pip", "install", "-q", "-r", comfyui / "requirements.txt", "-c", work / "torch-pin.txt"],
            timeout=3600, env=env)
    return python


def install_like_manager(work: Path, comfyui: Path) -> dict:
    """The exported pack as a git repository, cloned into custom_nodes/ as ComfyUI-Manager clones a git URL."""
    repo = work / "fused-dit"
    exported = json.loads(sh([sys.executable, "-m", "applier", "overlay", "export", repo, "--json"], cwd=REPO).stdout)
    git = ["git", "-c", "user.name=node-pack", "-c", "user.email=node-pack@localhost", "-C", repo]
    sh([*git, "init", "-q"])
    sh([*git, "add", "-A"])
    sh([*git, "commit", "-q", "-m", f"fused-dit {exported['version']}"])
    sh(["git", "clone", "-q", repo, comfyui / "custom_nodes" / FOLDER])
    return {"name": exported["name"], "version": exported["version"], "files": len(exported["files"]),
            "installed_as": f"git clone into custom_nodes/{FOLDER} (ComfyUI-Manager's Install via Git URL)",
            "requirements_txt": (repo / "requirements.txt").exists()}


def http_json(url: str, payload: dict | None = None, timeout: float = 30.0):
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return json.loads(answer.read())


def wait_for(base: str, server: subprocess.Popen, timeout: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode}")
        try:
            http_json(f"{base}/system_stats", timeout=5)
            return time.monotonic() - start
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(1)
    raise TimeoutError(f"no answer from {base} in {timeout:.0f} s")


# the node's defaults, then FP8 and attention on (FP8's seam is verified on 0.33.0: on the CPU it takes the eager path)
# the node's inputs per prompt: "defaults" are the ones the server's /object_info gives (the release decides some)
NODE_CONFIGS = {"defaults": None,
                "every family on": {"norm_rope": True, "adaln": True, "gate": True, "fp8_linear": True,
                                    "attention": True}}


def node_defaults(info: dict) -> dict:
    """The FusedDiTOps inputs' defaults as /object_info/FusedDiTOps states them (the model input aside)."""
    inputs = {**info["input"].get("required", {}), **info["input"].get("optional", {})}
    return {name: spec[1]["default"] for name, spec in inputs.items()
            if name != "model" and len(spec) > 1 and isinstance(spec[1], dict) and "default" in spec[1]}


def run_prompt(base: str, timeout: float, node: dict) -> dict:
    prompt = {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": CHECKPOINT, "weight_dtype": "default"}},
        "2": {"class_type": "FusedDiTOps", "inputs": {"model": ["1", 0], **node}},
        "3": {"class_type": "NodePackProbeZeroConditioning", "inputs": {"tokens": 8, "channels": 4096}},
        "4": {"class_type": "EmptyHunyuanLatentVideo", "inputs": {"width": 64, "height": 64, "length": 5,
                                                                  "batch_size": 1}},
        "5": {"class_type": "KSampler", "inputs": {"model": ["2", 0], "positive": ["3", 0], "negative": ["3", 0],
                                                   "latent_image": ["4", 0], "seed": 0, "steps": 1, "cfg": 1.0,
                                                   "sampler_name": "euler", "scheduler": "simple", "denoise": 1.0}},
        "6": {"class_type": "SaveLatent", "inputs": {"samples": ["5", 0], "filename_prefix": "node-pack"}},
    }
    queued = http_json(f"{base}/prompt", {"prompt": prompt, "client_id": str(uuid.uuid4())})
    if queued.get("node_errors"):
        return {"ran": False, "node_errors": queued["node_errors"]}
    prompt_id = queued["prompt_id"]
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        entry = http_json(f"{base}/history/{prompt_id}").get(prompt_id)
        if entry and entry.get("status", {}).get("completed") is not None:
            status = entry["status"]
            errors = [m[1].get("exception_message") for m in status.get("messages", []) if m[0] == "execution_error"]
            return {"ran": status.get("status_str") == "success", "status": status.get("status_str"),
                    "seconds": round(time.monotonic() - start, 1), "errors": errors,
                    "graph": "UNETLoader (tiny random Wan 2.1) -> FusedDiTOps -> KSampler 1 step euler -> SaveLatent"}
        time.sleep(1)
    return {"ran": False, "status": f"not done in {timeout:.0f} s"}


def applier_view(comfyui: Path, work: Path) -> dict:
    """What `applier status` and `overlay check` say about the clone (paths relative to the work folder)."""
    def cli(*args):
        proc = subprocess.run([sys.executable, "-m", "applier", *args, "--target", comfyui, "--json"], cwd=REPO,
                              capture_output=True, text=True)
        return json.loads(proc.stdout.replace(str(work), "WORK")), proc.returncode
    status, status_rc = cli("status")
    check, check_rc = cli("overlay", "check")
    return {"status_exit": status_rc, "node_pack": status.get("node_pack"), "check_exit": check_rc,
            "check_node_pack_note": check.get("node_pack_note")}


def git_head() -> str | None:
    """This checkout's commit, with "+dirty" when its pack or applier differ from it (None outside a checkout)."""
    try:
        head = sh(["git", "-C", REPO, "rev-parse", "HEAD"]).stdout.strip()
        dirty = sh(["git", "-C", REPO, "status", "--porcelain", "--", "applier", "overlays"]).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


def add_arguments(parser) -> None:
    parser.add_argument("--mirror", type=Path, required=True, help="the fetched ComfyUI git folder")
    parser.add_argument("--rev", default="master", help="the revision to check out (default master: 0.33.0)")
    parser.add_argument("--source", default=SOURCE, help=f"where the mirror came from, for the record ({SOURCE})")
    parser.add_argument("--work", type=Path, required=True, help="a folder outside the repository")
    parser.add_argument("--python", type=Path, help="an interpreter with ComfyUI's requirements (default: make one)")
    parser.add_argument("--port", type=int, default=8199)
    parser.add_argument("--timeout", type=float, default=600, help="seconds for the server to start, and a prompt")
    parser.add_argument("--out", type=Path, required=True)


def run(args, parser) -> int:
    work, comfyui = args.work.resolve(), args.work.resolve() / "ComfyUI"
    if comfyui.exists():
        parser.error(f"{comfyui} exists: name a new --work folder")
    commit, missing = export_tree(args.mirror, args.rev, comfyui)
    release = sh([sys.executable, "-c", "import runpy,sys; print(runpy.run_path(sys.argv[1])['__version__'])",
                   comfyui / "comfyui_version.py"]).stdout.strip()
    python = args.python or make_venv(work, comfyui)
    pack = install_like_manager(work, comfyui)
    (comfyui / "custom_nodes" / "node_pack_probe.py").write_text(PROBE)
    models = comfyui / "models" / "diffusion_models"
    models.mkdir(parents=True, exist_ok=True)
    sh([python, "-c", WRITE_CHECKPOINT, models / CHECKPOINT, json.dumps(TINY_WAN)], cwd=comfyui, timeout=600)
    (comfyui / EMPTY_FRONTEND).mkdir()     # no frontend package needed: the server serves an empty folder
    server_args = ["--cpu", "--listen", "127.0.0.1", "--port", str(args.port), "--front-end-root", EMPTY_FRONTEND]
    base = f"http://127.0.0.1:{args.port}"
    report = {"comfyui": {"release": release, "source": args.source, "commit": commit,
                          "files_absent_from_mirror": missing},
              "pack": pack, "server_args": server_args}
    with open(work / "server.log", "w") as log:
        server = subprocess.Popen([str(python), "main.py", *server_args], cwd=comfyui, stdout=log,
                                  stderr=subprocess.STDOUT)
        try:
            report["server_start_s"] = round(wait_for(base, server, args.timeout), 1)
            info = http_json(f"{base}/object_info/FusedDiTOps")
            report["listed"] = "FusedDiTOps" in info
            report["object_info"] = {k: info["FusedDiTOps"][k] for k in ("display_name", "category", "python_module")
                                     } if report["listed"] else None
            configs = {name: node if node is not None else node_defaults(info["FusedDiTOps"])
                       for name, node in NODE_CONFIGS.items()} if report["listed"] else {}
            report["prompts"] = {name: {"inputs": configs[name], **run_prompt(base, args.timeout, configs[name])}
                                 if report["listed"] else {"ran": False} for name in NODE_CONFIGS}
        finally:
            server.terminate()
            server.wait(timeout=60)
    lines = re.sub(r"\x1b\[[0-9;]*m", "", (work / "server.log").read_text(errors="replace")).splitlines()
    report["server_log"] = {"pack_import": [ln for ln in lines if FOLDER in ln],
                            # the model's line comes at its first call, after the sampler's progress bar
                            "node_says": [ln[ln.index("Fused DiT Ops"):] if "Fused DiT Ops" in ln else ln
                                          for ln in lines if "Fused DiT Ops" in ln or "fused_dit" in ln],
                            "errors": [ln for ln in lines if "Traceback" in ln or "IMPORT FAILED" in ln]}
    report["applier"] = {"commit": git_head(), **applier_view(comfyui, work)}
    report["environment"] = {
        "python": sh([python, "-c", "import platform; print(platform.python_version())"]).stdout.strip(),
        "torch": sh([python, "-c", "import torch; print(torch.__version__)"]).stdout.strip(),
        "machine": platform.machine(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python -m benchmarks validate node-pack --mirror MIRROR --work WORK --out " + str(args.out)}
    text = json.dumps(report, indent=2).replace(str(work), "WORK").replace(str(args.mirror.resolve()), "MIRROR")
    args.out.write_text(text + "\n")
    ran = all(p.get("ran") for p in report["prompts"].values())
    print(f"listed: {report['listed']}, prompts ran: {ran} -> {args.out}")
    return 0 if report["listed"] and ran else 1

