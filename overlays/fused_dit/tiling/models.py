"""The models the pack knows, recognised by what they are, with what the Tiled Sampling node plans of each. Data
only, no torch.

One table serves the node, Fused DiT Ops and `applier budget`: fused_dit/models.json, one entry per model, keyed by
the budget's name for it (`applier budget --model flux2-dev`). An entry holds the budget's architecture numbers
(parameters, hidden width, patch, text tokens, the VAE, the blocks' Linears; applier/budget/data.py reads them), under
"comfyui" what the model is as ComfyUI 0.33 builds it, under "tiling" the node's tile and batch (absent: the node
does not tile it, "untiled" says why), and the release's files each number comes from ("source" keys). The pack
ships the file; applier reads it from the pack (applier.resources), so there is one copy.

ComfyUI builds several models on one class (Flux.2 and Chroma beside Flux.1's `comfy.ldm.flux.model.Flux`, every
Wan 2.x on `WanModel`, Lumina 2 and Z-Image on `NextDiT`, HunyuanImage 2.1 on `HunyuanVideo`), so a model is
recognised by its model config as ComfyUI builds it (`comfy/supported_models.py`'s unet_config["image_model"], the
latent format's channels and spatial factor, a width key of `comfy/model_detection.py`'s config) and by the
diffusion model's patch, never by a class name alone. A model built on a known class that differs in any of these
(Flux.2 Klein: hidden_size 3072 on Flux.2's config) is not one of the entries and runs untiled, said once.

The tile is a size the model was trained at; the overlap is the budget's (applier/data/efficiency.toml [tiling],
OVERLAP_PX here, kept equal by a test). `max_batch`: the most tiles in one forward ("max_batch_source" says where
it comes from; the free memory caps it in any case).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .plan import ModelShape

TABLE = Path(__file__).resolve().parent.parent / "models.json"
OVERLAP_PX = 128
FACT_FIELDS = ("image_model", "latent channels", "latent factor", "patch")


def load_table(path: Path = TABLE) -> dict:
    """The pack's model table: {budget key: entry} as fused_dit/models.json holds it."""
    return json.loads(path.read_text(encoding="utf-8"))


def shape_of(key: str, entry: dict) -> ModelShape:
    """The planner's ModelShape of a table entry the node tiles (one with "tiling" and "comfyui")."""
    known, tiling = entry["comfyui"], entry["tiling"]
    groups = entry["group"]
    return ModelShape(key, patch=entry["patch"], vae_factor=entry["vae"]["factor"], hidden=entry["hidden"],
                      activation_widths=float(entry["activation_widths"]), text_tokens=entry["text_tokens"],
                      text_in_stream=groups[0]["stream"] == "all", tile_px=tiling["tile_px"], overlap_px=OVERLAP_PX,
                      max_batch=tiling["max_batch"], image_model=known["image_model"],
                      latent_channels=known["latent_channels"], config_width=tuple(known["config"].items()),
                      name=entry["name"], classes=tuple(known["classes"]))


TABLE_ENTRIES = load_table()
# the models the node tiles, by the table's key
MODELS: dict[str, ModelShape] = {key: shape_of(key, entry) for key, entry in TABLE_ENTRIES.items()
                                 if "tiling" in entry and "comfyui" in entry}
KNOWN = ", ".join(shape.name for shape in MODELS.values())


@dataclass(frozen=True)
class ModelFacts:
    """What a loaded model is, read from ComfyUI's objects (wrappers.model_facts)."""
    class_names: tuple[str, ...]          # the diffusion model's class and base classes, most derived first
    image_model: str | None               # unet_config["image_model"]; None where the config has none (SD3)
    latent_channels: int | None
    vae_factor: int | None                # the latent format's spacial_downscale_ratio
    patch: int | None                     # the diffusion model's spatial patch
    config: dict | None                   # the unet_config as ComfyUI detected it; None where it cannot be read

    def words(self) -> str:
        parts = [f"image_model {self.image_model!r}" if self.image_model else None,
                 f"{self.latent_channels} latent channels" if self.latent_channels else None,
                 f"1/{self.vae_factor} latent" if self.vae_factor else None,
                 f"patch {self.patch}" if self.patch else None]
        return ", ".join(p for p in parts if p) or "no model config"


def differences(shape: ModelShape, facts: ModelFacts) -> list[str]:
    """What of `facts` differs from the entry `shape` (empty: the model is that entry)."""
    config = facts.config or {}
    pairs = [("image_model", shape.image_model, config.get("image_model")),
             ("latent channels", shape.latent_channels, facts.latent_channels),
             ("latent factor", shape.vae_factor, facts.vae_factor),
             ("patch", shape.patch, facts.patch)]
    pairs += [(key, value, config.get(key)) for key, value in shape.config_width]
    return [what for what, mine, theirs in pairs if mine != theirs]


def recognise(facts: ModelFacts) -> tuple[ModelShape | None, str]:
    """The table's entry for this model and an empty reason, or None and why the node does not tile it."""
    candidates = [shape for shape in MODELS.values() if set(shape.classes) & set(facts.class_names)]
    name = facts.class_names[0] if facts.class_names else "this model"
    if not candidates:
        return None, f"{name} ({facts.words()}) is not a model the node tiles ({KNOWN})"
    names = " / ".join(shape.name for shape in candidates)
    if facts.config is None:
        return None, f"{name}'s model config cannot be read, so the node cannot tell which {names}-like model it is"
    ranked = sorted(((differences(shape, facts), shape) for shape in candidates), key=lambda pair: len(pair[0]))
    differs, nearest = ranked[0]
    if not differs:
        return nearest, ""
    return None, (f"{name} ({facts.words()}) is built on {nearest.name}'s class but is not {nearest.name} "
                  f"(its {', '.join(differs)} differ{'s' if len(differs) == 1 else ''}): the node has no tiling "
                  "numbers for it")
