"""The steps of the pack's tiled templates (overlays/<node>/example_workflows/*.json), which `applier budget` prices
a tiled route at unless --steps says otherwise.

A template's tiled route is the KSampler that Tiled Sampling's MODEL reaches (make_a_32k_image_flux: a refinement
at denoise 0.3, 8 steps); the model it is for is the one its UNETLoader or checkpoint loader names. Read bounded;
a template that cannot be read or holds no such sampler is left out, never guessed.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from applier.budget.inputs import find_model
from applier.budget.records import BudgetData, Model, UnknownModelError
from applier.catalog.packmeta import read_pack
from applier.errors import ApplierError
from applier.resources import OVERLAYS_DIR
from applier.store.fsutil import read_regular

TEMPLATE_FOLDER = "example_workflows"
MAX_TEMPLATE_BYTES = 1024 * 1024        # a workflow of a few dozen nodes is tens of kB
TILED_NODE = "TiledSampling"
SAMPLER = "KSampler"                   # widgets: seed, control, steps, cfg, sampler, scheduler, denoise
LOADERS = {"UNETLoader": 0, "CheckpointLoaderSimple": 0}      # the widget that names the model file
LATENTS = ("EmptySD3LatentImage", "EmptyLatentImage")          # widgets: width, height, batch size


@dataclass(frozen=True)
class TemplateSteps:
    name: str                    # the template's name in ComfyUI's template browser (the file's stem)
    model_file: str              # what its loader loads, "flux1-dev.safetensors"
    steps: int
    denoise: float
    base: tuple[int, int, int] | None = None     # the generation the route starts from: width, height, steps

    def words(self) -> str:
        return f"the {self.name} template's refinement at denoise {self.denoise:g}"


def tiled_templates(pack_dir: Path = OVERLAYS_DIR) -> list[TemplateSteps]:
    """Every template of the pack whose Tiled Sampling feeds a KSampler, with that sampler's steps."""
    try:
        folder = pack_dir / read_pack(pack_dir)["node"] / TEMPLATE_FOLDER
        paths = sorted(folder.glob("*.json"))
    except (ApplierError, OSError):
        return []
    found = []
    for path in paths:
        try:
            workflow = json.loads(read_regular(path, limit=MAX_TEMPLATE_BYTES))
        except (ApplierError, OSError, ValueError):
            continue
        steps = _tiled_sampler(workflow) if isinstance(workflow, dict) else None
        if steps is not None:
            found.append(TemplateSteps(path.stem, _model_file(workflow), *steps, base=_base(workflow)))
    return found


def template_for(data: BudgetData, model: Model, pack_dir: Path = OVERLAYS_DIR) -> TemplateSteps | None:
    """The pack's tiled template for this model family (its loader's file names one of the family's aliases)."""
    for template in tiled_templates(pack_dir):
        try:
            if find_model(data, Path(template.model_file).stem).key == model.key:
                return template
        except UnknownModelError:
            continue
    return None


def _nodes(workflow: dict) -> dict:
    nodes = workflow.get("nodes")
    return {n.get("id"): n for n in nodes if isinstance(n, dict)} if isinstance(nodes, list) else {}


def _model_file(workflow: dict) -> str:
    for node in _nodes(workflow).values():
        widgets = node.get("widgets_values")
        if node.get("type") in LOADERS and isinstance(widgets, list) and widgets:
            return str(widgets[LOADERS[node["type"]]])
    return ""


def _tiled_sampler(workflow: dict) -> tuple[int, float] | None:
    """(steps, denoise) of the KSampler that Tiled Sampling's MODEL reaches through MODEL links, or None."""
    nodes = _nodes(workflow)
    links = [link for link in workflow.get("links") or [] if isinstance(link, list) and len(link) >= 6]
    reached = [i for i, n in nodes.items() if n.get("type") == TILED_NODE]
    seen = set(reached)
    while reached:
        here = reached.pop(0)
        for _, source, _, target, _, kind in (link[:6] for link in links):
            if source != here or kind != "MODEL" or target in seen or target not in nodes:
                continue
            seen.add(target)
            node = nodes[target]
            widgets = node.get("widgets_values")
            if node.get("type") == SAMPLER and isinstance(widgets, list) and len(widgets) >= 7:
                steps, denoise = widgets[2], widgets[6]
                if type(steps) is int and steps >= 1 and isinstance(denoise, (int, float)):
                    return steps, float(denoise)
            reached.append(target)
    return None


def _base(workflow: dict) -> tuple[int, int, int] | None:
    """(width, height, steps) of the generation the route starts from: the KSampler an empty latent feeds."""
    nodes = _nodes(workflow)
    links = [link for link in workflow.get("links") or [] if isinstance(link, list) and len(link) >= 6]
    for _, source, _, target, _, kind in (link[:6] for link in links):
        latent, sampler = nodes.get(source, {}), nodes.get(target, {})
        if kind != "LATENT" or latent.get("type") not in LATENTS or sampler.get("type") != SAMPLER:
            continue
        size, widgets = latent.get("widgets_values"), sampler.get("widgets_values")
        if (isinstance(size, list) and len(size) >= 2 and isinstance(widgets, list) and len(widgets) >= 3
                and all(type(v) is int and v >= 1 for v in (size[0], size[1], widgets[2]))):
            return size[0], size[1], widgets[2]
    return None
