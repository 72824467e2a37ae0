"""benchmarks/generation.py's pure parts: release reading (fixture trees the tests write), the VRAM mode, the
checkpoint key format, the model table (Qwen-Image's arguments and inputs, and its runs skipped on a release without
it), run specs, the node inputs each overlay config asks for, and combining reports.

The benchmark itself needs ComfyUI and a GPU; these parts take files, dicts and strings only."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def generation():
    module = _load("generation")   # puts benchmarks/ on sys.path: comfy_release, generation_configs beside it
    yield module
    sys.modules.pop("generation", None)


@pytest.fixture(scope="module")
def release_module(generation):
    return generation.comfy_release


@pytest.fixture(scope="module")
def configs(generation):
    return generation.generation_configs


# ------------------------------------------------------------------ fixture trees, shaped like each era's files
def write_tree(root: Path, *, version: str, dynamic: bool, eval_in_base: bool, txt_ids: bool) -> Path:
    (root / "comfy" / "ldm" / "flux").mkdir(parents=True)
    (root / "comfyui_version.py").write_text(f'__version__ = "{version}"\n')
    main = ["import comfy.options", "import cuda_malloc"]
    if dynamic:
        main += ["import comfy_aimdo.control", "if enables_dynamic_vram():", "    comfy_aimdo.control.init()",
                 "comfy.model_patcher.CoreModelPatcher = comfy.model_patcher.ModelPatcherDynamic"]
    (root / "main.py").write_text("\n".join(main) + "\n")
    base = ["class ModelType:", "    FLUX = 8", "", "class BaseModel(torch.nn.Module):",
            "    def __init__(self, model_config):", "        self.diffusion_model = unet_model()"]
    if eval_in_base:
        base += ["        self.diffusion_model.requires_grad_(False)", "        self.diffusion_model.eval()"]
    # a later class that does call eval(): only BaseModel's own body counts
    base += ["", "class Other(BaseModel):", "    def __init__(self):", "        self.diffusion_model.eval()"]
    (root / "comfy" / "model_base.py").write_text("\n".join(base) + "\n")
    fields = ["@dataclass", "class FluxParams:", "    in_channels: int", "    guidance_embed: bool"]
    if txt_ids:
        fields += ["    txt_ids_dims: list", "    global_modulation: bool = False"]
    fields += ["", "class Flux(nn.Module):", "    txt_ids_dims: list"]
    (root / "comfy" / "ldm" / "flux" / "model.py").write_text("\n".join(fields) + "\n")
    return root


@pytest.fixture
def old_tree(tmp_path):
    return write_tree(tmp_path / "old", version="0.3.64", dynamic=False, eval_in_base=False, txt_ids=False)


@pytest.fixture
def new_tree(tmp_path):
    tree = write_tree(tmp_path / "new", version="0.33.0", dynamic=True, eval_in_base=True, txt_ids=True)
    (tree / "REVISION").write_text("0123abcd\n2026-08-21 01:16:29 -0700\n")
    return tree


def test_read_release_of_each_era(release_module, old_tree, new_tree):
    old = release_module.read_release(old_tree)
    assert (old.version, old.dynamic_vram, old.eval_in_base_model, old.flux_txt_ids_dims) == \
        ("0.3.64", False, False, False)
    assert old.commit is None and old.commit_date is None
    new = release_module.read_release(new_tree)
    assert (new.version, new.dynamic_vram, new.eval_in_base_model, new.flux_txt_ids_dims) == \
        ("0.33.0", True, True, True)
    assert (new.commit, new.commit_date) == ("0123abcd", "2026-08-21 01:16:29 -0700")
    assert new.as_dict()["comfyui_version"] == "0.33.0"


def test_read_release_of_an_empty_folder(release_module, tmp_path):
    release = release_module.read_release(tmp_path)
    assert release.version is None and not release.dynamic_vram and not release.flux_txt_ids_dims


def test_class_body_stops_at_the_next_top_level_statement(release_module):
    source = "class A:\n    x = 1\n\n    def f(self):\n        pass\nclass B:\n    y = 2\n"
    assert "x = 1" in release_module.class_body(source, "A")
    assert "y = 2" not in release_module.class_body(source, "A")
    assert release_module.class_body(source, "C") == ""


@pytest.mark.parametrize("dynamic, disable, device, torch_version, mode", [
    (True, False, "cuda", (2, 11), "dynamic"),
    (True, True, "cuda", (2, 11), "legacy"),
    (True, False, "cpu", (2, 11), "legacy"),
    (True, False, "cuda", (2, 7), "legacy"),
    (False, False, "cuda", (2, 11), "legacy"),
])
def test_vram_mode_follows_main_py(release_module, new_tree, dynamic, disable, device, torch_version, mode):
    release = release_module.read_release(new_tree)
    if not dynamic:
        release = release_module.Release(**{**release.__dict__, "dynamic_vram": False})
    got, why = release_module.vram_mode(release, device, disable, torch_version)
    assert got == mode
    assert why


def test_flux_arguments_add_txt_ids_dims_only_where_required(release_module):
    base = {"hidden_size": 3072}
    assert release_module.flux_arguments(base, {"hidden_size"}) == base
    assert release_module.flux_arguments(base, {"hidden_size", "txt_ids_dims"}) == \
        {"hidden_size": 3072, "txt_ids_dims": []}
    assert release_module.flux_arguments({**base, "txt_ids_dims": [3]}, {"txt_ids_dims"})["txt_ids_dims"] == [3]
    assert "txt_ids_dims" not in base


def test_checkpoint_keys_spell_flux_qk_norms_as_released(release_module):
    key = release_module.checkpoint_key
    assert key("double_blocks.0.img_attn.norm.query_norm.weight", "flux") == \
        "double_blocks.0.img_attn.norm.query_norm.scale"
    assert key("single_blocks.3.norm.key_norm.scale", "flux") == "single_blocks.3.norm.key_norm.scale"
    assert key("double_blocks.0.img_norm1.weight", "flux") == "double_blocks.0.img_norm1.weight"
    assert key("blocks.0.self_attn.norm_q.weight", "wan") == "blocks.0.self_attn.norm_q.weight"
    assert key("head.head.weight", "wan") == "head.head.weight"


def test_checkpoint_keys_of_qwen_image_carry_comfyuis_prefix(release_module):
    key = release_module.checkpoint_key
    assert key("transformer_blocks.0.img_mod.1.weight", "qwen_image") == \
        "model.diffusion_model.transformer_blocks.0.img_mod.1.weight"
    assert key("txt_norm.weight", "qwen_image") == "model.diffusion_model.txt_norm.weight"
    # never twice, and the other families' keys stay unprefixed
    assert key("model.diffusion_model.img_in.weight", "qwen_image") == "model.diffusion_model.img_in.weight"
    assert key("img_in.weight", "flux") == "img_in.weight"
    assert key("blocks.0.ffn.0.weight", "wan") == "blocks.0.ffn.0.weight"


def test_key_format_tag_is_order_free_and_tells_formats_apart(release_module):
    tag = release_module.key_format_tag
    assert tag(["a.weight", "b.scale"]) == tag(["b.scale", "a.weight"])
    assert tag(["a.weight", "b.scale"]) != tag(["a.weight", "b.weight"])


def test_sdpa_backend_names(release_module):
    assert release_module.sdpa_backend_name(1) == "FLASH_ATTENTION"
    assert release_module.sdpa_backend_name(3) == "CUDNN_ATTENTION"
    assert release_module.sdpa_backend_name(0) == "MATH"
    assert release_module.sdpa_backend_name(9) == "backend 9"
    assert release_module.main_backend({"FLASH_ATTENTION": 3, "MATH": 1}) == "FLASH_ATTENTION"
    assert release_module.main_backend({}) is None


# ------------------------------------------------------------------------------------------------ the models
def test_the_model_table(generation):
    assert list(generation.MODELS) == ["flux-dev", "wan2.1-t2v-14b", "qwen-image"]
    for key, spec in generation.MODELS.items():
        assert spec.key == key and spec.model_class
        assert spec.resolutions and spec.tiny_resolutions and spec.tiny_text_tokens < spec.text_tokens


def test_qwen_image_is_the_released_20b_as_comfyuis_detection_reads_it(generation):
    spec = generation.MODELS["qwen-image"]
    assert (spec.family, spec.model_class) == ("qwen_image", "QwenImage")
    full = spec.full
    assert full["image_model"] == "qwen_image"          # what model_detection sets, passed on to the class
    assert (full["num_layers"], full["num_attention_heads"], full["attention_head_dim"]) == (60, 24, 128)
    assert (full["in_channels"], full["out_channels"], full["patch_size"]) == (64, 16, 2)
    assert full["joint_attention_dim"] == 3584 and tuple(full["axes_dims_rope"]) == (16, 56, 56)
    assert spec.resolutions == ((1024, 1024),) and spec.text_tokens == 115


@pytest.mark.parametrize("key, depth", [("flux-dev", ("depth", "depth_single_blocks")),
                                        ("qwen-image", ("num_layers",))])
def test_a_tiny_model_whose_width_detection_fixes_only_loses_depth(generation, key, depth):
    spec = generation.MODELS[key]
    assert {k: v for k, v in spec.tiny.items() if k not in depth} == \
        {k: v for k, v in spec.full.items() if k not in depth}
    assert all(spec.tiny[k] == 1 for k in depth)


def _no_qwen_image_in_comfy(monkeypatch):
    """A comfy package (as a release before Qwen-Image would have it) with no comfy.ldm.qwen_image."""
    import types
    for name in ("comfy", "comfy.ldm"):
        package = types.ModuleType(name)
        package.__path__ = []
        monkeypatch.setitem(sys.modules, name, package)
    for name in ("comfy.ldm.qwen_image", "comfy.ldm.qwen_image.model"):
        monkeypatch.delitem(sys.modules, name, raising=False)


def test_a_release_without_qwen_image_says_so(generation, monkeypatch):
    _no_qwen_image_in_comfy(monkeypatch)
    with pytest.raises(generation.ModelUnavailable, match="no Qwen-Image model"):
        generation.diffusion_model_class(generation.MODELS["qwen-image"])


def test_its_runs_are_recorded_as_skipped_not_as_errors(generation, monkeypatch):
    pytest.importorskip("torch")
    import argparse
    _no_qwen_image_in_comfy(monkeypatch)
    options = argparse.Namespace(tiny=True, seed=0, save_checkpoint=False, work_dir=None, steps=2,
                                 warmup_steps=1, count="wrapper", load_outside_inference_mode=False)
    session = generation.Session(options, "cpu")
    record = session.run(generation.MODELS["qwen-image"], (64, 64), generation.parse_run_spec("stock"))
    assert "no Qwen-Image model" in record["skipped"]
    assert "error" not in record and "traceback" not in record and session.setup == []


def test_qwen_image_inputs_are_what_its_workflow_hands_to_ksampler(generation, monkeypatch):
    torch = pytest.importorskip("torch")
    import types
    sample = types.ModuleType("comfy.sample")
    sample.prepare_noise = lambda latent, seed: torch.randn(latent.shape, generator=torch.Generator().manual_seed(seed))
    comfy = types.ModuleType("comfy")
    comfy.__path__ = []
    comfy.sample = sample
    monkeypatch.setitem(sys.modules, "comfy", comfy)
    monkeypatch.setitem(sys.modules, "comfy.sample", sample)
    spec = generation.MODELS["qwen-image"]
    latent, noise, positive = generation.inputs_for(spec, (1024, 1024), False, 0)
    # EmptySD3LatentImage's 16 channels at 1/8, with the frame axis of Qwen-Image's Wan21 latent format
    assert tuple(latent.shape) == (1, 16, 1, 128, 128) and noise.shape == latent.shape
    [[context, extra]] = positive
    assert tuple(context.shape) == (1, 115, 3584) and extra == {}
    latent, _, [[context, _]] = generation.inputs_for(spec, (64, 64), True, 0)
    assert tuple(latent.shape) == (1, 16, 1, 8, 8) and tuple(context.shape) == (1, 8, 3584)


# ----------------------------------------------------------------------------------------------- run specs
@pytest.mark.parametrize("text, name, weights", [
    ("overlay_all", "overlay_all", "bf16"),
    ("overlay_all_fp8@fp8_e4m3fn", "overlay_all_fp8@fp8_e4m3fn", "fp8_e4m3fn"),
    ("overlay_attention", "overlay_attention", "bf16"),
    ("comfy_sage", "comfy_sage", "bf16"),
    ("comfy_fp8_fast:eval", "comfy_fp8_fast:eval", "fp8_e4m3fn"),
])
def test_new_run_specs_parse(generation, text, name, weights):
    run = generation.parse_run_spec(text)
    assert (run.name, run.weights) == (name, weights)


@pytest.mark.parametrize("text", ["overlay_everything", "comfy_sage:train", "comfy_fp8_fast@bf16"])
def test_bad_run_specs_are_refused(generation, text):
    with pytest.raises(ValueError):
        generation.parse_run_spec(text)


# --------------------------------------------------------------------------------------- node inputs per config
TODAY = {"required": {"model": ("MODEL",), "norm_rope": ("BOOLEAN", {}), "adaln": ("BOOLEAN", {}),
                      "gate": ("BOOLEAN", {}), "fp8_linear": ("BOOLEAN", {})},
         "optional": {"fp8_weights": (["replace", "alongside"], {})}}
WITH_ATTENTION = {"required": {**TODAY["required"], "attention": ("BOOLEAN", {})}, "optional": TODAY["optional"]}


def test_node_families_are_its_boolean_inputs(configs):
    assert configs.node_families(TODAY) == ("norm_rope", "adaln", "gate", "fp8_linear")
    assert configs.node_families(WITH_ATTENTION)[-1] == "attention"


def test_overlay_all_takes_what_exists_and_names_what_is_absent(configs):
    offered = configs.node_families(TODAY)
    inputs, absent = configs.node_inputs("overlay_all", offered, TODAY)
    assert inputs == {"norm_rope": True, "adaln": True, "gate": True, "fp8_linear": False}
    assert absent == ["attention"]
    inputs, absent = configs.node_inputs("overlay_all", configs.node_families(WITH_ATTENTION), WITH_ATTENTION)
    assert inputs["attention"] is True and inputs["fp8_linear"] is False and absent == []


def test_overlay_all_fp8_replaces_the_weights(configs):
    inputs, _ = configs.node_inputs("overlay_all_fp8", configs.node_families(TODAY), TODAY)
    assert inputs["fp8_linear"] is True and inputs["fp8_weights"] == "replace"
    inputs, _ = configs.node_inputs("overlay_fp8_alongside", configs.node_families(TODAY), TODAY)
    assert inputs["fp8_weights"] == "alongside"


def test_the_old_overlay_config_keeps_a_new_family_off(configs):
    inputs, absent = configs.node_inputs("overlay", configs.node_families(WITH_ATTENTION), WITH_ATTENTION)
    assert inputs["attention"] is False and inputs["norm_rope"] is True and absent == []


def test_a_config_with_no_family_offered_is_skipped(configs):
    with pytest.raises(configs.ConfigSkipped, match="attention"):
        configs.node_inputs("overlay_attention", configs.node_families(TODAY), TODAY)


def test_every_overlay_config_has_families(configs):
    overlay_configs = [c for c in configs.CONFIGS if c.startswith("overlay")]
    assert sorted(overlay_configs) == sorted(configs.OVERLAY_FAMILIES)


# ----------------------------------------------------------------------------------------------- reports
def _run(config, s_per_step, version=None, mode="as loaded", **extra):
    run = {"model": "flux-dev", "resolution": "1024x1024", "weights": "bf16", "config": config,
           "model_mode": mode, "s_per_step": s_per_step, **extra}
    if version is not None:
        run["comfyui_version"] = version
    return run


def test_combine_keeps_eras_apart(generation):
    old = {"environment": {"comfyui": {"comfyui_version": "0.3.64"}},
           "runs": [_run("stock", 0.2, mode="train"), _run("overlay", 0.1, mode="train")]}
    new = {"environment": {"comfyui": {"comfyui_version": "0.33.0"}},
           "runs": [_run("stock", 0.4, "0.33.0"), _run("overlay", 0.4, "0.33.0")]}
    combined = generation.combine([old, new])
    speedups = {(r["comfyui_version"], r["config"]): r["speedup_vs_stock"] for r in combined["runs"]}
    assert speedups == {("0.3.64", "stock"): 1.0, ("0.3.64", "overlay"): 2.0,
                        ("0.33.0", "stock"): 1.0, ("0.33.0", "overlay"): 1.0}
    # earlier files' "train" meant the loader's mode
    assert {r["model_mode"] for r in combined["runs"]} == {"as loaded"}
    assert len(combined["calls"]) == 2


def test_a_later_run_replaces_an_earlier_one_of_the_same_key(generation):
    first = {"runs": [_run("stock", 0.2, "0.3.64"), _run("overlay_fp8", 0.3, "0.3.64")]}
    second = {"runs": [_run("overlay_fp8", 0.1, "0.3.64")]}
    combined = generation.combine([first, second])
    fp8 = [r for r in combined["runs"] if r["config"] == "overlay_fp8"]
    assert len(fp8) == 1 and fp8[0]["speedup_vs_stock"] == 2.0


def test_a_run_keeps_the_stock_of_its_own_call(generation):
    first = {"runs": [_run("stock", 0.2, "0.33.0", date="d1"), _run("overlay_all", 0.1, "0.33.0", date="d1")]}
    second = {"runs": [_run("stock", 0.1, "0.33.0", date="d2"), _run("overlay_fp8", 0.2, "0.33.0", date="d2")]}
    runs = {r["config"]: r for r in generation.combine([first, second])["runs"]}
    assert runs["overlay_all"]["speedup_vs_stock"] == 2.0          # not 1.0 against the second call's stock
    assert runs["overlay_all"]["speedup_reference"] == "stock of its own call (0.2 s/step, d1)"
    assert runs["overlay_fp8"]["speedup_vs_stock"] == 0.5 and runs["stock"]["s_per_step"] == 0.1


def test_runs_of_a_combined_report_keep_their_speedups(generation):
    first = {"runs": [_run("stock", 0.2, "0.33.0", date="d1"), _run("overlay_all", 0.1, "0.33.0", date="d1")]}
    combined = generation.combine([first])
    later = {"runs": [_run("stock", 0.1, "0.33.0", date="d2")]}
    again = {r["config"]: r for r in generation.combine([combined, later])["runs"]}
    assert again["overlay_all"]["speedup_vs_stock"] == 2.0 and again["stock"]["s_per_step"] == 0.1


def test_dynamic_vram_and_legacy_runs_are_kept_apart(generation):
    dynamic = {"runs": [_run("stock", 0.2, "0.33.0", vram_mode="dynamic"),
                        _run("overlay_fp8", 0.25, "0.33.0", vram_mode="dynamic")]}
    legacy = {"runs": [_run("stock", 0.16, "0.33.0", vram_mode="legacy"),
                       _run("overlay_fp8", 0.08, "0.33.0", vram_mode="legacy")]}
    runs = {(r["vram_mode"], r["config"]): r["speedup_vs_stock"]
            for r in generation.combine([dynamic, legacy])["runs"]}
    assert runs == {("dynamic", "stock"): 1.0, ("dynamic", "overlay_fp8"): 0.8,
                    ("legacy", "stock"): 1.0, ("legacy", "overlay_fp8"): 2.0}


def test_forced_eval_and_fp8_weights_are_not_the_reference(generation):
    assert generation.is_reference(_run("stock", 0.2))
    assert generation.is_reference(_run("stock", 0.2, mode="train"))
    assert not generation.is_reference(_run("stock", 0.2, mode="eval"))
    assert not generation.is_reference({**_run("stock", 0.2), "weights": "fp8_e4m3fn"})
    assert not generation.is_reference(_run("overlay", 0.2))


# ------------------------------------------------------------------------------------------- probes and guards
def test_eager_weights_turns_lazy_weights_off_for_its_block(release_module, monkeypatch):
    import types
    memory = types.ModuleType("comfy.memory_management")
    memory.aimdo_enabled = True
    monkeypatch.setitem(sys.modules, "comfy.memory_management", memory)
    with release_module.eager_weights():
        assert memory.aimdo_enabled is False
    assert memory.aimdo_enabled is True
    monkeypatch.delitem(sys.modules, "comfy.memory_management")
    with release_module.eager_weights():   # a release without DynamicVRAM: nothing to switch
        pass


def test_fp8_gemms_are_counted_once_through_either_api(generation, monkeypatch):
    torch = pytest.importorskip("torch")
    seen = []
    monkeypatch.setattr(torch, "_scaled_mm", lambda *a, **k: seen.append("v1"), raising=False)
    # torch's newer API, here implemented through the older one: one GEMM, counted once
    monkeypatch.setattr(torch.nn.functional, "scaled_mm", lambda *a, **k: torch._scaled_mm(), raising=False)

    def step():
        torch._scaled_mm()
        torch.nn.functional.scaled_mm()
        torch.nn.functional.scaled_mm()
    assert generation.count_scaled_mm(step) == 3
    assert seen == ["v1"] * 3
    assert generation.count_scaled_mm(lambda: None) == 0


def test_a_closed_gate_counts_nothing(generation, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch, "_scaled_mm", lambda *a, **k: None, raising=False)
    gate = generation.ProbeGate(open=False)

    def two_steps():
        torch._scaled_mm()          # the first step: not counted
        gate.open = True
        torch._scaled_mm()
        torch._scaled_mm()
    assert generation.count_scaled_mm(two_steps, gate) == 2
