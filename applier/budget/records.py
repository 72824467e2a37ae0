"""The budget's records: the tables' rows (GPUs, model families, measured efficiencies), the target's caps as read,
and the request a budget answers (model, GPU, canvas, steps, the time given).

Plain frozen dataclasses and the constants they share; the tables are read into them by data.py, the caps by caps.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from applier.errors import RefusedError

GIB = 1024 ** 3
BF16_BYTES = 2
FP8_BYTES = 1
DEFAULT_WITHIN_S = 3600.0
# The configs a budget prices, by the names benchmarks/generation.py gives them (the JSON's ids); each is a set of
# overlay families. A user reads them in FAMILY_WORDS' words (config_words), never by these ids.
CONFIGS = {
    "stock": (),
    "overlay": ("elementwise",),
    "overlay_attention": ("attention",),
    "fp8": ("fp8",),
    "overlay_fp8": ("elementwise", "fp8"),
    "overlay_all": ("elementwise", "attention"),
    "attention_fp8": ("attention", "fp8"),
    "overlay_all_fp8": ("elementwise", "attention", "fp8"),
}
# FP8 Linears without the fused block kernels (and with attention) come before the configs that add them: where the
# block kernels gain nothing (a release whose blocks the pack's forwards were not written for, a model without Flux's
# or Wan's blocks) the tie goes to the config that says what runs.
# What each family runs, in the words of the Fused DiT Ops node's toggles (docs/budget.md, "Configs"): the fused
# QK RMSNorm + RoPE, LayerNorm + modulation and gated residual add of Flux's and Wan's blocks; the attention toggle
# (the fastest exact SDPA backend for each shape); the FP8 Linears toggle.
FAMILY_WORDS = {"elementwise": "fused block kernels", "attention": "per-shape attention", "fp8": "FP8 Linears"}
STOCK_WORDS = "stock ComfyUI"


def config_words(config: str) -> str:
    """What a config runs, as a user reads it: "stock ComfyUI", "the pack's fused block kernels and FP8 Linears"."""
    words = [FAMILY_WORDS[family] for family in CONFIGS[config]]
    if not words:
        return STOCK_WORDS
    return "the pack's " + (f"{', '.join(words[:-1])} and {words[-1]}" if len(words) > 1 else words[0])

# The lowest compute capability each family runs on: Triton bf16 kernels and cuDNN/flash attention need Ampere,
# FP8 tensor cores Ada (sm_89) or later.
FAMILY_MIN_CAPABILITY = {"elementwise": (8, 0), "attention": (8, 0), "fp8": (8, 9)}


class UnknownModelError(RefusedError):
    """--model names no model family of the table."""


class UnknownGpuError(RefusedError):
    """The GPU is not in the table (or none was detected): the user names one with --gpu."""


@dataclass(frozen=True)
class Gpu:
    key: str
    name: str
    names: tuple[str, ...]
    compute_capability: tuple[int, int]
    memory_mib: int
    memory_published: str
    bandwidth_gbs: float
    bf16_tflops: float
    fp8_tflops: float | None
    int8_tops: float | None
    host_link_gbs: float
    source: str


@dataclass(frozen=True)
class Linear:
    fan_in: int
    fan_out: int
    tokens: str                  # "all" | "image" | "text"


@dataclass(frozen=True)
class BlockGroup:
    name: str
    count: int
    stream: str                  # the token set of the residual stream: "all" or "image"
    width: int
    linears: tuple[Linear, ...]
    attention: tuple[tuple[str, str], ...]     # (query set, key/value set) per attention call
    elementwise_passes: float
    heads: int
    head_dim: int
    downsample: int = 1
    weight_copies: int = 1
    fp8: bool = True


@dataclass(frozen=True)
class Vae:
    factor: int
    temporal_factor: int
    channels: int
    decode_bytes_per_pixel: float
    decode_bytes_per_pixel_video: float | None
    source: str


@dataclass(frozen=True)
class Model:
    key: str
    name: str
    aliases: tuple[str, ...]
    parameters: int
    hidden: int
    patch: int
    text_tokens: int
    activation_widths: float
    steps: int
    cfg_forwards: int
    frames: int                  # default frames of a video model, 1 for an image model
    tile_px: tuple[int, ...]
    overlay_blocks: bool
    fp8_path: str                # "blocks" | "generic"
    video: bool
    vae: Vae
    groups: tuple[BlockGroup, ...]
    sources: dict = field(default_factory=dict, compare=False)
    # reference images whose latents ride in the image stream (Qwen-Image-Edit's), each scaled to reference_px pixels
    reference_images: int = 0
    reference_px: int = 0
    tiles_as: str = ""           # the table key the Tiled Sampling node knows the model by ("": its own)
    # the file users load stores its matrices in FP8 with ComfyUI's quantization metadata (FLUX.2 [dev]: Comfy-Org's
    # fp8mixed file): stock ComfyUI holds the FP8-linears size, not bf16, and multiplies in FP8 where the card can
    stored_fp8: bool = False


@dataclass(frozen=True)
class Efficiency:
    value: float
    source: str
    # where it varies with sequence length (attention): the tokens `value` was measured at, and more
    # (tokens, value, source) points; between points it is interpolated linearly in log(tokens), held flat outside
    tokens: int | None = None
    by_tokens: tuple[tuple[int, float, str], ...] = ()

    def at(self, tokens: float) -> float:
        """The efficiency at this sequence length (value where nothing is known of the length)."""
        if not self.by_tokens or self.tokens is None:
            return self.value
        points = sorted([(self.tokens, self.value)] + [(t, v) for t, v, _ in self.by_tokens])
        if tokens <= points[0][0]:
            return points[0][1]
        for (t0, v0), (t1, v1) in zip(points, points[1:]):
            if tokens <= t1:
                share = math.log(tokens / t0) / math.log(t1 / t0)
                return v0 + share * (v1 - v0)
        return points[-1][1]


@dataclass(frozen=True)
class Era:
    name: str
    releases: str                # a packaging specifier
    stock_attention: str
    stock_attention_windows: str
    attention_source: str
    other: Efficiency
    elementwise_factor: Efficiency
    host_gap_s: Efficiency


@dataclass(frozen=True)
class VaeLayers:
    """A 2-D AutoencoderKL as its widths (comfy/ldm/modules/diffusionmodules/model.py Encoder and Decoder): `ch`
    channels at full resolution times `ch_mult` per level, `num_res_blocks` ResnetBlocks per level (the decoder one
    more), one attention block at the lowest level, `z_channels` latent channels."""
    ch: int
    ch_mult: tuple[int, ...]
    num_res_blocks: int
    z_channels: int
    image_channels: int
    source: str


@dataclass(frozen=True)
class RouteStages:
    """The tiled route's stages around the refinement (efficiency.toml [route]), measured on `gpu`: the tiled VAE's
    encode and decode as fractions of that GPU's bf16 peak over the VAE's convolution FLOPs, the host's stages
    (ImageScale, the PNG save) as core-seconds per megapixel on `host_cores` cores."""
    gpu: str
    models: tuple[str, ...]              # the models whose route runs this VAE
    vae: VaeLayers
    vae_tile_px: int
    vae_overlap_px: int
    vae_settings_source: str
    encode: Efficiency
    decode: Efficiency
    host_cores: int
    host_cores_source: str
    upscale: Efficiency
    save: Efficiency


@dataclass(frozen=True)
class Measured:
    gpu: str                     # the key of the GPU the efficiencies were measured on
    gemm_bf16: Efficiency
    gemm_fp8: Efficiency
    fp8_quantize: Efficiency
    quantize_bytes_per_element: float
    attention: dict              # backend -> Efficiency
    projection_attention: str
    eras: tuple[Era, ...]
    reserve_bytes: int
    reserve_source: str
    tile_overlap_px: int
    tiling_source: str
    vae_tile_px: int
    vae_tile_overlap_px: int
    vae_tiled_source: str
    pillow_max_image_pixels: int
    pillow_source: str
    route: RouteStages | None = None     # the route's other stages; None: the refinement only
    # the GPUs of the measured one's compute capability (itself among them): the same attention kernels, so its
    # per-backend efficiencies and the attention family's gain hold there too
    same_kernels: tuple[str, ...] = ()


@dataclass(frozen=True)
class BudgetData:
    gpus: dict                   # key -> Gpu
    models: dict                 # key -> Model
    measured: Measured


@dataclass(frozen=True)
class Cap:
    where: str                   # "comfy_extras/nodes_load_3d.py:7"
    value: int
    what: str                    # the input's name, or "MAX_RESOLUTION"
    node: str = ""               # the node class the input belongs to, "" at module level


@dataclass(frozen=True)
class TargetCaps:
    """What the target's files allow, as read (applier/budget/caps.py)."""
    max_resolution: int | None
    max_resolution_where: str
    pillow_max_image_pixels: int | None      # None: no bound (someone set None)
    pillow_where: str
    hard_caps: tuple[Cap, ...] = ()
    notes: tuple[str, ...] = ()
    target: str = "<TARGET>"                 # the install, as a command line names it (the fixes' --target)


@dataclass(frozen=True)
class Canvas:
    width: int
    height: int
    frames: int = 1

    @property
    def label(self) -> str:
        return f"{self.width}x{self.height}" + (f"x{self.frames}" if self.frames > 1 else "")


@dataclass(frozen=True)
class Request:
    """What a budget answers: a model on a GPU at a canvas, with its steps and the time a generation may take."""
    model: Model
    gpu: Gpu
    canvas: Canvas
    steps: int                           # the steps a native generation is priced at
    cfg_forwards: int
    within_s: float = DEFAULT_WITHIN_S
    comfyui_version: str | None = None
    windows: bool = False
    memory_mib: int | None = None        # the detected GPU's memory; the table's when None
    gpu_how: str = "--gpu"               # "--gpu" | "detected"
    tiled_steps: int | None = None       # the steps a tiled route is priced at; None: `steps`
    steps_how: str = ""                  # where the steps come from, in words ("--steps", the model's sampler)
    tiled_steps_how: str = ""            # likewise for the tiled route (the pack's template)
    cpu_cores: int | None = None         # the host's cores for a route's host stages; None: the measuring host's
    dynamic_vram: bool = False           # the target's main.py starts DynamicVRAM (budget.vram): FP8 codes per call
    vram_how: str = ""                  # how that was told, in words

    @property
    def route_steps(self) -> int:
        return self.tiled_steps or self.steps

    @property
    def memory_bytes(self) -> int:
        return (self.memory_mib or self.gpu.memory_mib) * 1024 * 1024
