"""The measuring kit's plumbing (benchmarks/): its one entry point, how a release is read and started, how a model is
built, how a result is written and indexed, and that the committed results still read as the kit writes them.

The commands themselves need ComfyUI and a GPU; these tests take files, dicts and strings (one runs a sweep)."""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import comfy_release, fp8_eras, generation, models, results
from benchmarks.__main__ import COMMANDS, main
from tests.fixtures.comfy_tree import ERAS, build_comfy_tree, tree_files

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"


# ------------------------------------------------------------------------------------------------ entry point
def command_lines():
    for name, target in COMMANDS.items():
        yield from ([[name]] if isinstance(target, tuple) else [[name, mode] for mode in target])


@pytest.mark.parametrize("words", list(command_lines()), ids=" ".join)
def test_every_command_has_help(words, capsys):
    with pytest.raises(SystemExit) as done:
        main([*words, "--help"])
    assert done.value.code == 0 and "usage: python -m benchmarks" in capsys.readouterr().out


def test_no_module_but_the_entry_point_edits_sys_path():
    edits = re.compile(r"sys\.path\s*(\.\s*(insert|append|extend)|\[|\+?=)")
    offenders = [f"{path.relative_to(REPO)}:{number}" for folder in ("benchmarks", "scripts")
                 for path in sorted((REPO / folder).glob("*.py")) if path.name != "__main__.py"
                 for number, line in enumerate(path.read_text().splitlines(), 1) if edits.search(line)]
    assert offenders == []


def test_building_the_commands_imports_neither_torch_nor_comfyui():
    """The generation command starts ComfyUI before torch (main.py's cuda_malloc and comfy-aimdo must come first)."""
    code = ("import sys; from benchmarks.__main__ import build_parser; build_parser(); "
            "print(sorted(m for m in ('torch', 'comfy', 'triton') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_command_runs_with_its_import_paths_in_front(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(generation, "run", lambda options, parser: seen.append(sys.path[:2]) or 0)
    assert main(["generation", "--comfyui", str(tmp_path), "--out", str(tmp_path / "x.json")]) == 0
    assert seen == [[str(tmp_path.resolve()), str(REPO / "overlays")]]


# ------------------------------------------------------------------------------------------- results: writing
def test_a_result_names_no_folder_of_the_machine_that_wrote_it(tmp_path):
    report = {"cmd": f"{REPO}/x --work /tmp/w /root/cache", f"{REPO}/key": ["/home/me/data", "/tmpfoo"]}
    path = results.write_json(report, tmp_path, "kind")
    assert path == tmp_path / "kind.json" and not list(tmp_path.glob("*.partial"))
    assert json.loads(path.read_text()) == {"cmd": "REPO/x --work TMP/w HOME/cache",
                                            "REPO/key": ["HOME/data", "/tmpfoo"]}


def test_a_result_names_no_virtual_environment_of_the_machine_that_wrote_it(tmp_path, monkeypatch):
    """The device machine runs from /opt/torch/.venv: its site-packages paths become VENV/..."""
    monkeypatch.setattr(results, "_VENV", "/opt/torch/.venv")
    path = results.write_json({"files": ["/opt/torch/.venv/lib/python3.12/site-packages/fused_dit/x.py",
                                         "/opt/torch/.venvs/other"]}, tmp_path, "kind")
    assert json.loads(path.read_text()) == {"files": ["VENV/lib/python3.12/site-packages/fused_dit/x.py",
                                                      "/opt/torch/.venvs/other"]}


def test_a_table_of_cases_is_one_line_per_case():
    text = results.dumps({"runs": [{"config": f"c{i}", "s_per_step": 0.1 * i, "note": "x" * 40} for i in range(3)]})
    assert [line.strip()[:14] for line in text.splitlines()] == \
        ["{", '"runs": [', *(f'{{"config": "c{i}' for i in range(3)), "]", "}"]


def test_the_command_is_recorded_as_typed_at_the_repository_root(monkeypatch):
    monkeypatch.delenv("PYTHONPATH", raising=False)
    argv = [str(REPO / "benchmarks" / "__main__.py"), "generation", "--out", f"{REPO}/out.json"]
    assert results.command_line(argv) == "python -m benchmarks generation --out REPO/out.json"


def test_the_results_index_is_current_and_describes_every_file(capsys):
    assert results.run(argparse.Namespace(check=True)) == 0, capsys.readouterr().err


def test_a_deeper_report_asks_for_more_levels_one_member_per_line():
    report = {"eras": [{"check": {"models": [{"model": f"m{i}", "note": "x" * 60} for i in range(2)]}}]}
    assert results.dumps(report).count("\n") == 4                      # each era one line, however large
    deep = results.dumps(report, expanded_depth=5)
    assert json.loads(deep) == report and [line.strip()[:11] for line in deep.splitlines()][5:7] == \
        ['{"model": "', '{"model": "']                               # one line per model


def test_results_keep_within_their_rule():
    """At most 40 files in benchmarks/results/ and under 15% of the repository's tracked lines (issue 39)."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True)
    if listed.returncode or not listed.stdout:
        pytest.skip("not a git checkout")
    tracked = [REPO / name for name in listed.stdout.split("\0") if name and (REPO / name).is_file()]
    lines = {path: path.read_bytes().count(b"\n") for path in tracked}
    in_results = [path for path in tracked if RESULTS in path.parents]
    assert len(in_results) <= 40, len(in_results)
    share = sum(lines[path] for path in in_results) / sum(lines.values())
    assert share < 0.15, f"{share:.1%} of the tracked lines"


# ----------------------------------------------------------------------------- a release, read from its files
def write_release(root: Path, *, version: str, dynamic: bool, eval_in_base: bool, txt_ids: bool) -> Path:
    (root / "comfy" / "ldm" / "flux").mkdir(parents=True)
    (root / "comfyui_version.py").write_text(f'__version__ = "{version}"\n')
    aimdo = ["import comfy_aimdo.control", "comfy.model_patcher.CoreModelPatcher = ModelPatcherDynamic"]
    main_py = ["import cuda_malloc"] + (aimdo if dynamic else [])
    (root / "main.py").write_text("\n".join(main_py) + "\n")
    base = ["class BaseModel(torch.nn.Module):", "    def __init__(self):", "        self.diffusion_model = m()"]
    base += ["        self.diffusion_model.eval()"] if eval_in_base else []
    base += ["", "class Other(BaseModel):", "    def __init__(self):", "        self.diffusion_model.eval()"]
    (root / "comfy" / "model_base.py").write_text("\n".join(base) + "\n")
    fields = ["class FluxParams:", "    in_channels: int"] + (["    txt_ids_dims: list"] if txt_ids else [])
    (root / "comfy" / "ldm" / "flux" / "model.py").write_text("\n".join(fields + ["", "class Flux:", "    x = 1"]))
    return root


def test_each_eras_release_as_its_files_describe_it(tmp_path):
    old = comfy_release.read_release(write_release(tmp_path / "old", version="0.3.64", dynamic=False,
                                                   eval_in_base=False, txt_ids=False))
    assert (old.version, old.dynamic_vram, old.eval_in_base_model, old.flux_txt_ids_dims) == \
        ("0.3.64", False, False, False)
    tree = write_release(tmp_path / "new", version="0.33.0", dynamic=True, eval_in_base=True, txt_ids=True)
    (tree / "REVISION").write_text("0123abcd\n2026-08-21 01:16:29 -0700\n")
    new = comfy_release.read_release(tree)
    assert (new.version, new.dynamic_vram, new.eval_in_base_model, new.flux_txt_ids_dims) == \
        ("0.33.0", True, True, True)
    assert (new.commit, new.as_dict()["comfyui_version"]) == ("0123abcd", "0.33.0")
    assert comfy_release.read_release(tmp_path).version is None


@pytest.mark.parametrize("dynamic, disable, device, torch_version, mode", [
    (True, False, "cuda", (2, 11), "dynamic"), (True, True, "cuda", (2, 11), "legacy"),
    (True, False, "cpu", (2, 11), "legacy"), (True, False, "cuda", (2, 7), "legacy"),
    (False, False, "cuda", (2, 11), "legacy")])
def test_the_vram_mode_follows_main_py(dynamic, disable, device, torch_version, mode):
    release = comfy_release.Release("0.33.0", None, None, dynamic, True, True)
    got, why = comfy_release.vram_mode(release, device, disable, torch_version)
    assert got == mode and why


def test_checkpoint_keys_are_spelt_as_the_released_files_spell_them():
    key = comfy_release.checkpoint_key
    assert key("double_blocks.0.img_attn.norm.query_norm.weight", "flux") == \
        "double_blocks.0.img_attn.norm.query_norm.scale"
    assert key("txt_norm.weight", "qwen_image") == key("model.diffusion_model.txt_norm.weight", "qwen_image") == \
        "model.diffusion_model.txt_norm.weight"
    assert key("img_in.weight", "qwen_image21") == "model.diffusion_model.img_in.weight"
    assert key("blocks.0.self_attn.norm_q.weight", "wan") == "blocks.0.self_attn.norm_q.weight"
    tag = comfy_release.key_format_tag
    assert tag(["a.weight", "b.scale"]) == tag(["b.scale", "a.weight"]) != tag(["a.weight", "b.weight"])


# ------------------------------------------------------------------------------------------------ the models
def test_a_tiny_model_only_loses_what_comfyuis_detection_does_not_fix():
    assert list(models.MODELS) == ["flux-dev", "wan2.1-t2v-14b", "qwen-image", "qwen-image-2.1", "flux2-dev", "z-image",
                                   "wan2.2-t2v-14b"]
    for spec in models.MODELS.values():
        assert spec.model_class and spec.tiny_text_tokens < spec.text_tokens
    # Qwen-Image 2.1's detection reads every argument from the weights; the head stays 128 (the default rope axes)
    # and the latent's 64 channels stay
    shrunk = ("num_layers", "num_attention_heads", "context_in_dim")
    spec = models.MODELS["qwen-image-2.1"]
    assert (spec.family, spec.model_class) == ("qwen_image21", "QwenImage21")
    assert {k: v for k, v in spec.tiny.items() if k not in shrunk} == \
        {k: v for k, v in spec.full.items() if k not in shrunk}
    assert all(spec.tiny[k] < spec.full[k] for k in shrunk) and spec.tiny["num_layers"] > 1
    for key, depth in (("flux-dev", ("depth", "depth_single_blocks")), ("qwen-image", ("num_layers",))):
        spec = models.MODELS[key]
        assert {k: v for k, v in spec.tiny.items() if k not in depth} == \
            {k: v for k, v in spec.full.items() if k not in depth}


def test_the_sampling_commands_share_their_arguments():
    parser = argparse.ArgumentParser()
    models.add_model_arguments(parser, models="flux-dev", steps=3, warmup_steps=1)
    options = parser.parse_args(["--comfyui", "C", "--models", "flux-dev,qwen-image", "--tiny",
                                 "--resolutions", "64x64", "--out", "o.json"])
    models.check_model_arguments(options, parser)
    assert (options.models, options.device) == (["flux-dev", "qwen-image"], "cpu")
    assert models.resolutions_of(models.MODELS["flux-dev"], options) == [(64, 64)]
    with pytest.raises(SystemExit):
        models.check_model_arguments(parser.parse_args(["--comfyui", "C", "--models", "sdxl", "--out", "o"]), parser)


def test_the_validation_points_run_only_when_named():
    parser = argparse.ArgumentParser()
    models.add_model_arguments(parser, models="flux-dev", steps=3, warmup_steps=1)

    def resolutions(model, *named):
        options = parser.parse_args(["--comfyui", "C", "--out", "o.json", "--resolutions", ",".join(named)])
        models.check_model_arguments(options, parser)
        return [models.resolution_name(r) for r in models.resolutions_of(models.MODELS[model], options)]
    assert "4096x4096" not in resolutions("flux-dev")
    assert resolutions("flux-dev", "4096x4096") == ["4096x4096"]
    assert resolutions("wan2.1-t2v-14b", "480x832x33", "480x832x81") == ["480x832x33", "480x832x81"]


# ------------------------------------------------------------------------------------- the canvas pipeline
def test_the_canvas_pipeline_times_each_node_from_the_servers_messages():
    from benchmarks import canvas_pipeline
    events = [(10.0, "execution_start", {"prompt_id": "p"}), (10.1, "executing", {"node": "2", "prompt_id": "p"}),
              (10.2, "executing", {"node": "3", "prompt_id": "p"}), (14.2, "executing", {"node": "4", "prompt_id": "p"}),
              (15.0, "executing", {"node": None, "prompt_id": "p"}), (15.0, "execution_success", {"prompt_id": "p"}),
              (12.0, "executing", {"node": "9", "prompt_id": "other"})]
    samples = [(10.15, 1 << 30, None), (11.0, 3 << 30, 2 << 30), (13.0, 5 << 30, 1 << 30), (14.5, 4 << 30, None)]
    nodes = canvas_pipeline.node_timeline(events, samples, "p", 10.0)
    assert [(n["node"], n["seconds"]) for n in nodes] == [("2", 0.1), ("3", 4.0), ("4", 0.8)]
    assert (nodes[1]["peak_rss_gib"], nodes[1]["peak_gpu_used_gib"]) == (5.0, 2.0)
    assert nodes[2]["peak_gpu_used_gib"] is None


def test_the_canvas_pipeline_names_the_node_a_server_refused_and_its_message():
    from benchmarks import canvas_pipeline
    prompt = canvas_pipeline.prompt_a(32768, 18432, "vae.safetensors", 1024, 64, "x")
    refusal = {"error": {"message": "Prompt outputs failed validation"},
               "node_errors": {"2": {"class_type": "EmptySD3LatentImage", "errors": [
                   {"message": "Value 32768 bigger than max of 16384", "details": "width"}]}}}
    refused = canvas_pipeline.refusal_nodes(refusal, prompt)
    assert refused == [{"node": "2", "class_type": "EmptySD3LatentImage",
                        "messages": ["Value 32768 bigger than max of 16384: width"]}]
    report = {"servers": {"stock": {"server_start": {"vram_mode": "dynamic"}, "prompts": [
        {"prompt": "A", "accepted": False, "refused_by": refused}]}, "patched": {"prompts": [
            {"prompt": "A", "accepted": True, "nodes": [{"node": "2", "class_type": "EmptySD3LatentImage", "ran": True,
                                                         "seconds": 0.1, "peak_rss_gib": 1, "peak_gpu_used_gib": 1}]}]}}}
    summary = canvas_pipeline.summarise(report)
    assert summary["stock_first_cap"]["class_type"] == "EmptySD3LatentImage" and summary["patched_every_node_ran"]


def test_the_canvas_pipeline_reads_a_pngs_size_without_pillow(tmp_path):
    from benchmarks import canvas_pipeline
    path = tmp_path / "a.png"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + (13).to_bytes(4, "big") + b"IHDR" + (32768).to_bytes(4, "big")
                     + (18432).to_bytes(4, "big") + bytes(5))
    assert canvas_pipeline.png_size(path) == (32768, 18432)
    path.write_bytes(b"not a png at all, twenty-four bytes")
    assert canvas_pipeline.png_size(path) is None


def test_a_release_without_a_models_code_says_so(monkeypatch):
    import types
    for name in ("comfy", "comfy.ldm"):
        package = types.ModuleType(name)
        package.__path__ = []
        monkeypatch.setitem(sys.modules, name, package)
    with pytest.raises(models.ModelUnavailable, match="no Qwen-Image model"):
        models.diffusion_model_class(models.MODELS["qwen-image"])
    with pytest.raises(models.ModelUnavailable, match="no Qwen-Image 2.1 model"):
        models.diffusion_model_class(models.MODELS["qwen-image-2.1"])



def fake_tree_for_the_qwen_image21_bridge(monkeypatch, detected):
    """Just the comfy modules the bridge touches: a tree whose detection returns `detected` for any weights."""
    import types

    def module(name, **attrs):
        m = types.ModuleType(name)
        m.__path__ = []
        m.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, m)
        return m

    class QwenImage:  # the tree's model_base.QwenImage: keeps what it was built around
        def __init__(self, model_config, model_type=None, device=None, unet_model=None):
            self.model_config, self.unet_model = model_config, unet_model

    class SupportedQwenImage:
        def __init__(self, unet_config):
            self.unet_config = unet_config

    class QwenImage21Transformer2DModel:
        pass

    comfy = module("comfy")
    comfy.latent_formats = module("comfy.latent_formats", LatentFormat=type("LatentFormat", (), {}))
    comfy.model_base = module("comfy.model_base", QwenImage=QwenImage,
                              ModelType=types.SimpleNamespace(FLUX="flux"))
    comfy.model_detection = module("comfy.model_detection",
                                   model_config_from_unet=lambda sd, prefix, *a, **k: detected)
    comfy.supported_models = module("comfy.supported_models", QwenImage=SupportedQwenImage)
    module("comfy.ldm")
    module("comfy.ldm.qwen_image21")
    module("comfy.ldm.qwen_image21.model", QwenImage21Transformer2DModel=QwenImage21Transformer2DModel)
    return comfy, QwenImage, QwenImage21Transformer2DModel


@pytest.mark.parametrize("detected", ["none", "generic"])
def test_the_qwen_image21_bridge_names_the_model_whatever_an_older_detection_returns(monkeypatch, detected):
    # an older tree's detection returns None, or a config of another model (the generic one the H200 run met)
    import types
    other = types.SimpleNamespace(unet_config={"image_model": "qwen_image"}) if detected == "generic" else None
    comfy, QwenImage, transformer = fake_tree_for_the_qwen_image21_bridge(monkeypatch, other)
    spec = models.MODELS["qwen-image-2.1"]
    original = comfy.model_detection.model_config_from_unet
    state_dict = {"model.diffusion_model." + k: None for k in models.QWEN_IMAGE21_KEYS}
    with models.qwen_image21_bridge(spec, tiny=True) as route:
        config = comfy.model_detection.model_config_from_unet(state_dict, "model.diffusion_model.")
        # weights of another model pass through as the tree named them
        assert comfy.model_detection.model_config_from_unet({}, "model.diffusion_model.") is other
    assert comfy.model_detection.model_config_from_unet is original
    assert route["model_route"].startswith("bridge") and route["bridge"] is models.QWEN_IMAGE21_BRIDGE
    assert config.unet_config["image_model"] == "qwen_image21"
    model = config.get_model(state_dict)
    # the class check in _load compares names: the bridge's model is QwenImage21, built on the tree's QwenImage
    assert type(model).__name__ == spec.model_class == "QwenImage21"
    assert isinstance(model, QwenImage) and model.unet_model is transformer


def test_the_qwen_image21_bridge_stays_out_where_the_tree_names_the_model(monkeypatch):
    import types
    newest = types.SimpleNamespace(unet_config={"image_model": "qwen_image21"})
    comfy, *_ = fake_tree_for_the_qwen_image21_bridge(monkeypatch, newest)
    state_dict = {"model.diffusion_model." + k: None for k in models.QWEN_IMAGE21_KEYS}
    with models.qwen_image21_bridge(models.MODELS["qwen-image-2.1"], tiny=True) as route:
        assert comfy.model_detection.model_config_from_unet(state_dict, "model.diffusion_model.") is newest
    assert route == {"model_route": "the tree's model detection"}


# ------------------------------------------------------------------------ the committed results, read back
def generation_files():
    return sorted(RESULTS.glob("generation-*.json"))


@pytest.mark.parametrize("path", generation_files(), ids=lambda p: p.name)
def test_every_committed_generation_run_is_one_the_kit_can_run_and_combine_again(path):
    report = json.loads(path.read_text())
    for run in report["runs"]:
        assert generation.parse_run_spec(run["run"]).name == run["run"]
    again = {generation.run_key(r): r["speedup_vs_stock"] for r in generation.combine([report])["runs"]}
    assert again == {generation.run_key(r): r["speedup_vs_stock"] for r in report["runs"]}


def test_combining_a_new_call_into_the_current_file_keeps_its_notes():
    run = {"model": "flux-dev", "resolution": "1024x1024", "weights": "bf16", "config": "stock",
           "model_mode": "as loaded", "s_per_step": 0.2, "comfyui_version": "0.33.0"}
    current = {"runs": [run], "notes": ["how the first call ran"], "repeats": [{"repeat_of": "runs[0]"}]}
    new_call = {"runs": [{**run, "resolution": "2048x2048", "s_per_step": 0.8}]}
    combined = generation.combine([current, new_call])
    assert combined["notes"] == ["how the first call ran"] and combined["repeats"] == [{"repeat_of": "runs[0]"}]
    assert generation.combine([combined, new_call])["notes"] == ["how the first call ran"]


def test_a_speedup_is_against_the_stock_of_its_own_call():
    def run(config, s, date):
        return {"model": "flux-dev", "resolution": "1024x1024", "weights": "bf16", "config": config,
                "model_mode": "as loaded", "s_per_step": s, "comfyui_version": "0.33.0", "date": date}
    first = {"runs": [run("stock", 0.2, "d1"), run("overlay_all", 0.1, "d1")]}
    second = {"runs": [run("stock", 0.1, "d2"), run("overlay_fp8", 0.2, "d2")]}
    speedups = {r["config"]: r["speedup_vs_stock"] for r in generation.combine([first, second])["runs"]}
    assert speedups == {"stock": 1.0, "overlay_all": 2.0, "overlay_fp8": 0.5}


def test_a_call_on_another_gpu_adds_its_runs_beside_and_never_replaces_or_prices_them():
    def run(config, s):
        return {"model": "flux-dev", "resolution": "4096x4096", "weights": "bf16", "config": config,
                "model_mode": "as loaded", "s_per_step": s, "comfyui_version": "0.33.0"}
    h200 = {"environment": {"gpu": "NVIDIA H200"}, "runs": [run("stock", 10.0), run("node_defaults", 5.0)]}
    h100 = {"environment": {"gpu": "NVIDIA H100 80GB HBM3"}, "runs": [run("stock", 12.0), run("node_defaults", 8.0)]}
    runs = generation.combine([h200, h100])["runs"]
    assert {(r["gpu"], r["config"]): r["speedup_vs_stock"] for r in runs} == {
        ("NVIDIA H200", "stock"): 1.0, ("NVIDIA H200", "node_defaults"): 2.0,
        ("NVIDIA H100 80GB HBM3", "stock"): 1.0, ("NVIDIA H100 80GB HBM3", "node_defaults"): 1.5}
    from benchmarks import budget as budget_check
    assert [budget_check.on_calibrated_gpu(r) for r in runs] == [True, True, False, False]


def test_the_shipped_mixed_precision_fp8_eras_are_the_ones_fp8_eras_json_verified():
    seam = json.loads((REPO / "overlays" / "fused_dit" / "variants.json").read_text())["variants"]["linear_fp8_seam"]
    trees = json.loads((RESULTS / "fp8-eras.json").read_text())["trees"]
    for label, prints in seam["verified_on"].items():
        version, _, kind = label.partition(":")
        if kind:
            assert fp8_eras.mixed_checks_passed(trees[version]) is None
            assert list(prints.values()) == [trees[version]["linear_forward_fingerprints"][kind]]


# ------------------------------------------------------------------------------------ a validate mode, end to end
def commit_era(comfy: Path, era: str, tag: str | None) -> None:
    for rel, text in tree_files(ERAS[era]).items():
        (comfy / rel).parent.mkdir(parents=True, exist_ok=True)
        (comfy / rel).write_text(text)
    git = ["git", "-C", str(comfy), "-c", "user.email=t@t", "-c", "user.name=t", "-c", "commit.gpgsign=false",
           "-c", "tag.gpgsign=false"]
    subprocess.run([*git, "add", "-A"], check=True, capture_output=True)
    subprocess.run([*git, "commit", "-qm", era], check=True, capture_output=True)
    if tag:
        subprocess.run([*git, "tag", tag], check=True, capture_output=True)


@pytest.mark.slow
def test_the_comfyui_sweep_runs_the_cli_on_every_export_and_writes_its_json(tmp_path):
    comfy = build_comfy_tree(tmp_path / "mirror", era="2023-06", layout="git")
    commit_era(comfy, "0.3.43", "v0.3.43")
    commit_era(comfy, "0.38", None)             # a version bump without a tag: still a release commit
    out = tmp_path / "sweep.json"
    done = subprocess.run([sys.executable, "-m", "benchmarks", "validate", "comfyui-sweep", "--mirror",
                           str(comfy / ".git"), "-n", "1", "--work", str(tmp_path / "work"), "--out", str(out)],
                          capture_output=True, text=True, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    trees = {row["version"]: row for row in report["trees"]}
    assert set(trees) == {None, "0.3.43", "0.38.1"} and trees["0.38.1"]["tag"] == "v0.38.1"
    assert trees["0.38.1"]["patches"]["comfyui/oom-retry"]["variant"] == "async-execute-try-finally"
    assert all(row["byte_identical"] and row["outcome"] == "ok" for row in report["trees"])
    assert report["environment"]["command"].startswith("python -m benchmarks validate comfyui-sweep")
    assert str(tmp_path) not in out.read_text()


def test_node_defaults_hands_the_node_every_input_at_its_declared_default():
    sys.path.insert(0, str(REPO / "overlays"))
    try:
        import comfyui_fused_dit as node_pack
        from benchmarks import generation_configs
        input_types = node_pack.FusedDiTOps.INPUT_TYPES()
        offered = generation_configs.node_families(input_types)
        inputs, absent = generation_configs.node_inputs("node_defaults", offered, input_types)
    finally:
        sys.path.remove(str(REPO / "overlays"))
    declared = {**input_types["required"], **input_types["optional"]}
    assert absent == [] and set(inputs) == set(declared) - {"model"}
    assert all(inputs[name] == declared[name][1]["default"] for name in inputs)
    assert "node_defaults" in generation.CONFIGS and generation.parse_run_spec("node_defaults").name == "node_defaults"


def test_the_node_pack_run_takes_the_defaults_the_server_states():
    """validate node-pack's "defaults" prompt runs the node with the defaults the release's server gives
    (/object_info), not the ones the script assumed: a release where a family cannot run defaults it off."""
    from benchmarks.node_pack import node_defaults
    info = {"input": {"required": {"model": ["MODEL"], "norm_rope": ["BOOLEAN", {"default": False, "tooltip": "t"}]},
                      "optional": {"attention": ["BOOLEAN", {"default": True}],
                                   "fp8_weights": [["no_extra_memory", "codes_beside_weights"],
                                                   {"default": "no_extra_memory"}]}}}
    assert node_defaults(info) == {"norm_rope": False, "attention": True, "fp8_weights": "no_extra_memory"}
