"""The models the Tiled Sampling node tiles, by the class of ComfyUI's diffusion model (its class or a base class's
name), with what planning needs of each. Data only, no torch.

The architecture numbers are applier budget's (applier/data/models.toml: hidden, activation_widths, text_tokens,
patch, the VAE's factor; tests/overlays/test_tiling.py keeps them equal), so that the node and the budget plan
the same tiles with the same memory model. The tile is a size the model was trained at, from that file's tile_px;
the overlap is the budget's (applier/data/efficiency.toml [tiling]). `max_batch`: the most tiles in one forward;
Flux's 8 is the batch the route was measured at (benchmarks/results/tiled-route-0.33.0.json, summary.routes),
Qwen-Image takes Flux's (the same width), Wan's 2 is not measured (one 832 px tile of 81 frames is 33K tokens).
"""
from __future__ import annotations

from .plan import ModelShape

MODELS: dict[str, ModelShape] = {
    "Flux": ModelShape("flux-dev", patch=2, vae_factor=8, hidden=3072, activation_widths=15.1, text_tokens=256,
                       text_in_stream=True, tile_px=1024, overlap_px=128, max_batch=8),
    "QwenImageTransformer2DModel": ModelShape("qwen-image", patch=2, vae_factor=8, hidden=3072,
                                              activation_widths=12.9, text_tokens=115, text_in_stream=True,
                                              tile_px=1024, overlap_px=128, max_batch=8),
    "WanModel": ModelShape("wan-14b", patch=2, vae_factor=8, hidden=5120, activation_widths=10.2, text_tokens=512,
                           text_in_stream=False, tile_px=832, overlap_px=128, max_batch=2),
}


def shape_for(class_names: list[str]) -> ModelShape | None:
    """The table's entry for a diffusion model whose class and base classes have these names (most derived first)."""
    for name in class_names:
        if name in MODELS:
            return MODELS[name]
    return None
