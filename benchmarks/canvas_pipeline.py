"""The large-canvas pipeline through a real ComfyUI server, before and after `applier apply` (issue 30, part 3).

Two copies of one release (--comfyui DIR, copied into --work): "patched" gets the catalog's comfyui/max-resolution
and comfyui/pil-pixel-limit through `python -m applier apply --target DIR --only ... --json`, as a user applies
them; "stock" stays as released. Each gets random-weight Flux VAE weights in models/vae/ (`python -m benchmarks
checkpoint --model flux-vae`: BFL's ae.safetensors keys, checked through the release's own comfy.sd.VAE) and is
started as its main.py starts by default (DynamicVRAM through comfy-aimdo on an NVIDIA GPU with torch >= 2.8;
--server-args adds flags), with an empty --front-end-root. Prompts of ComfyUI's own nodes, in its API format:

  A  EmptySD3LatentImage WxH -> VAEDecodeTiled (--tile, --overlap) -> SaveImage
  B  LoadImage (A's PNG, linked into input/) -> ImageScaleBy (bilinear, --scale) -> SaveImage

The empty latent is EmptySD3LatentImage's, the node Flux workflows use: it has Flux's 16 channels, where
EmptyLatentImage gives SD1.x's 4, which a Flux VAE's decoder refuses without a sampler between (both take
nodes.MAX_RESOLUTION as their width and height max). Per node: whether the server accepted it (its own validation
message where not), whether it ran (its own exception where not), its seconds (from the server's "executing"
messages on the websocket), and the peaks, while it ran, of the server process's resident memory (/proc) and of the
GPU memory in use (nvidia-smi, the whole device); the server's lifetime peak RSS (VmHWM) too. The stock server runs
first (its refusals take seconds): prompt A must be refused at the first cap, and the report names that node and
quotes ComfyUI's message; prompt B, given a flat grey PNG of the canvas's size (written with Pillow here, so the
stock run needs no pipeline), must fail where Pillow's bound stops LoadImage.

The weights are random: the figures are for which node accepts the size, memory and time, never image quality.

    python -m benchmarks canvas-pipeline --comfyui DIR --work /tmp/canvas --out canvas-pipeline-RELEASE.json
    python -m benchmarks canvas-pipeline --comfyui DIR --work W --size 256x256 --server-args=--cpu --out O.json
        # CPU smoke test of the plumbing (the stock server still gets the full-size refusal prompt)
On the device machine: scripts/comfy_server_for_device.sh with COMMAND=canvas-pipeline (benchmarks/README.md).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import uuid
from pathlib import Path

from . import comfy_release, results
from .comfy_server import (REPO_ROOT, execution_summary, http_json, make_venv, run_applier, server_start,
                           wait_for_server)

PATCHES = ("comfyui/max-resolution", "comfyui/pil-pixel-limit")
NOTE = ("Weights are seeded random numbers (Flux's VAE in its release's key format): the figures are for which node "
        "accepts the size, memory and time, never image quality.")
SAMPLE_S = 0.2   # how often the server's RSS and the GPU's memory are read


# ----------------------------------------------------------------------------------------------- measuring
class Monitor(threading.Thread):
    """The server's websocket messages (time, type, data) and, every SAMPLE_S, (time, RSS bytes, GPU bytes used)."""

    def __init__(self, base: str, client_id: str, pid: int):
        super().__init__(daemon=True)
        self.url = base.replace("http://", "ws://") + f"/ws?clientId={client_id}"
        self.pid = pid
        self.events: list[tuple] = []
        self.samples: list[tuple] = []
        self.connected = threading.Event()
        self.stopped = threading.Event()
        self.error = None

    def run(self):
        sampler = threading.Thread(target=self._sample, daemon=True)
        sampler.start()
        import asyncio
        try:
            asyncio.run(self._listen())
        except Exception as error:   # noqa: BLE001 - recorded: the times then come from the history alone
            self.error = f"{type(error).__name__}: {error}"
            self.connected.set()

    async def _listen(self):
        import aiohttp
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(self.url, max_msg_size=0) as socket:
                self.connected.set()
                while not self.stopped.is_set():
                    try:
                        message = await socket.receive(timeout=0.5)
                    except TimeoutError:
                        continue
                    if message.type == aiohttp.WSMsgType.TEXT:
                        data = json.loads(message.data)
                        self.events.append((time.monotonic(), data.get("type"), data.get("data") or {}))
                    elif message.type in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
                        break

    def _sample(self):
        while not self.stopped.is_set():
            self.samples.append((time.monotonic(), rss_bytes(self.pid), gpu_used_bytes()))
            self.stopped.wait(SAMPLE_S)


def rss_bytes(pid: int, field: str = "VmRSS") -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def gpu_used_bytes() -> int | None:
    """The device's memory in use (every process; the server is the only one), None without nvidia-smi."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=5)
        return int(done.stdout.split()[0]) * 1024 * 1024 if done.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None


def gib(value) -> float | None:
    return None if value is None else round(value / 2 ** 30, 2)


def node_timeline(events: list, samples: list, prompt_id: str, started: float) -> list[dict]:
    """Per node the server ran for this prompt: seconds from its "executing" message to the next, and the peaks
    of the samples taken meanwhile."""
    mine = [(t, kind, data) for t, kind, data in events if data.get("prompt_id") == prompt_id]
    marks = [(t, data.get("node")) for t, kind, data in mine if kind == "executing"]
    ends = [t for t, kind, _ in mine if kind in ("execution_success", "execution_error", "execution_interrupted")]
    nodes = []
    for index, (begin, node) in enumerate(marks):
        if node is None:
            continue
        end = marks[index + 1][0] if index + 1 < len(marks) else (ends[0] if ends else None)
        during = [s for s in samples if begin <= s[0] <= (end if end is not None else float("inf"))]
        rss = [s[1] for s in during if s[1] is not None]
        gpu = [s[2] for s in during if s[2] is not None]
        nodes.append({"node": node, "started_s": round(begin - started, 2),
                      "seconds": None if end is None else round(end - begin, 2),
                      "peak_rss_gib": gib(max(rss)) if rss else None,
                      "peak_gpu_used_gib": gib(max(gpu)) if gpu else None, "samples": len(during)})
        progress = [(t, data) for t, kind, data in mine if kind == "progress" and data.get("node") == node]
        if progress:   # the node's progress bar (a sampler: one per step, or per tile and step)
            nodes[-1]["progress"] = {"events": len(progress), "max": max(d.get("max") or 0 for _, d in progress),
                                     "first_s": round(progress[0][0] - begin, 2),
                                     "span_s": round(progress[-1][0] - progress[0][0], 2)}
    return nodes


# ------------------------------------------------------------------------------------------------- prompts
def prompt_a(width: int, height: int, vae: str, tile: int, overlap: int, prefix: str) -> dict:
    return {"1": {"class_type": "VAELoader", "inputs": {"vae_name": vae}},
            "2": {"class_type": "EmptySD3LatentImage", "inputs": {"width": width, "height": height, "batch_size": 1}},
            "3": {"class_type": "VAEDecodeTiled",
                  "inputs": {"samples": ["2", 0], "vae": ["1", 0], "tile_size": tile, "overlap": overlap,
                             "temporal_size": 64, "temporal_overlap": 8}},
            "4": {"class_type": "SaveImage", "inputs": {"images": ["3", 0], "filename_prefix": prefix}}}


def prompt_b(image: str, scale: float, prefix: str) -> dict:
    return {"5": {"class_type": "LoadImage", "inputs": {"image": image}},
            "6": {"class_type": "ImageScaleBy",
                  "inputs": {"image": ["5", 0], "upscale_method": "bilinear", "scale_by": scale}},
            "7": {"class_type": "SaveImage", "inputs": {"images": ["6", 0], "filename_prefix": prefix}}}


def queue(base: str, prompt: dict, client_id: str) -> tuple[str | None, dict | None]:
    """(prompt_id, None), or (None, the server's refusal: its error and node_errors, as /prompt answered)."""
    try:
        answer = http_json(f"{base}/prompt", {"prompt": prompt, "client_id": client_id})
    except urllib.error.HTTPError as error:
        body = error.read().decode(errors="replace")
        try:
            return None, {"http_status": error.code, **json.loads(body)}
        except json.JSONDecodeError:
            return None, {"http_status": error.code, "body": body[-2000:]}
    if answer.get("node_errors"):
        return None, answer
    return answer["prompt_id"], None


def wait(base: str, prompt_id: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        entry = (http_json(f"{base}/history/{prompt_id}") or {}).get(prompt_id)
        if entry and entry.get("status", {}).get("status_str") in ("success", "error"):
            return entry
        time.sleep(0.25)
    raise TimeoutError(f"prompt {prompt_id} did not finish within {timeout} s")


def refusal_nodes(refusal: dict, prompt: dict) -> list[dict]:
    """The nodes the server's validation refused, each with ComfyUI's own messages."""
    found = []
    for node, info in (refusal.get("node_errors") or {}).items():
        found.append({"node": node, "class_type": info.get("class_type") or prompt.get(node, {}).get("class_type"),
                      "messages": [f"{e.get('message')}: {e.get('details')}" for e in info.get("errors", [])]})
    return sorted(found, key=lambda n: int(n["node"]) if n["node"].isdigit() else 0)


def png_size(path: Path) -> tuple[int, int] | None:
    """(width, height) from a PNG's IHDR, without Pillow (whose bound is what is under test)."""
    with open(path, "rb") as handle:
        head = handle.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        return None
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


class PromptCutOff(Exception):
    """A prompt that did not finish (a time limit): its record so far."""

    def __init__(self, record: dict):
        super().__init__(record.get("error"))
        self.record = record


def write_grey_png(path: Path, width: int, height: int) -> dict:
    """A flat grey RGB PNG of this size, written with Pillow (which bounds only what it opens, never what it
    saves): the stock server's LoadImage is given a file of the canvas's size without running the pipeline."""
    from PIL import Image
    started = time.perf_counter()
    Image.new("RGB", (width, height), (128, 128, 128)).save(path, compress_level=1)
    return {"file": path.name, "bytes": path.stat().st_size, "width_height": png_size(path),
            "written_by": "Pillow Image.new('RGB', size, grey).save (not the pipeline: a file of the same size)",
            "seconds": round(time.perf_counter() - started, 1)}


def run_prompt(base: str, monitor: Monitor, client_id: str, name: str, prompt: dict, timeout: float) -> dict:
    """Queue one prompt and wait for it; what the server did with each of its nodes."""
    record = {"prompt": name, "nodes_in_prompt": {k: v["class_type"] for k, v in prompt.items()},
              "inputs": {v["class_type"]: {k: x for k, x in v["inputs"].items() if not isinstance(x, list)}
                         for v in prompt.values()}}
    started = time.monotonic()
    prompt_id, refusal = queue(base, prompt, client_id)
    if refusal is not None:
        record.update({"accepted": False, "refused_by": refusal_nodes(refusal, prompt),
                       "server_error": (refusal.get("error") or {}).get("message"),
                       "seconds": round(time.monotonic() - started, 2)})
        return record
    try:
        entry = wait(base, prompt_id, timeout)
    except (Exception, SystemExit) as error:   # cut off: what ran so far, then on to the caller
        record.update({"accepted": True, "error": f"{type(error).__name__}: {error}",
                       "nodes": node_timeline(monitor.events, monitor.samples, prompt_id, started)})
        for node in record["nodes"]:
            node["class_type"] = prompt.get(node["node"], {}).get("class_type")
        raise PromptCutOff(record) from error
    time.sleep(2 * SAMPLE_S)   # the last node's samples
    summary = execution_summary(entry)
    messages = {kind: data for kind, data in entry["status"].get("messages", [])}
    record.update({"accepted": True, "status": summary["status"], "execution_s": summary["execution_s"],
                   "seconds": round(time.monotonic() - started, 2),
                   "nodes": node_timeline(monitor.events, monitor.samples, prompt_id, started)})
    for node in record["nodes"]:
        node["class_type"] = prompt.get(node["node"], {}).get("class_type")
        node["ran"] = True
    if "execution_error" in messages:
        error = messages["execution_error"]
        record["failed_at"] = {"node": error.get("node_id"), "class_type": error.get("node_type"),
                               "exception": f"{error.get('exception_type')}: {error.get('exception_message')}"}
        for node in record["nodes"]:
            if node["node"] == error.get("node_id"):
                node["ran"] = False
                node["error"] = record["failed_at"]["exception"]
    record["outputs"] = {node: [f"{i.get('subfolder') or ''}/{i['filename']}".lstrip("/")
                                for i in output.get("images", [])]
                         for node, output in (entry.get("outputs") or {}).items()}
    texts = {node: output["text"] for node, output in (entry.get("outputs") or {}).items() if output.get("text")}
    if texts:   # what text nodes showed (PreviewAny)
        record["texts"] = texts
    return record


# ---------------------------------------------------------------------------------------------------- set-up
def prepare(source: Path, folder: Path, vae: Path) -> Path:
    """A copy of the release in folder/ComfyUI with the VAE linked into models/vae/."""
    tree = folder / "ComfyUI"
    if tree.exists():
        shutil.rmtree(tree)
    top = {"venv", ".applier", "output", "input", "temp", "temp_empty_frontend"}   # left behind at the top only

    def ignore(folder, names):
        return [n for n in names if n == "__pycache__" or (Path(folder) == source and n in top)]

    shutil.copytree(source, tree, ignore=ignore)
    for name in ("input", "output", "models/vae", "custom_nodes"):   # a tree of Python files only may lack them
        (tree / name).mkdir(parents=True, exist_ok=True)
    link(vae, tree / "models" / "vae" / vae.name)
    return tree


def link(source: Path, target: Path) -> None:
    if target.exists():
        target.unlink()
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def apply_patches(tree: Path, python: Path) -> dict:
    """`python -m applier apply --target DIR --python PY --json --only ...`, run from the repo as a user would."""
    return run_applier(tree, python, ("apply",), tuple(word for patch in PATCHES for word in ("--only", patch)), 300)


def make_vae(comfyui: Path, directory: Path, seed: int, timeout: float) -> dict:
    """The random Flux VAE, written by a child process (`python -m benchmarks checkpoint --model flux-vae`)."""
    command = [sys.executable, "-m", "benchmarks", "checkpoint", "--comfyui", str(comfyui), "--dir",
               str(directory.resolve()), "--model", "flux-vae", "--seed", str(seed)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT)
    lines = [line for line in done.stdout.splitlines() if line.startswith("CHECKPOINT ")]
    if done.returncode or not lines:
        raise RuntimeError(f"writing the VAE failed ({done.returncode}): {(done.stdout + done.stderr)[-3000:]}")
    return json.loads(lines[-1].split(" ", 1)[1])


class Server:
    """main.py of one tree, its log in log_path; stopped on leaving the block."""

    def __init__(self, tree: Path, python: Path, port: int, extra: str, log_path: Path, env: dict | None = None):
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        front_end = tree / "temp_empty_frontend"
        front_end.mkdir(exist_ok=True)
        self.command = [str(python), "main.py", "--listen", "127.0.0.1", "--port", str(port),
                        "--front-end-root", str(front_end), *extra.split()]
        self.tree, self.log_path, self.base = tree, log_path, f"http://127.0.0.1:{port}"

    def __enter__(self):
        self.log = open(self.log_path, "w")
        self.process = subprocess.Popen(self.command, cwd=self.tree, stdout=self.log, stderr=subprocess.STDOUT,
                                        env=self.env)
        return self

    def __exit__(self, *_):
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


def serve(name: str, tree: Path, python: Path, options, report: dict, write, prompts,
          env: dict | None = None) -> None:
    """Start one tree's server (more environment variables in env) and run `prompts(base, monitor, client_id,
    record)` against it."""
    record = report["servers"].setdefault(name, {})
    server = Server(tree, python, options.port, options.server_args, server_log(options.out, name), env)
    log_path = server.log_path
    record["server_command"] = " ".join(["python", *server.command[1:]]).replace(str(tree), "DIR")
    started = time.perf_counter()
    with server:
        client_id = uuid.uuid4().hex
        try:
            wait_for_server(server.base, server.process, options.startup_timeout)
            record["startup_s"] = round(time.perf_counter() - started, 1)
            record["server_start"] = server_start(log_path.read_text(errors="replace"))
            width_max = http_json(f"{server.base}/object_info/EmptySD3LatentImage")
            record["empty_latent_width_max"] = max_of(width_max, "EmptySD3LatentImage", "width")
            print(f"{name}: up in {record['startup_s']} s, vram mode {record['server_start']['vram_mode']}, "
                  f"EmptySD3LatentImage width max {record['empty_latent_width_max']}", flush=True)
            monitor = Monitor(server.base, client_id, server.process.pid)
            monitor.start()
            monitor.connected.wait(10)
            record["websocket"] = monitor.error or "connected"
            write()
            try:
                prompts(server.base, monitor, client_id, record)
            finally:
                monitor.stopped.set()
                record["peak_rss_gib_lifetime"] = gib(rss_bytes(server.process.pid, "VmHWM"))
        except (Exception, SystemExit) as error:   # noqa: BLE001 - recorded, then the next server runs
            record["error"] = f"{type(error).__name__}: {error}"
            if isinstance(error, PromptCutOff) or isinstance(error.__context__, PromptCutOff):
                record["error"] = f"cut off: {error}"
            print(f"{name}: {record['error']}", flush=True)
    record["server_log_tail"] = log_path.read_text(errors="replace")[-3000:]
    record["server_log"] = log_path.name
    write()


def server_log(out: Path, name: str) -> Path:
    """Where serve() writes the log of server `name`, beside the JSON `out`."""
    return out.with_name(f"{out.stem}.{name}.server.log")


def max_of(info: dict, node: str, name: str):
    """An input's max from /object_info (V1 lists [type, options]; V3 nodes answer the same shape)."""
    try:
        spec = info[node]["input"]["required"][name]
        return spec[1].get("max")
    except (KeyError, IndexError, TypeError, AttributeError):
        return None


# ------------------------------------------------------------------------------------------------- command
def add_arguments(parser) -> None:
    parser.add_argument("--comfyui", type=Path, required=True, help="the ComfyUI release to copy (twice) and run")
    parser.add_argument("--source", default="github:jwijaya83/ComfyUI",
                        help="where the tree came from (recorded beside its REVISION)")
    parser.add_argument("--work", type=Path, required=True, help="where the two copies and the VAE go")
    parser.add_argument("--size", default="32768x18432", help="WxH of the canvas (default 32768x18432)")
    parser.add_argument("--refusal-size", default="32768x18432",
                        help="WxH the stock server is given (default 32768x18432, also with a small --size)")
    parser.add_argument("--tile", type=int, default=1024, help="VAEDecodeTiled tile_size (pixels)")
    parser.add_argument("--overlap", type=int, default=64, help="VAEDecodeTiled overlap (pixels)")
    parser.add_argument("--scale", type=float, default=0.5, help="ImageScaleBy scale_by")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--port", type=int, default=8188 + 17)
    parser.add_argument("--server-args", default="", help="more main.py arguments, e.g. '--cpu'")
    parser.add_argument("--startup-timeout", type=float, default=180)
    parser.add_argument("--prompt-timeout", type=float, default=420)
    parser.add_argument("--only", choices=("patched", "stock"), help="one server only")
    parser.add_argument("--out", type=Path, required=True)


def parse_size(text: str) -> tuple[int, int]:
    width, _, height = text.lower().partition("x")
    return int(width), int(height)


def run(options, parser) -> int:
    source = options.comfyui.resolve()
    if not (source / "main.py").exists():
        parser.error(f"{source} has no main.py")
    width, height = parse_size(options.size)
    release = comfy_release.read_release(source)
    report = {"benchmark": "canvas-pipeline", "script": "benchmarks/canvas_pipeline.py", "note": NOTE,
              "date": results.now(), "command": results.command_line(),
              "comfyui": {**release.as_dict(), "source": options.source},
              "canvas": {"width": width, "height": height, "pixels": width * height,
                         "refusal_size": options.refusal_size},
              "patches": list(PATCHES), "servers": {}}
    work = options.work.resolve()
    work.mkdir(parents=True, exist_ok=True)

    def write():
        results.write_json(report, options.out)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated (SIGTERM)"))
    try:
        report["vae"] = make_vae(source, work / "vae", options.seed, 300)
        vae = Path(report["vae"]["path"])
        print(f"VAE {vae.name}: {report['vae']}", flush=True)
        trees = {name: prepare(source, work / name, vae) for name in ("patched", "stock")}
        pythons = {name: make_venv(tree) for name, tree in trees.items()}
        report["apply"] = apply_patches(trees["patched"], pythons["patched"])
        print(f"apply: exit {report['apply']['returncode']}", flush=True)
    except (Exception, SystemExit) as error:   # noqa: BLE001
        report["error"] = f"{type(error).__name__}: {error}"
        write()
        print(report["error"], flush=True)
        return 1
    write()
    png: dict = {}   # the patched run's PNG

    def run_and_keep(record, *args):
        try:
            found = run_prompt(*args)
        except PromptCutOff as cut:
            record["prompts"].append(cut.record)
            raise
        record["prompts"].append(found)
        write()
        return found

    def patched_prompts(base, monitor, client_id, record):
        record["prompts"] = []
        a = run_and_keep(record, base, monitor, client_id, "A", prompt_a(width, height, vae.name, options.tile,
                                                                         options.overlap, "canvas_pipeline"),
                         options.prompt_timeout)
        write()
        print(json.dumps({k: a.get(k) for k in ("accepted", "status", "execution_s", "failed_at", "refused_by")}),
              flush=True)
        saved = (a.get("outputs") or {}).get("4") or []
        if not saved:
            return
        path = trees["patched"] / "output" / saved[0]
        png.update({"name": path.name, "path": path, "bytes": path.stat().st_size, "size": png_size(path)})
        record["png"] = {"file": path.name, "bytes": png["bytes"], "width_height": png["size"]}
        link(path, trees["patched"] / "input" / path.name)
        b = run_and_keep(record, base, monitor, client_id, "B", prompt_b(path.name, options.scale, "canvas_scaled"),
                         options.prompt_timeout)
        print(json.dumps({k: b.get(k) for k in ("accepted", "status", "execution_s", "failed_at", "refused_by")}),
              flush=True)

    def stock_prompts(base, monitor, client_id, record):
        record["prompts"] = []
        refusal_width, refusal_height = parse_size(options.refusal_size)
        a = run_and_keep(record, base, monitor, client_id, "A",
                         prompt_a(refusal_width, refusal_height, vae.name, options.tile, options.overlap,
                                  "canvas_stock"), options.prompt_timeout)
        print(json.dumps({k: a.get(k) for k in ("accepted", "status", "refused_by")}), flush=True)
        grey = trees["stock"] / "input" / f"grey_{refusal_width}x{refusal_height}.png"
        record["png"] = write_grey_png(grey, refusal_width, refusal_height)
        b = run_and_keep(record, base, monitor, client_id, "B", prompt_b(grey.name, options.scale, "canvas_stock_b"),
                         options.prompt_timeout)
        print(json.dumps({k: b.get(k) for k in ("accepted", "status", "failed_at")}), flush=True)

    # the stock server first: its refusals take seconds, and they are on record before the long run starts
    if options.only in (None, "stock"):
        serve("stock", trees["stock"], pythons["stock"], options, report, write, stock_prompts)
    if options.only in (None, "patched"):
        serve("patched", trees["patched"], pythons["patched"], options, report, write, patched_prompts)
    report["summary"] = summarise(report)
    write()
    print(json.dumps(report["summary"], indent=1))
    print(f"wrote {options.out}")
    return 0 if "error" not in report else 1


def summarise(report: dict) -> dict:
    """Per node of each server: accepted, ran, seconds, peaks; whether the patched server took every node; the
    stock server's first refusal, in ComfyUI's words."""
    out: dict = {"vram_mode": {name: (server.get("server_start") or {}).get("vram_mode")
                               for name, server in report["servers"].items()},
                 "patched": [], "stock": []}
    for name in ("patched", "stock"):
        for prompt in report["servers"].get(name, {}).get("prompts", []):
            if not prompt.get("accepted"):
                for node in prompt.get("refused_by", []):
                    out[name].append({"prompt": prompt["prompt"], "node": node["node"],
                                      "class_type": node["class_type"], "accepted": False,
                                      "message": "; ".join(node["messages"])})
                continue
            for node in prompt.get("nodes", []):
                out[name].append({"prompt": prompt["prompt"], "node": node["node"], "class_type": node["class_type"],
                                  "accepted": True, "ran": node["ran"], "error": node.get("error"),
                                  "seconds": node["seconds"], "peak_rss_gib": node["peak_rss_gib"],
                                  "peak_gpu_used_gib": node["peak_gpu_used_gib"]})
    out["patched_every_node_ran"] = bool(out["patched"]) and all(n["accepted"] and n.get("ran")
                                                                 for n in out["patched"])
    refused = [n for n in out["stock"] if not n["accepted"] or not n.get("ran")]
    out["stock_first_cap"] = refused[0] if refused else None
    return out
