"""The models the Tiled Sampling node tiles, recognised by what they are, with what planning needs of each. Data
only, no torch.

ComfyUI builds several models on one class (Flux.2 and Flux.1 on `comfy.ldm.flux.model.Flux`, every Wan 2.x on
`WanModel`), so a model is recognised by its model config as ComfyUI 0.33 builds it (`comfy/supported_models.py`'s
unet_config["image_model"], the latent format's channels and spatial factor, `comfy/model_detection.py`'s width),
and by the diffusion model's patch, never by a class name alone. A model that differs in any of these (Flux.2:
image_model "flux2", 128 latent channels at 1/16, patch 1) is not one of these entries and runs untiled, said once.

The architecture numbers are applier budget's (applier/data/models.toml: hidden, activation_widths, text_tokens,
patch, the VAE's factor; tests/overlays/test_tiling.py keeps them equal), so that the node and the budget plan
the same tiles with the same memory model. The tile is a size the model was trained at, from that file's tile_px;
the overlap is the budget's (applier/data/efficiency.toml [tiling]). `max_batch`: the most tiles in one forward;
Flux's 8 is the batch the route was measured at (benchmarks/results/tiled-route-0.33.0.json, summary.routes),
Qwen-Image takes Flux's (the same width), Wan's 2 is not measured (one 832 px tile of 81 frames is 33K tokens).
"""
from __future__ import annotations

from dataclasses import dataclass

from .plan import ModelShape

MODELS: dict[str, ModelShape] = {
    "Flux": ModelShape("flux-dev", patch=2, vae_factor=8, hidden=3072, activation_widths=15.1, text_tokens=256,
                       text_in_stream=True, tile_px=1024, overlap_px=128, max_batch=8, image_model="flux",
                       latent_channels=16, config_width=("hidden_size", 3072), name="Flux.1"),
    "QwenImageTransformer2DModel": ModelShape("qwen-image", patch=2, vae_factor=8, hidden=3072,
                                              activation_widths=12.9, text_tokens=115, text_in_stream=True,
                                              tile_px=1024, overlap_px=128, max_batch=8, image_model="qwen_image",
                                              latent_channels=16, name="Qwen-Image"),
    "WanModel": ModelShape("wan-14b", patch=2, vae_factor=8, hidden=5120, activation_widths=10.2, text_tokens=512,
                           text_in_stream=False, tile_px=832, overlap_px=128, max_batch=2, image_model="wan2.1",
                           latent_channels=16, config_width=("dim", 5120), name="Wan 2.1 / 2.2 14B"),
}
KNOWN = ", ".join(shape.name for shape in MODELS.values())


@dataclass(frozen=True)
class ModelFacts:
    """What a loaded model is, read from ComfyUI's objects (wrappers.model_facts)."""
    class_names: tuple[str, ...]          # the diffusion model's class and base classes, most derived first
    image_model: str | None               # unet_config["image_model"]; None where the config could not be read
    latent_channels: int | None
    vae_factor: int | None                # the latent format's spacial_downscale_ratio
    patch: int | None                     # the diffusion model's spatial patch
    config: dict                          # the unet_config as ComfyUI detected it

    def words(self) -> str:
        parts = [f"image_model {self.image_model!r}" if self.image_model else None,
                 f"{self.latent_channels} latent channels" if self.latent_channels else None,
                 f"1/{self.vae_factor} latent" if self.vae_factor else None,
                 f"patch {self.patch}" if self.patch else None]
        return ", ".join(p for p in parts if p) or "no model config"


def recognise(facts: ModelFacts) -> tuple[ModelShape | None, str]:
    """The table's entry for this model and an empty reason, or None and why the node does not tile it."""
    by_class = next((MODELS[name] for name in facts.class_names if name in MODELS), None)
    name = facts.class_names[0] if facts.class_names else "this model"
    if by_class is None:
        return None, f"{name} ({facts.words()}) is not a model the node tiles ({KNOWN})"
    if facts.image_model is None:
        return None, (f"{name}'s model config cannot be read, so the node cannot tell which {by_class.name}-like "
                      "model it is")
    width_key, width = by_class.config_width or (None, None)
    differs = [what for what, mine, theirs in (
        ("image_model", by_class.image_model, facts.image_model),
        ("latent channels", by_class.latent_channels, facts.latent_channels),
        ("latent factor", by_class.vae_factor, facts.vae_factor),
        ("patch", by_class.patch, facts.patch),
        (width_key, width, facts.config.get(width_key, width) if width_key else None)) if mine != theirs]
    if differs:
        return None, (f"{name} ({facts.words()}) is built on {by_class.name}'s class but is not {by_class.name} "
                      f"(its {', '.join(differs)} differ): the node has no tiling numbers for it")
    return by_class, ""
