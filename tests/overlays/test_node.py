"""The ComfyUI node and prestartup script, without ComfyUI.

Faked: a ModelPatcher with the methods the node calls (clone, add_wrapper_with_key, remove_wrappers_with_key,
add_callback_with_key, remove_callbacks_with_key, `.model.diffusion_model`) and a WrapperExecutor-like object
(`class_obj` = the BaseModel holding `diffusion_model`, callable). The hook names fall back to ComfyUI's literal
values ("apply_model", "on_cleanup") when comfy.patcher_extension is not importable.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import json
import logging
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import blocks
import comfyui_fused_dit as node_pack
from comfy_fakes import FakeModelPatcher, call_model
from fused_dit import state
from fused_dit.integration.fp8_codes import Fp8CodesLinear

PRESTARTUP = Path(node_pack.__file__).with_name("prestartup_script.py")


class FakeExecutor:
    """Calls the model the way BaseModel._apply_model ends up calling diffusion_model."""

    def __init__(self, diffusion_model, inputs):
        self.class_obj = SimpleNamespace(diffusion_model=diffusion_model)
        self.inputs = inputs

    def __call__(self):
        with torch.no_grad():
            return self.class_obj.diffusion_model(**{k: v.clone() for k, v in self.inputs.items()})


def test_node_is_registered_with_model_in_and_out():
    node = node_pack.NODE_CLASS_MAPPINGS["FusedDiTOps"]
    required = node.INPUT_TYPES()["required"]
    assert required["model"] == ("MODEL",) and node.RETURN_TYPES == ("MODEL",)
    assert {"norm_rope", "adaln", "gate", "fp8_linear"} <= set(required)


def test_node_clones_and_wraps_apply_model_with_swap_and_restore():
    model, inputs = blocks.make_wan_stack()
    patcher = FakeModelPatcher(model)
    (patched,) = node_pack.FusedDiTOps().patch(patcher, norm_rope=True, adaln=True, gate=True, fp8_linear=True)
    assert patched is not patcher and not patcher.wrappers
    [wrapper] = patched.wrappers["apply_model"][node_pack.WRAPPER_KEY]
    seen_during_call = {}

    class SpyExecutor(FakeExecutor):
        def __call__(self):
            seen_during_call["overlay"] = "forward" in model.blocks[0].__dict__
            return super().__call__()

    out = wrapper(SpyExecutor(model, inputs))
    assert seen_during_call["overlay"]
    assert "forward" not in model.blocks[0].__dict__          # restored in finally
    assert (out - blocks.run(model, inputs)).abs().max() <= 1e-5 * out.abs().max()
    assert node_pack.WRAPPER_KEY in patched.callbacks["on_cleanup"]


def test_node_restores_forwards_when_the_model_call_raises():
    model, inputs = blocks.make_flux_stack()
    (patched,) = node_pack.FusedDiTOps().patch(FakeModelPatcher(model))
    [wrapper] = patched.wrappers["apply_model"][node_pack.WRAPPER_KEY]

    class FailingExecutor(FakeExecutor):
        def __call__(self):
            raise RuntimeError("sampling interrupted")

    with pytest.raises(RuntimeError, match="interrupted"):
        wrapper(FailingExecutor(model, inputs))
    assert all("forward" not in m.__dict__ for m in model.modules())


def test_node_leaves_a_model_it_does_not_know_stock_and_says_why_once(caplog, flash_first):
    """Never an exception inside a user's prompt: a model without Flux or Wan blocks (Qwen-Image, SD3, ...) keeps
    stock forwards in every block family, the node says why once, and the attention family (ComfyUI's attention
    seam, model-agnostic) still applies."""
    state.forget_said()
    unknown = torch.nn.Sequential(torch.nn.Linear(4, 4))
    x = torch.randn(2, 4)
    with caplog.at_level(logging.DEBUG, logger="fused_dit"):
        (patched,) = node_pack.FusedDiTOps().patch(FakeModelPatcher(unknown), fp8_linear=True, attention=True)
        (again,) = node_pack.FusedDiTOps().patch(FakeModelPatcher(unknown), fp8_linear=True)
        outputs = [call_model(p, x) for p in (patched, again, patched)]   # read at the first call of each
    said = [r.getMessage() for r in caplog.records if "supports ComfyUI's Flux" in r.getMessage()]
    assert len(said) == len(set(said)) == 2 and all("stock" in line and "Sequential" in line for line in said)
    assert any(line.startswith("Fused DiT Ops: fp8_linear: stock") for line in said)
    [line] = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert line == ("Fused DiT Ops on Sequential: runs attention (fastest exact SDPA backend per shape, measured "
                    "once). Stock: norm_rope, adaln, gate (no Flux or Wan blocks); fp8_linear (no Flux or Wan "
                    "blocks, and no stack of blocks of one class). Details at DEBUG.")
    assert all(torch.equal(out, unknown(x)) for out in outputs) and "forward" not in unknown[0].__dict__
    assert "optimized_attention_override" in patched.model_options["transformer_options"]


def test_on_a_current_release_the_node_says_one_info_line_per_model_and_never_warns(caplog, flash_first,
                                                                                    monkeypatch):
    """ComfyUI's blocks are not the ones the block forwards were written for (era_blocks: a 2026-shaped Flux): the
    normal state of a current install. One INFO line says what runs, what stays stock and why in a few words; the
    long reasons (the differing code) are DEBUG; nothing is a WARNING."""
    import era_blocks
    from fused_dit.integration import eras
    monkeypatch.delenv("FUSED_DIT_SEAMS")             # the RoPE seam off, as shipped
    eras.clear_caches()
    model, inputs = era_blocks.make_flux(depth=2)
    with caplog.at_level(logging.DEBUG, logger="fused_dit"):
        for _ in range(2):
            (patched,) = node_pack.FusedDiTOps().patch(FakeModelPatcher(model), attention=True)
            call_model(patched, **inputs)
    info = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert info == [f"Fused DiT Ops on {type(model).__name__}: runs attention (fastest exact SDPA backend per shape, "
                    "measured once). Stock: norm_rope, adaln, gate (written for ComfyUI 0.3.64, "
                    "tests/overlays/blocks.py's blocks, not this release's). Off: fp8_linear. Details at DEBUG."]
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert any("differs from every release it was verified on" in line for line in debug)


@pytest.fixture
def first_use_work(monkeypatch):
    """Counts of the work that reads the model's blocks: fingerprinting a block's code (eras.block_match), the
    registry's recognition of the blocks, the install plans, the FP8 weight quantisations."""
    from fused_dit import registry
    from fused_dit.integration import eras
    from fused_dit.ops import fp8_linear
    import fused_dit.integration as integration

    eras.clear_caches()
    counts = {"fingerprint": 0, "recognition": 0, "plan": 0, "quantise": 0}

    def counted(owner, name, key):
        real = getattr(owner, name)

        def count(*args, **kwargs):
            counts[key] += 1
            return real(*args, **kwargs)
        monkeypatch.setattr(owner, name, count)
    counted(eras, "block_match", "fingerprint")
    counted(registry, "recognition", "recognition")
    counted(integration, "plan", "plan")
    counted(fp8_linear, "quantize_weight_fp8", "quantise")
    return counts


def test_the_nodes_run_reads_no_block_and_the_first_use_does_it_once(first_use_work, fp8_calls, caplog):
    """The node's run decides from cheap facts and wraps: no block is fingerprinted, planned or quantised. The
    sampler's first prepare_sampling puts the FP8 codes in the weights' place (before ComfyUI loads the clone),
    its first model call reads the blocks and says the model's line; later calls and samplings do neither again."""
    from test_fp8_codes import LifecyclePatcher

    model, inputs = blocks.make_flux_stack(dtype=torch.bfloat16)
    state.forget_said()
    with caplog.at_level(logging.INFO, logger="fused_dit"):
        (patched,) = node_pack.FusedDiTOps().patch(LifecyclePatcher(model), fp8_linear=True)
        assert first_use_work == {"fingerprint": 0, "recognition": 0, "plan": 0, "quantise": 0}
        assert not patched.object_patches and not caplog.records
        patched.sample(inputs)
        first = dict(first_use_work)
        assert first["fingerprint"] and first["recognition"] == 1 and first["plan"]
        assert first["quantise"] == len(patched.object_patches) > 0           # codes in place, once per Linear
        assert sum(isinstance(m, Fp8CodesLinear) for m in model.modules()) == len(patched.object_patches)
        for _ in range(2):
            patched.sample(inputs)
    assert first_use_work["recognition"] == 1 and first_use_work["quantise"] == first["quantise"]
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Fused DiT Ops on ")]
    assert said == ["Fused DiT Ops on Flux: runs norm_rope, adaln, gate (fused Triton kernels); fp8_linear (FP8 "
                    "Linears, codes in the weights' place). Stock: attention (no SDPA order to change). Details at "
                    "DEBUG."]
    [cleanup] = patched.callbacks["on_cleanup"][node_pack.WRAPPER_KEY]
    cleanup(patched)                                          # ComfyUI cleans the clone up: FP8 copies dropped
    assert not any(getattr(m, "_fused_dit_install_plans", None) for m in model.modules())


def test_each_model_is_read_once_when_two_threads_make_its_first_call(monkeypatch):
    """Two samplers on ComfyUI's executor threads: one reads the model, the other waits for what it read. (The
    calls themselves are stubbed: the Triton interpreter of a CPU run is not for two threads.)"""
    from fused_dit import registry

    model, _ = blocks.make_wan_stack()
    (patched,) = node_pack.FusedDiTOps().patch(FakeModelPatcher(model))
    [wrapper] = patched.wrappers["apply_model"][node_pack.WRAPPER_KEY]
    monkeypatch.setattr(registry, "enabled", lambda *a, **kw: contextlib.nullcontext())
    settled, started, errors = [], threading.Barrier(2), []
    real = registry.settle

    def slow_settle(decision, diffusion_model=None):
        settled.append(diffusion_model)
        time.sleep(0.2)                                     # the other thread arrives meanwhile
        return real(decision, diffusion_model)
    monkeypatch.setattr(registry, "settle", slow_settle)

    def call(diffusion_model):
        run = lambda: "called"                              # noqa: E731
        run.class_obj = SimpleNamespace(diffusion_model=diffusion_model)
        return wrapper(run)

    def first_call():
        started.wait()
        try:
            assert call(model) == "called"
        except BaseException as error:                      # noqa: BLE001 (reported below)
            errors.append(error)
    threads = [threading.Thread(target=first_call) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and settled == [model]
    other, _ = blocks.make_wan_stack()                      # a second model under the same wrapper: its own once
    call(other)
    call(model)
    assert settled == [model, other]


def test_a_failure_at_the_first_call_leaves_that_model_stock_and_is_said_once(monkeypatch, caplog):
    """Never an exception inside a user's prompt: what the first call does for the node fails (here, reading the
    blocks), the model runs ComfyUI's own forwards on this call and the next, one WARNING says why."""
    from fused_dit import registry

    model, inputs = blocks.make_flux_stack()
    stock = call_model(FakeModelPatcher(model), **inputs)
    (patched,) = node_pack.FusedDiTOps().patch(FakeModelPatcher(model))
    monkeypatch.setattr(registry, "recognition", lambda *a, **kw: 1 / 0)
    enables = []
    monkeypatch.setattr(registry, "_enable", lambda *a, **kw: enables.append(a))
    state.forget_said()
    with caplog.at_level(logging.WARNING, logger="fused_dit"):
        outputs = [call_model(patched, **inputs) for _ in range(2)]
    assert all(torch.equal(out, stock) for out in outputs) and not enables
    [line] = [r.getMessage() for r in caplog.records]
    assert line == ("Fused DiT Ops on Flux: stock, the node's setup at the model's first use failed "
                    "(ZeroDivisionError: division by zero)")


def test_a_failure_putting_codes_in_place_leaves_the_clone_as_it_was_and_the_model_stock(fp8_calls, monkeypatch,
                                                                                         caplog):
    from fused_dit.ops import fp8_linear
    from test_fp8_codes import LifecyclePatcher

    model, inputs = blocks.make_flux_stack(dtype=torch.bfloat16)
    base = LifecyclePatcher(model)
    stock = base.sample(inputs)
    (patched,) = node_pack.FusedDiTOps().patch(base, norm_rope=False, adaln=False, gate=False, fp8_linear=True)
    quantised = []

    def failing(weight):
        if quantised:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        quantised.append(weight)
        return real(weight)
    real = fp8_linear.quantize_weight_fp8
    monkeypatch.setattr(fp8_linear, "quantize_weight_fp8", failing)
    state.forget_said()
    with caplog.at_level(logging.WARNING, logger="fused_dit"):
        out = patched.sample(inputs)
        patched.sample(inputs)
    assert not patched.object_patches and patched.size == base.size          # none of the codes registered
    assert torch.equal(out, stock) and not fp8_calls
    assert [r.getMessage() for r in caplog.records] == [
        "Fused DiT Ops on Flux: stock, the node's setup at the model's first use failed (OutOfMemoryError: CUDA "
        "out of memory)"]


def test_the_description_names_attention_first_and_the_fused_kernels_by_their_era():
    description = node_pack.FusedDiTOps.DESCRIPTION
    assert description.index("Attention") < description.index("Fused Triton kernels")
    assert "only on the block code they were written for (ComfyUI 0.3.64)" in description
    assert "Optional" in description and "FP8" in description


def _defaults() -> dict:
    inputs = node_pack.FusedDiTOps.INPUT_TYPES()
    return {name: spec[1]["default"] for group in ("required", "optional") for name, spec in inputs[group].items()
            if spec[0] == "BOOLEAN"}


def _loaded_flux_layers(monkeypatch, module) -> None:
    """A ComfyUI whose comfy.ldm.flux.layers is `module` (the node reads the loaded blocks' code, no torch)."""
    monkeypatch.setitem(sys.modules, "comfy.ldm.flux.layers", module)


def test_toggles_of_families_that_cannot_run_on_the_loaded_comfyui_default_off(monkeypatch, cudnn_first):
    import era_blocks
    from fused_dit.integration import eras
    monkeypatch.delenv("FUSED_DIT_SEAMS")             # the RoPE seam off, as shipped
    eras.clear_caches()
    _loaded_flux_layers(monkeypatch, era_blocks)      # 2026-shaped blocks: no block forward's code
    assert _defaults() == {"norm_rope": False, "adaln": False, "gate": False, "fp8_linear": False,
                           "attention": False}    # cuDNN first: the attention override gains nothing
    monkeypatch.setenv("FUSED_DIT_SEAMS", "rope_ck_seam")
    assert _defaults()["norm_rope"] is True           # the RoPE seam asked for: it may run


def test_toggles_keep_their_defaults_where_the_family_may_run_or_no_comfyui_is_loaded(monkeypatch, flash_first):
    from fused_dit.integration import eras
    eras.clear_caches()
    _loaded_flux_layers(monkeypatch, blocks)          # the fixture era: verified blocks
    assert _defaults() == {"norm_rope": True, "adaln": True, "gate": True, "fp8_linear": False, "attention": True}
    monkeypatch.delitem(sys.modules, "comfy.ldm.flux.layers")
    monkeypatch.delitem(sys.modules, "comfy.ops")
    assert _defaults() == {"norm_rope": True, "adaln": True, "gate": True, "fp8_linear": False, "attention": True}


def test_node_with_every_toggle_off_adds_no_wrapper():
    model, _ = blocks.make_wan_stack()
    (patched,) = node_pack.FusedDiTOps().patch(FakeModelPatcher(model), False, False, False, False)
    assert not patched.wrappers.get("apply_model")


def test_where_nothing_runs_the_node_hands_back_the_model_it_was_given(cudnn_first):
    """On a model the block families do not know, with attention stock (a cuDNN-first release) and FP8 off, the
    node's defaults run nothing: the MODEL goes on as given, no clone, so sampling and loading are stock. After a
    node of its own upstream it still clones, to take that node's wrapper off."""
    given = FakeModelPatcher(torch.nn.Sequential(torch.nn.Linear(4, 4)))
    (out,) = node_pack.FusedDiTOps().patch(given)
    assert out is given
    model, _ = blocks.make_wan_stack()
    (wrapped,) = node_pack.FusedDiTOps().patch(FakeModelPatcher(model))
    assert wrapped.wrappers.get("apply_model")
    (after,) = node_pack.FusedDiTOps().patch(wrapped, False, False, False, False, attention=False)
    assert after is not wrapped and not after.wrappers.get("apply_model", {}).get("fused_dit")


def _load_prestartup():
    spec = importlib.util.spec_from_file_location("fused_dit_prestartup_under_test", PRESTARTUP)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------------------------------- real installs
REPO = Path(__file__).resolve().parents[2]


def _applier(*args) -> subprocess.CompletedProcess:
    missing = [name for name in ("click", "unidiff", "packaging", "filelock") if importlib.util.find_spec(name) is None]
    if missing:    # e.g. a GPU machine's interpreter, which has torch but not the applier's own packages
        pytest.skip(f"the applier's packages {missing} are not installed in this interpreter")
    return subprocess.run([sys.executable, "-m", "applier", *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


def _install_node(comfyui: Path) -> Path:
    folder = comfyui / "custom_nodes" / "comfyui_fused_dit"
    shutil.copytree(PRESTARTUP.parent, folder, ignore=shutil.ignore_patterns("__pycache__"))
    return folder / "prestartup_script.py"


def _start(script: Path) -> str:
    """What the prestartup script prints when ComfyUI runs it (its own folder as the working directory)."""
    proc = subprocess.run([sys.executable, "-I", str(script)], cwd=script.parent, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and proc.stdout == "", proc.stderr
    return proc.stderr


# (layout, --target relative to what build_comfy_tree returns, the ComfyUI folder relative to it, install root)
LAYOUTS = [("git", ".", ".", "."), ("git", "comfy_extras", ".", "."),
           ("portable", ".", "ComfyUI", "."), ("portable", "ComfyUI", "ComfyUI", ".")]


@pytest.mark.parametrize("layout, target, comfyui, root", LAYOUTS, ids=["git", "git-subfolder", "portable",
                                                                        "portable-inner"])
def test_prestartup_warns_where_a_real_apply_wrote_its_state(tmp_path, layout, target, comfyui, root):
    from tests.fixtures.comfy_tree import build_comfy_tree

    built = build_comfy_tree(tmp_path / "install" / ("ComfyUI" if layout == "git" else ""), era="latest",
                             layout=layout)
    comfy, install = (built / comfyui).resolve(), (built / root).resolve()
    script = _install_node(comfy)
    stock = (comfy / "nodes.py").read_bytes()
    applied = _applier("apply", "--target", built / target, "--only", "comfyui/max-resolution",
                       "--only", "comfyui/pil-pixel-limit")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert (install / ".applier" / "state.json").is_file()
    assert _start(script) == ""                                       # applied and intact: nothing to say
    (comfy / "nodes.py").write_bytes(stock)                           # an update put the stock file back
    line = _start(script)
    assert line.count("\n") == 1
    assert "patches lost by an update: comfyui/max-resolution, comfyui/pil-pixel-limit" in line
    assert f"applier apply --target {install}" in line
    reverted = _applier("revert", "--target", install, "--force")
    assert reverted.returncode == 0, reverted.stdout + reverted.stderr
    assert _start(script) == ""                                       # nothing applied any more


def test_prestartup_never_stops_comfyui_on_a_hostile_state(tmp_path):
    from tests.fixtures.comfy_tree import build_comfy_tree

    comfy = build_comfy_tree(tmp_path / "ComfyUI", layout="git")
    script = _install_node(comfy)
    (comfy / ".applier").mkdir()
    for content in ("{not json", "[]", '{"applied": {"x": {"files": "nodes.py"}}}', "\udcff",
                    '{"format": 2, "applied": {"x": {"component": "comfyui", "files": [{"relpath": 7}]}}}'):
        (comfy / ".applier" / "state.json").write_text(content, encoding="utf-8", errors="surrogateescape")
        assert _start(script) == ""


# ---------------------------------------------------------------------------------------------- edge cases
def _state(comfyui: Path, files: dict[str, bytes], component="comfyui", seq=1, patch="comfyui/max-resolution"):
    return {patch: {"component": component, "seq": seq, "files": [
        {"relpath": name, "sha256_after": hashlib.sha256(data).hexdigest()} for name, data in files.items()]}}


def _write_state(root: Path, applied: dict, fmt: int = 2) -> None:
    (root / ".applier").mkdir(exist_ok=True)
    (root / ".applier" / "state.json").write_text(json.dumps({"format": fmt, "applied": applied}))


def test_prestartup_warns_once_when_a_patched_file_changed(tmp_path):
    prestartup = _load_prestartup()
    (tmp_path / "nodes.py").write_bytes(b"MAX_RESOLUTION = 32768\n")
    _write_state(tmp_path, _state(tmp_path, {"nodes.py": b"MAX_RESOLUTION = 32768\n"}))
    stream = io.StringIO()
    assert prestartup.warn_if_lost(tmp_path, stream) == [] and stream.getvalue() == ""
    (tmp_path / "nodes.py").write_bytes(b"MAX_RESOLUTION = 16384\n")   # an update put the original back
    assert prestartup.warn_if_lost(tmp_path, stream) == ["comfyui/max-resolution"]
    line = stream.getvalue()
    assert line.count("\n") == 1 and "lost by an update" in line and f"applier apply --target {tmp_path}" in line


def test_prestartup_reads_format_1_absolute_paths(tmp_path):
    prestartup = _load_prestartup()
    (tmp_path / "nodes.py").write_bytes(b"MAX_RESOLUTION = 16384\n")
    applied = {"comfyui/max-resolution": {"seq": 1, "files": [
        {"path": str(tmp_path / "nodes.py"), "sha256_after": hashlib.sha256(b"MAX_RESOLUTION = 32768\n").hexdigest()}]}}
    _write_state(tmp_path, applied, fmt=1)
    assert prestartup.warn_if_lost(tmp_path, io.StringIO()) == ["comfyui/max-resolution"]


@pytest.mark.parametrize("relpath", ["../outside.py", "/etc/hostname", "C:\\Windows\\win.ini", "sub/../../x"])
def test_prestartup_reads_no_file_outside_the_comfyui_folder(tmp_path, relpath):
    prestartup = _load_prestartup()
    comfy = tmp_path / "ComfyUI"
    comfy.mkdir()
    (tmp_path / "outside.py").write_bytes(b"changed")
    _write_state(comfy, _state(comfy, {relpath: b"what applier wrote"}))
    assert prestartup.warn_if_lost(comfy, io.StringIO()) == []


def test_prestartup_leaves_torch_files_alone(tmp_path):
    # relative to site-packages, which the script does not know: never looked up under the ComfyUI folder
    prestartup = _load_prestartup()
    (tmp_path / "torch" / "cuda").mkdir(parents=True)
    (tmp_path / "torch" / "cuda" / "streams.py").write_bytes(b"changed")
    _write_state(tmp_path, _state(tmp_path, {"torch/cuda/streams.py": b"patched"}, component="torch",
                                  patch="torch/stream-priority"))
    assert prestartup.warn_if_lost(tmp_path, io.StringIO()) == []


@pytest.mark.parametrize("content", [None, "{not json", "[]", '{"applied": {"x": {"files": [{"path": 1}]}}}'])
def test_prestartup_is_silent_without_a_readable_state(tmp_path, content):
    prestartup = _load_prestartup()
    if content is not None:
        (tmp_path / ".applier").mkdir()
        (tmp_path / ".applier" / "state.json").write_text(content)
    stream = io.StringIO()
    assert prestartup.warn_if_lost(tmp_path, stream) == [] and stream.getvalue() == ""


def test_prestartup_is_silent_when_two_patches_share_a_file(tmp_path):
    # max-resolution then pil-pixel-limit both edit nodes.py: the first one's sha256_after is no longer the file's,
    # the later one's (by seq) is; nothing was lost.
    prestartup = _load_prestartup()
    first, second = b"MAX_RESOLUTION = 40960\n", b"MAX_RESOLUTION = 40960\nImage.MAX_IMAGE_PIXELS = 1\n"
    (tmp_path / "nodes.py").write_bytes(second)
    _write_state(tmp_path, {**_state(tmp_path, {"nodes.py": second}, seq=2, patch="comfyui/pil-pixel-limit"),
                            **_state(tmp_path, {"nodes.py": first}, seq=1)})
    stream = io.StringIO()
    assert prestartup.warn_if_lost(tmp_path, stream) == [] and stream.getvalue() == ""
    (tmp_path / "nodes.py").write_bytes(b"MAX_RESOLUTION = 16384\n")
    assert prestartup.warn_if_lost(tmp_path, stream) == ["comfyui/max-resolution", "comfyui/pil-pixel-limit"]
