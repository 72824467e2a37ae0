"""What a canvas costs on a GPU: tokens, FLOPs, memory, seconds per step and a verdict (`applier budget`).

Pure arithmetic over data: the GPU table, the model families and the measured efficiencies arrive as BudgetData
(applier/budget/data.py reads them from applier/data/), the target's caps as TargetCaps (applier/budget/caps.py);
nothing here reads a file or prints. The model (docs/budget.md):

    one forward = attention FLOPs / (bf16 peak x attention efficiency of the SDPA backend that runs)
                + GEMM FLOPs / (bf16 or FP8 peak x GEMM efficiency) [+ FP8 input quantisation bytes / bandwidth]
                + elementwise bytes / (bandwidth x the release's elementwise efficiency)
                + the release's per-forward host gap [+ weights that do not fit, streamed over the host link]
    one step = forwards per step (2 with classifier-free guidance) x one forward; a generation = steps x one step

Efficiencies are fractions of the measuring GPU's published peaks; on any other GPU the same fractions of its own
published peaks are a projection, and every time figure says which it is.

The budget layer (this package) sits beside the overlay pack's installer: it imports only the store's bounded reads
(caps.py) and the small shared modules.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from applier.errors import RefusedError
from applier.resources import load_pack_module
from applier.strenum import StrEnum

GIB = 1024 ** 3
BF16_BYTES = 2
FP8_BYTES = 1
DEFAULT_WITHIN_S = 3600.0
# The configs a budget prices, by the names benchmarks/generation.py gives them; each is a set of overlay families.
CONFIGS = {
    "stock": (),
    "overlay": ("elementwise",),
    "overlay_attention": ("attention",),
    "overlay_fp8": ("elementwise", "fp8"),
    "overlay_all": ("elementwise", "attention"),
    "overlay_all_fp8": ("elementwise", "attention", "fp8"),
}
FP8_ASSUMES = ("FP8 times are device time, as measured with --disable-dynamic-vram; under DynamicVRAM small canvases "
               "are host-bound and slower (benchmarks/results/budget-validation.json)")
FAMILY_WORDS = {"elementwise": "norm_rope + adaln + gate", "attention": "attention (fastest exact SDPA backend)",
                "fp8": "fp8_linear"}
# The lowest compute capability each family runs on: Triton bf16 kernels and cuDNN/flash attention need Ampere,
# FP8 tensor cores Ada (sm_89) or later.
FAMILY_MIN_CAPABILITY = {"elementwise": (8, 0), "attention": (8, 0), "fp8": (8, 9)}


class UnknownModelError(RefusedError):
    """--model names no model family of the table."""


class UnknownGpuError(RefusedError):
    """The GPU is not in the table (or none was detected): the user names one with --gpu."""


# ---------------------------------------------------------------- data

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


@dataclass(frozen=True)
class TargetCaps:
    """What the target's files allow, as read (applier/budget/caps.py)."""
    max_resolution: int | None
    max_resolution_where: str
    pillow_max_image_pixels: int | None      # None: no bound (someone set None)
    pillow_where: str
    hard_caps: tuple[Cap, ...] = ()
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Canvas:
    width: int
    height: int
    frames: int = 1

    @property
    def label(self) -> str:
        return f"{self.width}x{self.height}" + (f"x{self.frames}" if self.frames > 1 else "")


# ---------------------------------------------------------------- inputs

_SIZE = re.compile(r"^\s*(\d+)\s*[xX*]\s*(\d+)\s*$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([dhms])", re.IGNORECASE)
_UNIT_S = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}


def parse_size(text: str) -> tuple[int, int]:
    """"32768x18432" -> (32768, 18432): width then height, as ComfyUI's nodes take them. ValueError otherwise."""
    match = _SIZE.match(text or "")
    if not match:
        raise ValueError(f"{text!r} is not a size: give WIDTHxHEIGHT, e.g. 32768x18432")
    width, height = int(match.group(1)), int(match.group(2))
    if width < 16 or height < 16:
        raise ValueError(f"{text!r}: width and height must be at least 16 pixels")
    return width, height


def parse_duration(text: str) -> float:
    """Seconds in "1h", "90m", "2h30m", "45s", "1d" or a plain number of seconds. ValueError otherwise."""
    text = (text or "").strip()
    try:
        seconds = float(text)
    except ValueError:
        parts = _DURATION_PART.findall(text)
        if not parts or _DURATION_PART.sub("", text).strip():
            raise ValueError(f"{text!r} is not a duration: give e.g. 1h, 90m, 2h30m or seconds") from None
        seconds = sum(float(number) * _UNIT_S[unit.lower()] for number, unit in parts)
    if not seconds > 0 or math.isinf(seconds):
        raise ValueError(f"{text!r}: a duration must be positive")
    return seconds


def _normal(name: str) -> str:
    """A name as matched: lower case, "NVIDIA" and "GeForce" left out, separators as single spaces."""
    words = re.split(r"[\s_-]+", name.strip().lower())
    return " ".join(w for w in words if w and w not in ("nvidia", "geforce"))


def find_model(data: BudgetData, name: str) -> Model:
    wanted = _normal(name).replace(" ", "-")
    for model in data.models.values():
        if wanted == model.key or wanted in model.aliases:
            return model
    known = ", ".join(f"{m.key} ({m.name})" for m in data.models.values())
    raise UnknownModelError(f"no model family {name!r} in the budget's table", hint=f"known: {known}")


def find_gpu(data: BudgetData, name: str) -> Gpu | None:
    """The row whose key or one of whose names matches `name` (an nvidia-smi name or a short form), or None."""
    wanted = _normal(name)
    for gpu in data.gpus.values():
        if wanted in (_normal(gpu.key.replace("-", " ")), _normal(gpu.name), *(_normal(n) for n in gpu.names)):
            return gpu
    return None


def known_gpus(data: BudgetData) -> str:
    return ", ".join(f"{g.key} ({g.name})" for g in data.gpus.values())


def choose_gpu(data: BudgetData, given: str | None, detected: list[tuple[str, int | None]],
               problem: str | None = None) -> tuple[Gpu, str, int | None]:
    """(the GPU row, "--gpu" or "detected", the detected memory in MiB or None) for --gpu NAME, else for the first
    detected GPU (ComfyUI runs on cuda:0). UnknownGpuError, naming the known rows, when neither gives a row."""
    hint = f"name one with --gpu: {known_gpus(data)}"
    if given:
        gpu = find_gpu(data, given)
        if gpu is None:
            raise UnknownGpuError(f"no GPU {given!r} in the budget's table", hint=hint)
        return gpu, "--gpu", None
    if not detected:
        why = problem or "nvidia-smi found no GPU"
        raise UnknownGpuError(f"no GPU detected ({why}): the budget needs one", hint=hint)
    name, memory_mib = detected[0]
    gpu = find_gpu(data, name)
    if gpu is None:
        raise UnknownGpuError(f"the detected GPU {name!r} is not in the budget's table", hint=hint)
    return gpu, "detected", memory_mib


def era_for(measured: Measured, comfyui_version: str | None) -> tuple[Era, str]:
    """The release range whose behaviour the budget assumes, and in words why."""
    newest = measured.eras[-1]
    if not comfyui_version:
        return newest, "ComfyUI version unknown: the newest releases' behaviour assumed"
    try:
        version = Version(comfyui_version)
    except InvalidVersion:
        return newest, f"ComfyUI version {comfyui_version!r} not understood: the newest releases' behaviour assumed"
    for era in measured.eras:
        if version in SpecifierSet(era.releases):
            return era, f"ComfyUI {comfyui_version}"
    return newest, f"ComfyUI {comfyui_version} is in no known range: the newest releases' behaviour assumed"


# ---------------------------------------------------------------- counts

@dataclass(frozen=True)
class Tokens:
    latent_width: int
    latent_height: int
    latent_frames: int
    image: int                   # image tokens at the model's full resolution (downsample 1)
    text: int

    @property
    def all(self) -> int:
        return self.image + self.text


def latent_frames(model: Model, frames: int) -> int:
    """A video VAE keeps the first frame and packs the rest 4 to 1: (frames - 1) // 4 + 1 latent frames."""
    if not model.video:
        return 1
    return (max(frames, 1) - 1) // model.vae.temporal_factor + 1


def token_counts(model: Model, canvas: Canvas) -> Tokens:
    lw, lh = canvas.width // model.vae.factor, canvas.height // model.vae.factor
    frames = latent_frames(model, canvas.frames)
    image = math.ceil(lw / model.patch) * math.ceil(lh / model.patch) * frames
    return Tokens(lw, lh, frames, image, model.text_tokens)


def _group_tokens(model: Model, tokens: Tokens, group: BlockGroup) -> dict:
    """Tokens per token set at this group's level (SDXL's UNet levels halve each side)."""
    step = model.patch * group.downsample
    image = math.ceil(tokens.latent_width / step) * math.ceil(tokens.latent_height / step) * tokens.latent_frames
    return {"image": image, "text": tokens.text, "all": image + tokens.text}


@dataclass(frozen=True)
class Work:
    """What one forward of the model does at one canvas."""
    tokens: Tokens
    attention_flop: float         # the sum of attention_calls' FLOPs
    gemm_flop: float
    fp8_gemm_flop: float          # the part of gemm_flop FP8 linears can take
    quantize_elements: float      # FP8 linears' input elements
    elementwise_bytes: float
    fp8_parameters: int           # weights of the linears FP8 replaces
    # (sequence length, FLOPs) of the attention calls by length: the geometric mean of the query and key counts
    # (the tokens of a self-attention; a cross-attention's short key set makes it short)
    attention_calls: tuple[tuple[float, float], ...] = ()


def forward_work(model: Model, canvas: Canvas) -> Work:
    tokens = token_counts(model, canvas)
    attention = gemm = fp8_gemm = quantize = elementwise = 0.0
    fp8_parameters = 0
    calls: dict = {}
    for group in model.groups:
        sets = _group_tokens(model, tokens, group)
        for queries, keys in group.attention:
            flop = group.count * 4.0 * sets[queries] * sets[keys] * group.heads * group.head_dim
            attention += flop
            length = math.sqrt(sets[queries] * sets[keys])
            calls[length] = calls.get(length, 0.0) + flop
        for linear in group.linears:
            flop = group.count * 2.0 * linear.fan_in * linear.fan_out * sets[linear.tokens]
            gemm += flop
            if group.fp8:
                fp8_gemm += flop
                quantize += group.count * float(linear.fan_in) * sets[linear.tokens]
                fp8_parameters += group.count * group.weight_copies * linear.fan_in * linear.fan_out
        elementwise += group.count * group.elementwise_passes * group.width * sets[group.stream] * BF16_BYTES
    return Work(tokens, attention, gemm, fp8_gemm, quantize, elementwise, fp8_parameters,
                tuple(sorted(calls.items())))


def weight_bytes(model: Model, work: Work, fp8: bool) -> int:
    """The weights in memory: bf16, or with FP8 linears replacing theirs (the node's default fp8_weights=replace)."""
    if not fp8:
        return model.parameters * BF16_BYTES
    return work.fp8_parameters * FP8_BYTES + (model.parameters - work.fp8_parameters) * BF16_BYTES


def activation_bytes(model: Model, tokens: Tokens) -> int:
    return int(model.activation_widths * model.hidden * (tokens.image + _stream_text(model, tokens)) * BF16_BYTES)


def hidden_state_bytes(model: Model, tokens: Tokens) -> int:
    """One activation tensor: the residual stream, hidden x tokens in bf16."""
    return model.hidden * (tokens.image + _stream_text(model, tokens)) * BF16_BYTES


def _stream_text(model: Model, tokens: Tokens) -> int:
    return tokens.text if model.groups and model.groups[0].stream == "all" else 0


# ---------------------------------------------------------------- time

@dataclass(frozen=True)
class Priced:
    """One config at one canvas: seconds per forward by part, memory, and how far the figures are measured."""
    config: str
    families: tuple[str, ...]
    available: bool
    reason: str                          # why not available, or "" / a note
    predicted: bool = True               # False: the config runs but its time is not modelled (memory only)
    attention_s: float = 0.0
    gemm_s: float = 0.0
    quantize_s: float = 0.0
    elementwise_s: float = 0.0
    host_s: float = 0.0
    stream_s: float = 0.0
    weights_bytes: int = 0
    streamed_bytes: int = 0
    fits: bool = True
    attention_backend: str = ""

    @property
    def forward_s(self) -> float:
        return (self.attention_s + self.gemm_s + self.quantize_s + self.elementwise_s + self.host_s
                + self.stream_s)


def config_available(config: str, model: Model, gpu: Gpu) -> tuple[bool, str]:
    families = CONFIGS[config]
    for family in families:
        need = FAMILY_MIN_CAPABILITY[family]
        if gpu.compute_capability < need:
            return False, f"{FAMILY_WORDS[family]} needs sm_{need[0]}{need[1]}+ ({gpu.name} is sm_" \
                          f"{gpu.compute_capability[0]}{gpu.compute_capability[1]})"
        if family == "fp8" and not gpu.fp8_tflops:
            return False, f"{gpu.name} has no FP8 tensor cores"
    return True, ""


def _attention_efficiency(measured: Measured, gpu: Gpu, backend: str) -> Efficiency:
    if gpu.key == measured.gpu:
        return measured.attention[backend]
    return measured.attention[measured.projection_attention]


def _fastest_backend(measured: Measured, gpu: Gpu, tokens: float) -> str:
    return max(measured.attention, key=lambda b: _attention_efficiency(measured, gpu, b).at(tokens))


def attention_seconds(work: Work, measured: Measured, gpu: Gpu, backend: str | None) -> tuple[float, str]:
    """Seconds of one forward's attention calls, each at its length's efficiency, on `backend` (None: the fastest
    backend for each length, as the attention family picks per shape); and the backend of the longest calls."""
    bf16 = gpu.bf16_tflops * 1e12
    seconds, main = 0.0, backend or ""
    calls = work.attention_calls or ((float(work.tokens.all), work.attention_flop),)
    for length, flop in calls:
        chosen = backend or _fastest_backend(measured, gpu, length)
        seconds += flop / (bf16 * _attention_efficiency(measured, gpu, chosen).at(length))
        main = chosen if length == calls[-1][0] else main
    return seconds, main


def price(config: str, model: Model, gpu: Gpu, measured: Measured, era: Era, work: Work, *,
          memory_bytes: int, windows: bool = False) -> Priced:
    """Seconds per forward of one config, and whether it fits."""
    families = CONFIGS[config]
    available, reason = config_available(config, model, gpu)
    if not available:
        return Priced(config, families, False, reason)
    fp8 = "fp8" in families
    stock_backend = era.stock_attention_windows if windows else era.stock_attention
    attention_s, backend = attention_seconds(work, measured, gpu, None if "attention" in families else stock_backend)
    bf16 = gpu.bf16_tflops * 1e12
    bandwidth = gpu.bandwidth_gbs * 1e9
    if fp8:
        gemm_s = (work.fp8_gemm_flop / (gpu.fp8_tflops * 1e12 * measured.gemm_fp8.value)
                  + (work.gemm_flop - work.fp8_gemm_flop) / (bf16 * measured.gemm_bf16.value))
        quantize_s = (work.quantize_elements * measured.quantize_bytes_per_element
                      / (bandwidth * measured.fp8_quantize.value))
    else:
        gemm_s, quantize_s = work.gemm_flop / (bf16 * measured.gemm_bf16.value), 0.0
    elementwise_s = work.elementwise_bytes / (bandwidth * era.other.value)
    notes = []
    if "elementwise" in families:
        if model.overlay_blocks:
            elementwise_s *= era.elementwise_factor.value
        else:
            notes.append("the elementwise families do not know this model's blocks: they stay stock")
    if "attention" in families and gpu.key != measured.gpu:
        notes.append(f"the attention family's gain is measured on {measured.gpu} only: none predicted here")
    weights = weight_bytes(model, work, fp8)
    room = memory_bytes - activation_bytes(model, work.tokens) - measured.reserve_bytes
    streamed = max(0, weights - room) if room > 0 else 0
    stream_s = streamed / (gpu.host_link_gbs * 1e9)
    predicted = not (fp8 and model.fp8_path != "blocks")
    if not predicted:
        notes.append("FP8 through the seam for models the block families do not know is host-bound (measured "
                     "slower than stock on Qwen-Image, generation-0.33.0.json): memory only, no time predicted")
    return Priced(config, families, True, "; ".join(notes), predicted, attention_s, gemm_s, quantize_s,
                  elementwise_s, era.host_gap_s.value, stream_s, weights, streamed, room > 0, backend)


# ---------------------------------------------------------------- memory of the decode

def vae_decode_bytes(model: Model, canvas: Canvas, tile_px: int | None = None) -> int:
    """ComfyUI's own estimate of the decode's device memory (comfy/sd.py VAE.memory_used_decode), for the whole
    canvas or one tile of tile_px x tile_px. A video VAE decodes frame after frame through its cache: the estimate
    is per frame."""
    width, height = (canvas.width, canvas.height) if tile_px is None else (min(tile_px, canvas.width),
                                                                           min(tile_px, canvas.height))
    per_pixel = model.vae.decode_bytes_per_pixel
    if model.video and model.vae.decode_bytes_per_pixel_video and latent_frames(model, canvas.frames) > 4:
        per_pixel = model.vae.decode_bytes_per_pixel_video
    return int(per_pixel * width * height * BF16_BYTES)


def output_image_bytes(canvas: Canvas) -> int:
    """The decoded IMAGE ComfyUI holds on the host: float32 RGB per pixel and frame."""
    return canvas.width * canvas.height * canvas.frames * 3 * 4


# ---------------------------------------------------------------- caps

def caps_verdict(canvas: Canvas, caps: TargetCaps | None) -> dict:
    """Whether the target's caps, as its files hold them, let this canvas through, and which do not."""
    if caps is None:
        return {"checked": False, "allowed": None, "blocking": [], "node_caps": [],
                "notes": ["no ComfyUI at the target: caps not read"]}
    longest = max(canvas.width, canvas.height)
    blocking, facts = [], []
    if caps.max_resolution is None:
        facts.append(f"no MAX_RESOLUTION found ({caps.max_resolution_where})")
    elif longest > caps.max_resolution:
        blocking.append({"cap": "MAX_RESOLUTION", "where": caps.max_resolution_where, "value": caps.max_resolution,
                         "effect": f"EmptyLatentImage and the core image nodes refuse a side of {longest} "
                                   f"(ComfyUI's 'Value {longest} bigger than max of {caps.max_resolution}')",
                         "fix": "applier apply --target <TARGET> --only comfyui/max-resolution"})
    else:
        facts.append(f"MAX_RESOLUTION {caps.max_resolution} ({caps.max_resolution_where}) allows {longest}")
    pixels = canvas.width * canvas.height
    if caps.pillow_max_image_pixels is None:
        facts.append(f"Pillow's decompression-bomb bound is off ({caps.pillow_where})")
    elif pixels > 2 * caps.pillow_max_image_pixels:
        blocking.append({"cap": "PIL.Image.MAX_IMAGE_PIXELS", "where": caps.pillow_where,
                         "value": caps.pillow_max_image_pixels,
                         "effect": f"LoadImage refuses the saved {canvas.width}x{canvas.height} image "
                                   f"(DecompressionBombError above {2 * caps.pillow_max_image_pixels:,} pixels)",
                         "fix": "applier apply --target <TARGET> --only comfyui/pil-pixel-limit"})
    else:
        facts.append(f"Pillow opens {pixels:,} pixels (bound {caps.pillow_max_image_pixels:,}, {caps.pillow_where})")
    node_caps = [{"cap": cap.what, "where": cap.where, "value": cap.value,
                  "effect": f"this input refuses a side of {longest} where a workflow uses its node",
                  "fix": "a hard-coded cap: MAX_RESOLUTION does not reach it (edit or avoid that node)"}
                 for cap in caps.hard_caps if cap.value < longest]
    return {"checked": True, "allowed": not blocking, "blocking": blocking, "node_caps": node_caps,
            "notes": facts + list(caps.notes)}


# ---------------------------------------------------------------- the budget

@dataclass(frozen=True)
class Request:
    model: Model
    gpu: Gpu
    canvas: Canvas
    steps: int
    cfg_forwards: int
    within_s: float = DEFAULT_WITHIN_S
    comfyui_version: str | None = None
    windows: bool = False
    memory_mib: int | None = None        # the detected GPU's memory; the table's when None
    gpu_how: str = "--gpu"               # "--gpu" | "detected"


def _price_all(request: Request, data: BudgetData, era: Era, canvas: Canvas) -> tuple[Work, list[Priced]]:
    work = forward_work(request.model, canvas)
    memory = (request.memory_mib or request.gpu.memory_mib) * 1024 * 1024
    return work, [price(name, request.model, request.gpu, data.measured, era, work, memory_bytes=memory,
                        windows=request.windows) for name in CONFIGS]


def _runnable(priced: list[Priced]) -> list[Priced]:
    return [p for p in priced if p.available and p.predicted and p.fits]


def plan_budget(data: BudgetData, request: Request, caps: TargetCaps | None = None) -> dict:
    """The whole report, as the `--json` document (docs/budget.md describes every key)."""
    model, gpu, canvas, measured = request.model, request.gpu, request.canvas, data.measured
    era, era_why = era_for(measured, request.comfyui_version)
    work, priced = _price_all(request, data, era, canvas)
    per_step = request.cfg_forwards
    stock = priced[0]
    basis = (f"measured: efficiencies from {gpu.name}'s own runs" if gpu.key == measured.gpu else
             f"projected from {gpu.name}'s published peaks with {data.gpus[measured.gpu].name}'s measured "
             "efficiencies")
    memory_bytes = (request.memory_mib or gpu.memory_mib) * 1024 * 1024
    configs = []
    for p in priced:
        entry = {"config": p.config, "families": [FAMILY_WORDS[f] for f in p.families], "available": p.available,
                 "note": p.reason}
        if p.available:
            entry.update({"predicted": p.predicted, "fits": p.fits, "weights_bytes": p.weights_bytes,
                          "streamed_weights_bytes": p.streamed_bytes})
        if p.available and p.predicted:
            step_s = p.forward_s * per_step
            entry.update({
                "attention_backend": p.attention_backend,
                "seconds_per_forward": {"attention": p.attention_s, "gemm": p.gemm_s, "fp8_quantize": p.quantize_s,
                                        "elementwise": p.elementwise_s, "host_gap": p.host_s,
                                        "weight_streaming": p.stream_s, "total": p.forward_s},
                "seconds_per_step": step_s, "seconds_per_generation": step_s * request.steps,
                "speedup_vs_stock": stock.forward_s / p.forward_s if stock.available else None,
                "basis": basis + ("; weights streamed over the host link: not measured" if p.streamed_bytes
                                  else ""),
            })
        configs.append(entry)
    vae_tile = measured.vae_tile_px
    report = {
        "model": {"key": model.key, "name": model.name, "parameters": model.parameters,
                  "source": model.sources.get("source", "")},
        "gpu": {"key": gpu.key, "name": gpu.name, "how": request.gpu_how, "measured": gpu.key == measured.gpu,
                "basis": basis, "memory_bytes": memory_bytes, "bandwidth_gbs": gpu.bandwidth_gbs,
                "bf16_tflops": gpu.bf16_tflops, "fp8_tflops": gpu.fp8_tflops, "int8_tops": gpu.int8_tops,
                "compute_capability": ".".join(map(str, gpu.compute_capability)), "source": gpu.source},
        "canvas": {"width": canvas.width, "height": canvas.height, "frames": canvas.frames,
                   "pixels": canvas.width * canvas.height * canvas.frames},
        "comfyui": {"version": request.comfyui_version, "era": era.name, "why": era_why,
                    "stock_attention": era.stock_attention_windows if request.windows else era.stock_attention},
        "steps": request.steps, "forwards_per_step": per_step, "within_seconds": request.within_s,
        "tokens": {"latent": {"width": work.tokens.latent_width, "height": work.tokens.latent_height,
                              "frames": work.tokens.latent_frames, "channels": model.vae.channels},
                   "image": work.tokens.image, "text": work.tokens.text,
                   "stream": work.tokens.image + _stream_text(model, work.tokens)},
        "per_forward": {"attention_flop": work.attention_flop, "gemm_flop": work.gemm_flop,
                        "fp8_capable_gemm_flop": work.fp8_gemm_flop},
        "memory": {"weights_bf16_bytes": weight_bytes(model, work, False),
                   "weights_fp8_bytes": weight_bytes(model, work, True),
                   "activation_peak_bytes": activation_bytes(model, work.tokens),
                   "hidden_state_bytes": hidden_state_bytes(model, work.tokens),
                   "reserve_bytes": measured.reserve_bytes, "gpu_bytes": memory_bytes,
                   "activations_fit": stock.fits},
        "vae_decode": {"whole_bytes": vae_decode_bytes(model, canvas),
                       "whole_fits": vae_decode_bytes(model, canvas) + measured.reserve_bytes <= memory_bytes,
                       "tiled_bytes": vae_decode_bytes(model, canvas, vae_tile), "tile_px": vae_tile,
                       "tile_overlap_px": measured.vae_tile_overlap_px,
                       "output_image_host_bytes": output_image_bytes(canvas),
                       "source": f"{model.vae.source}; {measured.vae_tiled_source}"},
        "configs": configs,
        "caps": caps_verdict(canvas, caps),
    }
    report["tiled_routes"] = tiled_routes(data, request, era)
    report["verdict"] = verdict(report, request)
    return report


def _tiling():
    """The overlay pack's planner and its table of the models the Tiled Sampling node tiles (fused_dit/tiling, loaded
    by path: torch-free), so that the budget prices the tiles, the batch and the memory the node plans."""
    return load_pack_module("tiling.plan"), load_pack_module("tiling.models")


def tile_shape(model: Model, tile_px: int, overlap_px: int, plan_module, known) -> object:
    """The planner's ModelShape of a budget model: the node's own entry where it tiles the model, else one made of
    the budget's numbers (batch of 1: nothing measured)."""
    text_in_stream = bool(model.groups) and model.groups[0].stream == "all"
    mine = next((shape for shape in known.MODELS.values() if shape.key == model.key), None)
    return plan_module.ModelShape(model.key, model.patch, model.vae.factor, model.hidden, model.activation_widths,
                                  model.text_tokens, text_in_stream, tile_px, overlap_px,
                                  mine.max_batch if mine else 1)


def tiled_routes(data: BudgetData, request: Request, era: Era) -> list[dict]:
    """Each tile size of the model's list smaller than the canvas, as the Tiled Sampling node would run it: the tiles
    and the batch its planner chooses in the memory beside the weights, and the fastest config's cost."""
    plan_module, known = _tiling()
    canvas, overlap = request.canvas, data.measured.tile_overlap_px
    tokens = token_counts(request.model, canvas)
    memory = (request.memory_mib or request.gpu.memory_mib) * 1024 * 1024
    node = any(shape.key == request.model.key for shape in known.MODELS.values())
    routes = []
    for tile in request.model.tile_px:
        if tile >= max(canvas.width, canvas.height) or tile <= overlap:
            continue
        tile_canvas = Canvas(min(tile, canvas.width), min(tile, canvas.height), canvas.frames)
        work, priced = _price_all(request, data, era, tile_canvas)
        runnable = _runnable(priced)
        best = min(runnable, key=lambda p: p.forward_s) if runnable else None
        weights = best.weights_bytes if best else weight_bytes(request.model, work, True)
        shape = tile_shape(request.model, tile, overlap, plan_module, known)
        settings = plan_module.choose(shape, tokens.latent_height, tokens.latent_width,
                                      max(0, memory - weights - data.measured.reserve_bytes),
                                      frames=tokens.latent_frames)
        route = {"node": "Tiled Sampling" if node else None, "tile_px": tile, "overlap_px": overlap,
                 "tiles": settings.plan.count, "batch": settings.batch,
                 "tile_activation_bytes": settings.tile_bytes,
                 "peak_bytes": weights + settings.batch * settings.tile_bytes + data.measured.reserve_bytes,
                 "fits": bool(runnable) and weights + settings.tile_bytes + data.measured.reserve_bytes <= memory,
                 "settings": {"tile_px": tile, "overlap_px": overlap, "tile_batch": settings.batch}}
        if route["fits"]:
            per_tile = best.forward_s * request.cfg_forwards * request.steps
            count = settings.plan.count
            route.update({"config": best.config, "seconds_per_tile": per_tile, "seconds": per_tile * count,
                          "stock_seconds": (priced[0].forward_s * request.cfg_forwards * request.steps * count
                                            if priced[0] in runnable else None)})
        routes.append(route)
    return routes


def route_words(route: dict) -> str:
    """How a tiled route is run: the node and the settings it would plan, or that no node of the pack tiles it."""
    if route["node"] is None:
        return (f"{route['tiles']} tiles of {route['tile_px']} px (no node of the pack tiles this model: Tiled "
                "Sampling knows Flux, Qwen-Image and Wan 2.1)")
    return (f"Tiled Sampling, tile_px {route['tile_px']}, overlap_px {route['overlap_px']}, tile_batch "
            f"{route['batch']}: {route['tiles']} tiles")


class VerdictKind(StrEnum):
    """The verdict on a canvas (the "kind" of the report's verdict)."""
    NATIVE = "native"               # fits in memory and finishes within the time given
    TILED = "tiled"                 # a tile size that fits finishes within it
    OUT_OF_REACH = "out of reach"


def verdict(report: dict, request: Request) -> dict:
    """native (fits and finishes within the time given), tiled (a tile size that does), or out of reach."""
    within = request.within_s
    runnable = [c for c in report["configs"] if c.get("seconds_per_generation") is not None and c["fits"]]
    reasons = []
    if runnable:
        best = min(runnable, key=lambda c: c["seconds_per_generation"])
        stock = next((c for c in runnable if c["config"] == "stock"), None)
        chosen = stock if stock and stock["seconds_per_generation"] <= within else best
        if chosen["seconds_per_generation"] <= within:
            return {"kind": VerdictKind.NATIVE, "config": chosen["config"], "seconds": chosen["seconds_per_generation"],
                    "reasons": [f"fits in memory and finishes within {human_seconds(within)}"]
                    + _cap_reasons(report)}
        reasons.append(f"native: {human_seconds(best['seconds_per_generation'])} with {best['config']}, over the "
                       f"{human_seconds(within)} given")
    else:
        memory = report["memory"]
        reasons.append(f"native: one forward's activations ({memory['activation_peak_bytes'] / GIB:.1f} GiB) do "
                       f"not fit in {memory['gpu_bytes'] / GIB:.1f} GiB")
    routes = [r for r in report["tiled_routes"] if r["fits"]]
    in_time = [r for r in routes if r["seconds"] <= within]
    if in_time:
        route = in_time[0]          # the largest tile that finishes in time: fewest seams
        return {"kind": VerdictKind.TILED, "config": route["config"], "seconds": route["seconds"], "tile": route,
                "reasons": reasons + [f"{route_words(route)} finish in {human_seconds(route['seconds'])} with "
                                      f"{route['config']}"]
                + _cap_reasons(report)}
    if routes:
        cheapest = min(routes, key=lambda r: r["seconds"])
        reasons.append(f"tiled: the cheapest route ({route_words(cheapest)}, {cheapest['config']}) takes "
                       f"{human_seconds(cheapest['seconds'])}")
    elif report["tiled_routes"]:
        reasons.append("tiled: no tile size of the model's fits in memory")
    else:
        reasons.append("tiled: the canvas is no larger than the model's tiles")
    return {"kind": VerdictKind.OUT_OF_REACH, "config": None, "seconds": None, "reasons": reasons + _cap_reasons(report)}


def _cap_reasons(report: dict) -> list[str]:
    caps = report["caps"]
    reasons = [f"blocked by {b['cap']} = {b['value']} ({b['where']}): {b['effect']}" for b in caps["blocking"]]
    if caps["node_caps"]:
        reasons.append(f"{len(caps['node_caps'])} node input(s) with a hard-coded cap below the size "
                       "(they refuse it only where a workflow uses their node)")
    return reasons


# ---------------------------------------------------------------- words

def human_bytes(count: float) -> str:
    for unit, size in (("TiB", 1024 ** 4), ("GiB", GIB), ("MiB", 1024 ** 2)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count / 1024:.1f} KiB"


def human_seconds(seconds: float) -> str:
    if seconds >= 86400 * 2:
        return f"{seconds / 86400:.1f} d"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.3g} s"


def report_lines(report: dict) -> list[str]:
    """The report in words, one line each, for the terminal."""
    tokens, memory, vae = report["tokens"], report["memory"], report["vae_decode"]
    canvas = report["canvas"]
    size = f"{canvas['width']}x{canvas['height']}" + (f", {canvas['frames']} frames" if canvas["frames"] > 1 else "")
    latent = tokens["latent"]
    lines = [
        f"{report['model']['name']} at {size} on {report['gpu']['name']} ({report['gpu']['how']})",
        f"basis          {report['gpu']['basis']}",
        f"comfyui        {report['comfyui']['why']}: {report['comfyui']['era']}",
        f"latent         {latent['width']}x{latent['height']}" + (f"x{latent['frames']}" if latent["frames"] > 1
                                                                    else "") + f", {latent['channels']} channels",
        f"tokens         {tokens['image']:,} image + {tokens['text']:,} text; stream {tokens['stream']:,}",
        f"per forward    attention {report['per_forward']['attention_flop']:.3g} FLOP, "
        f"GEMMs {report['per_forward']['gemm_flop']:.3g} FLOP; "
        + ("1 forward per step" if report["forwards_per_step"] == 1 else
           f"{report['forwards_per_step']} forwards per step (classifier-free guidance)"),
        f"memory         weights {human_bytes(memory['weights_bf16_bytes'])} bf16 / "
        f"{human_bytes(memory['weights_fp8_bytes'])} with FP8 linears; activations "
        f"{human_bytes(memory['activation_peak_bytes'])} peak (one hidden state "
        f"{human_bytes(memory['hidden_state_bytes'])}); GPU {human_bytes(memory['gpu_bytes'])}",
        f"vae decode     whole {human_bytes(vae['whole_bytes'])}" + ("" if vae["whole_fits"] else " (does not fit: "
                                                                      "ComfyUI falls back to tiles)")
        + f"; tiled {human_bytes(vae['tiled_bytes'])} per {vae['tile_px']} px tile; image on the host "
          f"{human_bytes(vae['output_image_host_bytes'])}",
    ]
    steps = report["steps"]
    for config in report["configs"]:
        name = f"{config['config']:18}"
        if not config["available"]:
            lines.append(f"  {name} not on this GPU: {config['note']}")
        elif not config["predicted"]:
            lines.append(f"  {name} weights {human_bytes(config['weights_bytes'])}; time not predicted: "
                         f"{config['note']}")
        else:
            fits = "" if config["fits"] else "  [activations do not fit]"
            speed = config["speedup_vs_stock"]
            lines.append(f"  {name} {human_seconds(config['seconds_per_step'])}/step, "
                         f"{human_seconds(config['seconds_per_generation'])} for {steps} steps"
                         + (f" ({speed:.2f}x stock)" if speed and config["config"] != "stock" else "") + fits
                         + (f"  [{human_bytes(config['streamed_weights_bytes'])} of weights streamed]"
                            if config["streamed_weights_bytes"] else ""))
    if any("fp8" in c["config"] and c.get("seconds_per_step") for c in report["configs"]):
        lines.append(f"  ({FP8_ASSUMES})")
    caps = report["caps"]
    if not caps["checked"]:
        lines.append(f"caps           {'; '.join(caps['notes'])}")
    else:
        lines.append("caps           " + ("the target's caps allow this size" if caps["allowed"] else
                                          f"{len(caps['blocking'])} cap(s) refuse this size"))
        lines += [f"  {b['cap']} = {b['value']} at {b['where']}: {b['effect']}; {b['fix']}" for b in caps["blocking"]]
        lines += [f"  node cap: {c['cap']} = {c['value']} at {c['where']}: {c['effect']}" for c in caps["node_caps"]]
        lines += [f"  {note}" for note in caps["notes"]]
    for route in report["tiled_routes"]:
        cost = (f"{human_seconds(route['seconds'])} with {route['config']}, peak "
                f"{human_bytes(route['peak_bytes'])}" if route["fits"] else "does not fit in memory")
        lines.append(f"tiled route    {route_words(route)}: {cost}")
    result = report["verdict"]
    lines.append(f"verdict        {result['kind'].upper()}"
                 + (f" with {result['config']}, {human_seconds(result['seconds'])}" if result["config"] else "")
                 + f" (within {human_seconds(report['within_seconds'])})")
    lines += [f"  {reason}" for reason in result["reasons"]]
    return lines
