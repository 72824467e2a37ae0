"""benchmarks/workflow_api.py: a saved workflow (the pack's example) turned into an API prompt with object_info, as
ComfyUI's front end queues it: link inputs, widget order, the seed's control value skipped, notes dropped."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from benchmarks.workflow_api import WorkflowError, to_prompt

REPO = Path(__file__).resolve().parent.parent
WORKFLOWS = REPO / "overlays" / "comfyui_fused_dit" / "example_workflows"


def _info(required: dict, optional: dict | None = None) -> dict:
    return {"input": {"required": required, **({"optional": optional} if optional else {})}}


def core_object_info() -> dict:
    """The input specs of ComfyUI 0.33.0's core nodes the example uses (names, order and kinds as its
    /object_info lists them), and the pack's nodes from their own INPUT_TYPES."""
    sys.path.insert(0, str(REPO / "overlays"))
    import comfyui_fused_dit as pack
    combo = [["a", "b"]]
    info = {
        "UNETLoader": _info({"unet_name": combo, "weight_dtype": combo}),
        "DualCLIPLoader": _info({"clip_name1": combo, "clip_name2": combo, "type": combo, "device": combo}),
        "CLIPTextEncode": _info({"text": ["STRING", {"multiline": True}], "clip": ["CLIP"]}),
        "FluxGuidance": _info({"conditioning": ["CONDITIONING"], "guidance": ["FLOAT", {}]}),
        "ConditioningZeroOut": _info({"conditioning": ["CONDITIONING"]}),
        "VAELoader": _info({"vae_name": combo}),
        "EmptySD3LatentImage": _info({"width": ["INT", {}], "height": ["INT", {}], "batch_size": ["INT", {}]}),
        "KSampler": _info({"model": ["MODEL"], "seed": ["INT", {"control_after_generate": True}],
                           "steps": ["INT", {}], "cfg": ["FLOAT", {}], "sampler_name": combo, "scheduler": combo,
                           "positive": ["CONDITIONING"], "negative": ["CONDITIONING"],
                           "latent_image": ["LATENT"], "denoise": ["FLOAT", {}]}),
        "VAEDecode": _info({"samples": ["LATENT"], "vae": ["VAE"]}),
        "ImageScale": _info({"image": ["IMAGE"], "upscale_method": combo, "width": ["INT", {}],
                             "height": ["INT", {}], "crop": combo}),
        "VAEEncodeTiled": _info({"pixels": ["IMAGE"], "vae": ["VAE"], "tile_size": ["INT", {}],
                                 "overlap": ["INT", {}], "temporal_size": ["INT", {}],
                                 "temporal_overlap": ["INT", {}]}),
        "VAEDecodeTiled": _info({"samples": ["LATENT"], "vae": ["VAE"], "tile_size": ["INT", {}],
                                 "overlap": ["INT", {}], "temporal_size": ["INT", {}],
                                 "temporal_overlap": ["INT", {}]}),
        "SaveImage": _info({"images": ["IMAGE"], "filename_prefix": ["STRING", {}]}),
    }
    for name, cls in pack.NODE_CLASS_MAPPINGS.items():
        spec = cls.INPUT_TYPES()
        info[name] = {"input": {k: {n: list(v) for n, v in spec.get(k, {}).items()} for k in ("required", "optional")}}
    return info


def test_the_32k_example_becomes_the_route_prompt():
    workflow = json.loads((WORKFLOWS / "make_a_32k_image_flux.json").read_text(encoding="utf-8"))
    prompt = to_prompt(workflow, core_object_info())
    kinds = {node["class_type"] for node in prompt.values()}
    assert "Note" not in kinds and {"TiledSampling", "FusedDiTOps", "TiledVAEEncode", "TiledVAEDecode",
                                    "SaveImagePNG"} <= kinds
    decode = next(n for n in prompt.values() if n["class_type"] == "TiledVAEDecode")["inputs"]
    assert (decode["tile_px"], decode["overlap_px"], decode["tile_batch"]) == (1024, 128, 0)
    refine = next(n for n in prompt.values() if n["class_type"] == "KSampler" and n["inputs"]["denoise"] < 1)
    assert refine["inputs"]["seed"] == 42 and refine["inputs"]["steps"] == 8 and refine["inputs"]["denoise"] == 0.3
    tiled_id = refine["inputs"]["model"][0]
    assert prompt[tiled_id]["class_type"] == "TiledSampling"
    assert prompt[tiled_id]["inputs"]["tile_px"] == 1024 and prompt[tiled_id]["inputs"]["canvas"] == "auto"
    scale = next(n for n in prompt.values() if n["class_type"] == "ImageScale")["inputs"]
    assert (scale["width"], scale["height"]) == (32768, 18432)


def test_a_node_the_server_lacks_or_values_left_over_are_refused():
    workflow = {"nodes": [{"id": 1, "type": "Nope", "outputs": [{"name": "X"}], "widgets_values": []}], "links": []}
    with pytest.raises(WorkflowError, match="no Nope node"):
        to_prompt(workflow, {})
    workflow = {"nodes": [{"id": 1, "type": "VAELoader", "outputs": [], "widgets_values": ["a", "b"]}], "links": []}
    with pytest.raises(WorkflowError, match="left over"):
        to_prompt(workflow, {"VAELoader": _info({"vae_name": [["a"]]})})


def test_the_harness_fits_the_example_to_a_run_without_text_encoders():
    """benchmarks tiled-route --workflow: the template's own nodes and inputs, its files, sizes and steps replaced,
    the text encoders replaced by the probe's zero conditioning."""
    from benchmarks.tiled_route import EXAMPLE_WORKFLOW, workflow_prompt
    workflow = json.loads(EXAMPLE_WORKFLOW.read_text(encoding="utf-8"))
    prompt = workflow_prompt(workflow, core_object_info(), "tiny.safetensors", "vae.safetensors", "default",
                             {"fp8_linear": False}, (128, 128), (256, 192), 2, 1)
    kinds = [node["class_type"] for node in prompt.values()]
    assert "DualCLIPLoader" not in kinds and "CLIPTextEncode" not in kinds
    assert kinds.count("GenerationProbeZeroConditioning") == 1
    by_kind = {node["class_type"]: node["inputs"] for node in prompt.values()}
    assert by_kind["UNETLoader"] == {"unet_name": "tiny.safetensors", "weight_dtype": "default"}
    assert (by_kind["ImageScale"]["width"], by_kind["ImageScale"]["height"]) == (256, 192)
    assert by_kind["FusedDiTOps"]["fp8_linear"] is False and by_kind["TiledSampling"]["tile_px"] == 1024
    steps = sorted(n["inputs"]["steps"] for n in prompt.values() if n["class_type"] == "KSampler")
    assert steps == [1, 2]
