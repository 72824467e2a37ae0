"""applier: managed, reversible, verifiable patches and kernel overlays for ComfyUI and PyTorch installs."""

__version__ = "0.1.0"
