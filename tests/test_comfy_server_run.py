"""benchmarks/comfy_server_run.py's pure parts: what it reads from a server's log (how the server started, whether
the pack's node loaded), the prompts it queues, the checkpoint child's source and its command line.

The run itself needs a ComfyUI tree and its server (scripts/comfy_server_for_device.sh on a GPU machine; a CPU
smoke test with --tiny --server-args=--cpu); these parts take strings and dicts only."""
from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
GREEN, YELLOW, RESET = "\x1b[32m", "\x1b[1m\x1b[33m", "\x1b[0m"


@pytest.fixture(scope="module")
def run():
    spec = importlib.util.spec_from_file_location("comfy_server_run", BENCHMARKS / "comfy_server_run.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("comfy_server_run", None)


def info(text: str) -> str:   # a line as 0.33.0's logger colours it
    return f"{GREEN}[INFO]{RESET} {text}"


def start_log(*middle: str) -> str:
    return "\n".join([
        info("Total VRAM 143156 MB, total RAM 128000 MB"), info("pytorch version: 2.11.0+cu130"),
        info("Set vram state to: NORMAL_VRAM"), info("Device: cuda:0 NVIDIA H200 : cudaMallocAsync"), *middle,
        info("Python version: 3.12.3"), info("ComfyUI version: 0.33.0"), info("comfy-aimdo version: 0.4.13"),
        info("comfy-kitchen version: 0.2.31")])


def test_server_start_dynamic(run):
    said = run.server_start(start_log(info("DynamicVRAM support detected and enabled")))
    assert said["vram_mode"] == "dynamic"
    assert said["vram_state"] == "NORMAL_VRAM"
    assert said["device"] == "cuda:0 NVIDIA H200 : cudaMallocAsync"
    assert (said["comfyui_version"], said["comfy_aimdo_version"], said["comfy_kitchen_version"]) == (
        "0.33.0", "0.4.13", "0.2.31")
    assert said["pytorch_version"] == "2.11.0+cu130"
    assert all("\x1b" not in line for line in said["log_lines"])
    assert "[INFO] DynamicVRAM support detected and enabled" in said["log_lines"]


def test_server_start_legacy(run):
    fallback = (f"{YELLOW}[WARNING]{RESET} No working comfy-aimdo install detected. DynamicVRAM support disabled. "
                "Falling back to legacy ModelPatcher. VRAM estimates may be unreliable especially on Windows")
    said = run.server_start(start_log(fallback))
    assert said["vram_mode"] == "legacy" and "No working comfy-aimdo" in said["vram_mode_reason"]
    cpu = run.server_start(start_log())
    assert cpu["vram_mode"] == "legacy" and "--cpu" in cpu["vram_mode_reason"]
    assert run.server_start("")["comfyui_version"] is None


NODE_INFO = {"FusedDiTOps": {"input": {"required": {"model": ["MODEL"], "norm_rope": ["BOOLEAN"], "adaln": ["BOOLEAN"],
                                                    "gate": ["BOOLEAN"], "fp8_linear": ["BOOLEAN"]},
                                       "optional": {"attention": ["BOOLEAN"], "fp8_weights": [["replace"]]}}}}


def pack_log(import_line: str) -> str:
    return "\n".join(["", "Prestartup times for custom nodes:",
                      info("   0.0 seconds: DIR/custom_nodes/comfyui_fused_dit"), "",
                      info("Import times for custom nodes:"),
                      info("   0.0 seconds: DIR/custom_nodes/websocket_image_save.py"), info(import_line), "",
                      f"{YELLOW}[WARNING]{RESET} fused_dit: DoubleStreamBlock: stays stock"])


def test_pack_loaded(run):
    pack = run.pack_loaded(pack_log("   0.1 seconds: DIR/custom_nodes/comfyui_fused_dit"), NODE_INFO)
    assert pack["registered"] and not pack["import_failed"]
    assert pack["import_line"] == "[INFO]    0.1 seconds: DIR/custom_nodes/comfyui_fused_dit"
    assert pack["prestartup_line"] == "[INFO]    0.0 seconds: DIR/custom_nodes/comfyui_fused_dit"
    assert pack["inputs"] == {"required": ["adaln", "fp8_linear", "gate", "model", "norm_rope"],
                              "optional": ["attention", "fp8_weights"]}
    assert pack["fused_dit_lines"] == ["[WARNING] fused_dit: DoubleStreamBlock: stays stock"]


def test_pack_not_loaded(run):
    failed = run.pack_loaded(pack_log("   0.0 seconds (IMPORT FAILED): DIR/custom_nodes/comfyui_fused_dit"), {})
    assert failed["import_failed"] and not failed["registered"]
    assert failed["inputs"] == {"required": [], "optional": []}
    missing = run.pack_loaded("", {"error": "HTTP 404"})
    assert missing["import_failed"] and missing["import_line"] is None and not missing["registered"]


def test_build_prompt(run):
    model = run.MODELS["flux-dev"]
    stock = run.build_prompt(model, "ckpt.safetensors", (64, 64), 2, 0, None, "p")
    assert "2" not in stock and stock["5"]["inputs"]["model"] == ["1", 0]
    assert stock["4"]["inputs"] == {"width": 64, "height": 64, "batch_size": 1}
    node = {**run.OVERLAY, "fp8_linear": False, "attention": True}
    patched = run.build_prompt(model, "ckpt.safetensors", (1024, 1024), 6, 0, node, "p")
    assert patched["2"] == {"class_type": "FusedDiTOps", "inputs": {"model": ["1", 0], **node}}
    assert patched["5"]["inputs"]["model"] == ["2", 0] and patched["5"]["inputs"]["steps"] == 6
    assert patched["6"]["inputs"]["filename_prefix"] == "p"


def test_checkpoint_child_source(run):
    tree = ast.parse(run.CHECKPOINT_SOURCE)
    called = {node.func.attr for node in ast.walk(tree) if isinstance(node, ast.Call)
              and isinstance(node.func, ast.Attribute)}
    assert {"import_comfyui", "ensure_checkpoint"} <= called


def test_command_line(run, tmp_path, capsys):
    (tmp_path / "main.py").write_text("")
    with pytest.raises(SystemExit):   # one of --checkpoint / --make-checkpoint
        run.main(["--comfyui", str(tmp_path), "--out", str(tmp_path / "o.json")])
    with pytest.raises(SystemExit):
        run.main(["--comfyui", str(tmp_path), "--checkpoint", str(tmp_path / "main.py"),
                  "--make-checkpoint", str(tmp_path), "--out", str(tmp_path / "o.json")])
    with pytest.raises(SystemExit):   # --tiny is for a checkpoint this script writes
        run.main(["--comfyui", str(tmp_path), "--checkpoint", str(tmp_path / "main.py"), "--tiny",
                  "--out", str(tmp_path / "o.json")])
    assert "--tiny needs --make-checkpoint" in capsys.readouterr().err
