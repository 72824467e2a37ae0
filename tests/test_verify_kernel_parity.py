"""kernel-parity: the probe imports the overlay as installed in the target's interpreter and checks its kernels.

The cases are the installed package's (`fused_dit.parity.parity_cases`). Without a GPU the probe runs the small fp32
cases under TRITON_INTERPRET=1; a case whose op ran its eager reference instead of the kernel is skipped, so an
all-eager run is a SKIP, never a PASS.
"""
from __future__ import annotations

import site
import subprocess
import sys
from pathlib import Path

import pytest

from applier.resources import OVERLAYS_DIR, load_verify
from applier.target import Target

verify = load_verify()
Outcome = verify.Outcome


def target_with(python: Path, tmp_path: Path) -> Target:
    return Target(root=tmp_path, layout="python-env", comfyui_root=None, comfyui_version=None,
                  comfyui_version_source="unknown", comfyui_commit=None, python=python, python_source="--python",
                  python_version=None, site_packages=tmp_path, torch_version="2.13.0+cpu", torch_cuda=None,
                  triton_version="3.9.0")


def venv_with_overlay(root: Path, overlay_dir: Path) -> Path:
    """A venv whose site-packages reach torch and the overlay packages under `overlay_dir`; returns its python."""
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")
    purelib = subprocess.run([str(python), "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    # .pth lines are honoured in isolated mode too, as an installed package would be.
    Path(purelib, "applier_test_overlay.pth").write_text(
        "\n".join([*site.getsitepackages(), str(overlay_dir)]) + "\n")
    return python


@pytest.fixture(scope="module")
def overlay_python(tmp_path_factory) -> Path:
    """An interpreter where fused_dit is installed."""
    return venv_with_overlay(tmp_path_factory.mktemp("target"), OVERLAYS_DIR)


def parity(python: Path, tmp_path: Path, device: str = "cpu"):
    options = verify.VerifyOptions(target=target_with(python, tmp_path), catalog=[], device=device, kernels=True,
                                   only=("kernel-parity",), kernel_timeout=600)
    (result,) = verify.run_verify(options)
    return result


def test_overlay_not_installed_is_a_skip(tmp_path):
    # This interpreter has torch but not fused_dit (in isolated mode nothing adds the repository's overlays/).
    result = parity(Path(sys.executable), tmp_path)
    assert result.outcome is Outcome.SKIP, result.reason
    assert "fused_dit is not installed" in result.reason


@pytest.mark.slow
def test_kernels_run_under_the_interpreter_and_match_both_references(overlay_python, tmp_path):
    result = parity(overlay_python, tmp_path)
    assert result.outcome is Outcome.PASS, (result.reason, result.stderr)
    numbers = result.numbers
    assert numbers["triton_interpret"] is True and numbers["device"] == "cpu"
    assert numbers["cases_from"] == "fused_dit.parity.parity_cases"
    ran = [case for case in numbers["cases"] if case["status"] == "passed"]
    assert ran and all(case["backend"] == "triton" for case in ran)
    assert {case["op"] for case in ran} >= {"rms_rope_flux", "rms_rope_wan", "rms_norm_wan", "adaln", "gate_add_wan",
                                            "gate_add_flux"}
    assert all("max_abs_diff" in case for case in ran)
    assert {case["gate_kind"] for case in ran if case["family"] != "attention_fp8"} == {"fp32"}
    # the FP8 attention kernel runs on the interpreter too (it rounds to e4m3's grid itself there)
    assert [case["gate_kind"] for case in ran if case["family"] == "attention_fp8"] == ["fp8_attention"]
    fp8 = [case for case in numbers["cases"] if case["family"] in ("quantize_fp8", "gelu_quantize_fp8", "fp8_linear")]
    assert fp8 and all(case["status"] == "skipped" and "interpreter" in case["reason"] for case in fp8)
    assert numbers["summary"] == {"passed": len(ran), "failed": 0, "skipped": len(fp8)}


@pytest.mark.slow
def test_ops_that_fall_back_to_eager_are_skipped_not_passed(overlay_python, tmp_path, monkeypatch):
    monkeypatch.setenv("FUSED_DIT_BACKEND", "eager")
    result = parity(overlay_python, tmp_path)
    assert result.outcome is Outcome.SKIP, result.reason
    assert "ran eager" in result.reason
    assert verify.summarize([result])["PASS"] == 0


def test_installed_overlay_without_parity_cases_is_a_skip(tmp_path):
    """An older fused_dit (no fused_dit.parity) installed in the target: the probe has no cases of its own."""
    import shutil
    old_overlay = tmp_path / "old_overlay"
    shutil.copytree(OVERLAYS_DIR / "fused_dit", old_overlay / "fused_dit",
                    ignore=shutil.ignore_patterns("parity.py", "__pycache__"))
    python = venv_with_overlay(tmp_path, old_overlay)
    result = parity(python, tmp_path)
    assert result.outcome is Outcome.SKIP, result.reason
    assert "no parity cases" in result.reason and "reinstall" in result.reason


def test_cuda_requested_without_cuda_fails(overlay_python, tmp_path):
    pytest.importorskip("torch")
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    result = parity(overlay_python, tmp_path, device="cuda")
    assert result.outcome is Outcome.FAIL
    assert "cuda" in result.reason
