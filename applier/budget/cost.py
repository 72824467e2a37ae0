"""The cost model: what one forward of a model does at a canvas (tokens, FLOPs, bytes), what it costs on a GPU
(seconds per forward by part, memory) for each config, and each tiled route as the Tiled Sampling node runs it.

Pure arithmetic over the tables' records (records.py); nothing here reads a file or prints. The model
(docs/budget.md):

    one forward = attention FLOPs / (bf16 peak x attention efficiency of the SDPA backend that runs)
                + GEMM FLOPs / (bf16 or FP8 peak x GEMM efficiency) [+ FP8 input quantisation bytes / bandwidth]
                + elementwise bytes / (bandwidth x the release's elementwise efficiency)
                + the release's per-forward host gap [+ weights that do not fit, streamed over the host link]
    one step = forwards per step (2 with classifier-free guidance) x one forward; a generation = steps x one step

A tiled route is the pack's template, stage by stage: the generation at its base size and its VAEDecode (priced as
above and as the VAE below), ImageScale to the canvas, TiledVAEEncode, the refinement (each tile a forward per step),
TiledVAEDecode, SaveImagePNG. The VAE's stages are its convolution FLOPs over the tiles the pack's planner cuts /
(bf16 peak x the measured fraction) + the tiles' traffic over the host link; the host's stages (ImageScale, the PNG)
are core-seconds per megapixel on the measuring host's cores.

Efficiencies are fractions of the measuring GPU's published peaks; on any other GPU the same fractions of its own
published peaks are a projection, and every time figure says which it is.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from applier.budget.records import (BF16_BYTES, CONFIGS, FAMILY_MIN_CAPABILITY, FAMILY_WORDS, FP8_BYTES, BlockGroup,
                                    BudgetData, Canvas, Efficiency, Era, Gpu, Measured, Model, Request, RouteStages,
                                    VaeLayers, config_words)
from applier.resources import load_pack_module


@dataclass(frozen=True)
class Tokens:
    latent_width: int
    latent_height: int
    latent_frames: int
    image: int                   # image tokens at the model's full resolution (downsample 1), references included
    text: int
    reference: int = 0           # of `image`: the reference images' tokens (Qwen-Image-Edit's), in the image stream

    @property
    def all(self) -> int:
        return self.image + self.text


def latent_frames(model: Model, frames: int) -> int:
    """A video VAE keeps the first frame and packs the rest 4 to 1: (frames - 1) // 4 + 1 latent frames."""
    if not model.video:
        return 1
    return (max(frames, 1) - 1) // model.vae.temporal_factor + 1


def reference_tokens(model: Model, canvas: Canvas) -> int:
    """The tokens of the model's reference images: each scaled to reference_px pixels at the canvas's aspect (as
    ComfyUI's TextEncodeQwenImageEdit scales its image to 1024 x 1024 pixels, keeping the image's aspect), encoded by
    the VAE (whole latent pixels) and patchified; the diffusion model concatenates them onto the canvas's image tokens
    (comfy/ldm/qwen_image/model.py). The Tiled Sampling node gives such a reference, not of the canvas's size, whole to
    every tile, so a tile's forward (a canvas of the tile's size here) carries them too."""
    if not model.reference_images:
        return 0
    scale = math.sqrt(model.reference_px / (canvas.width * canvas.height))
    lw = round(canvas.width * scale) // model.vae.factor
    lh = round(canvas.height * scale) // model.vae.factor
    return model.reference_images * math.ceil(lw / model.patch) * math.ceil(lh / model.patch)


def token_counts(model: Model, canvas: Canvas) -> Tokens:
    lw, lh = canvas.width // model.vae.factor, canvas.height // model.vae.factor
    frames = latent_frames(model, canvas.frames)
    reference = reference_tokens(model, canvas)
    image = math.ceil(lw / model.patch) * math.ceil(lh / model.patch) * frames + reference
    return Tokens(lw, lh, frames, image, model.text_tokens, reference)


def _group_tokens(model: Model, tokens: Tokens, group: BlockGroup) -> dict:
    """Tokens per token set at this group's level (SDXL's UNet levels halve each side)."""
    step = model.patch * group.downsample
    image = (math.ceil(tokens.latent_width / step) * math.ceil(tokens.latent_height / step) * tokens.latent_frames
             + tokens.reference // group.downsample ** 2)
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


def weight_bytes(model: Model, work: Work, fp8: bool, dynamic_vram: bool = False) -> int:
    """The weights in memory: bf16, or with FP8 linears replacing theirs (the node's default fp8_weights=replace);
    a model whose file stores its matrices in FP8 holds them so in stock ComfyUI too. Under DynamicVRAM the FP8
    Linears make their codes per call: the weights ComfyUI holds are stock's."""
    fp8 = fp8 and not dynamic_vram
    if not fp8 and not model.stored_fp8:
        return model.parameters * BF16_BYTES
    return work.fp8_parameters * FP8_BYTES + (model.parameters - work.fp8_parameters) * BF16_BYTES


def activation_bytes(model: Model, tokens: Tokens) -> int:
    return int(model.activation_widths * model.hidden * (tokens.image + text_in_stream(model, tokens)) * BF16_BYTES)


def hidden_state_bytes(model: Model, tokens: Tokens) -> int:
    """One activation tensor: the residual stream, hidden x tokens in bf16."""
    return model.hidden * (tokens.image + text_in_stream(model, tokens)) * BF16_BYTES


def text_in_stream(model: Model, tokens: Tokens) -> int:
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
            return False, f"the pack's {FAMILY_WORDS[family]} need sm_{need[0]}{need[1]}+ ({gpu.name} is sm_" \
                          f"{gpu.compute_capability[0]}{gpu.compute_capability[1]})"
        if family == "fp8" and not gpu.fp8_tflops:
            return False, f"{gpu.name} has no FP8 tensor cores"
    return True, ""


def file_fp8_matmul(model: Model, gpu: Gpu) -> bool:
    """Whether stock ComfyUI already multiplies this model's matrices in FP8: its file stores them in FP8 with
    ComfyUI's quantization metadata (comfy_quant), and the card has FP8 compute, so ComfyUI's mixed-precision ops
    run them as FP8 matmuls (0.33.0 comfy/ops.py pick_operations)."""
    return (model.stored_fp8 and bool(gpu.fp8_tflops)
            and gpu.compute_capability >= FAMILY_MIN_CAPABILITY["fp8"])


def _attention_efficiency(measured: Measured, gpu: Gpu, backend: str) -> Efficiency:
    if gpu.key in measured.same_kernels:
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
          memory_bytes: int, windows: bool = False, dynamic_vram: bool = False) -> Priced:
    """Seconds per forward of one config, and whether it fits."""
    families = CONFIGS[config]
    available, reason = config_available(config, model, gpu)
    if not available:
        return Priced(config, families, False, reason)
    fp8, file_fp8 = "fp8" in families, file_fp8_matmul(model, gpu)
    stock_backend = era.stock_attention_windows if windows else era.stock_attention
    attention_s, backend = attention_seconds(work, measured, gpu, None if "attention" in families else stock_backend)
    bf16 = gpu.bf16_tflops * 1e12
    bandwidth = gpu.bandwidth_gbs * 1e9
    if fp8 or file_fp8:
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
            notes.append(f"the pack's {FAMILY_WORDS['elementwise']} are Flux's and Wan's: this model's blocks stay "
                         "ComfyUI's own")
    if "attention" in families and gpu.key not in measured.same_kernels:
        notes.append(f"{FAMILY_WORDS['attention']}'s gain is measured on {measured.gpu}'s architecture only: none "
                     "predicted here")
    weights = weight_bytes(model, work, fp8, dynamic_vram)
    if fp8 and dynamic_vram and not model.stored_fp8:
        notes.append(f"under DynamicVRAM the {FAMILY_WORDS['fp8']} make their codes per call: no weight memory saved")
    room = memory_bytes - activation_bytes(model, work.tokens) - measured.reserve_bytes
    streamed = max(0, weights - room) if room > 0 else 0
    stream_s = streamed / (gpu.host_link_gbs * 1e9)
    predicted = not (fp8 and model.fp8_path != "blocks" and not file_fp8)
    if fp8 and file_fp8:
        notes.append(f"the file's FP8 matrices already multiply in FP8 in ComfyUI's own ops: the pack's "
                     f"{FAMILY_WORDS['fp8']} leave them as they are")
    elif not predicted:
        notes.append(f"{FAMILY_WORDS['fp8']} outside Flux's and Wan's blocks (through ComfyUI's Linear ops) were "
                     "measured slower than stock at 1024 px on Qwen-Image (host-bound) and faster from 2048 px on "
                     "Qwen-Image and Z-Image (generation-0.33.0.json): no time predicted")
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


# ---------------------------------------------------------------- pricing a request

def price_all(request: Request, data: BudgetData, era: Era, canvas: Canvas) -> tuple[Work, list[Priced]]:
    """One forward's work at `canvas`, and every config priced on the request's GPU."""
    work = forward_work(request.model, canvas)
    return work, [price(name, request.model, request.gpu, data.measured, era, work, memory_bytes=request.memory_bytes,
                        windows=request.windows, dynamic_vram=request.dynamic_vram) for name in CONFIGS]


def runnable(priced: list[Priced]) -> list[Priced]:
    """The configs whose time is predicted and whose activations fit."""
    return [p for p in priced if p.available and p.predicted and p.fits]


# ---------------------------------------------------------------- tiled routes

# ---------------------------------------------------------------- the route's stages

FLOAT32_BYTES = 4
MEGAPIXEL = 1e6


@dataclass(frozen=True)
class Stage:
    """One node of the tiled route and its price."""
    name: str                    # generate, decode_base, upscale, encode, refine, decode, save
    node: str                    # the template's node that runs it
    seconds: float
    basis: str                   # what the figure rests on, in words

    def as_json(self) -> dict:
        return {"stage": self.name, "node": self.node, "seconds": self.seconds, "basis": self.basis}


@dataclass(frozen=True)
class RouteBase:
    """The route's first stages as the template runs them: a generation at `canvas` for `steps`, decoded whole."""
    canvas: Canvas
    steps: int


def _conv(cin: int, cout: int, kernel: int = 3) -> float:
    return 2.0 * kernel * kernel * cin * cout


def _resblock(cin: int, cout: int) -> float:
    return _conv(cin, cout) + _conv(cout, cout) + (_conv(cin, cout, 1) if cin != cout else 0.0)


def vae_flop_per_pixel(vae: VaeLayers, tile_pixels: float, decode: bool) -> float:
    """FLOPs per image pixel of the VAE's encoder or decoder on a tile of `tile_pixels` image pixels: every 3x3 and 1x1
    convolution (2 x k^2 x in x out per output pixel, at its level's resolution) and the attention block of the
    lowest level (its four 1x1 projections and 4 x tokens x width per token, the tokens being the tile's)."""
    levels = len(vae.ch_mult)
    lowest = 4 ** (levels - 1)                      # image pixels per pixel of the lowest level
    deepest = vae.ch * vae.ch_mult[-1]
    middle = 2 * _resblock(deepest, deepest) + 4 * _conv(deepest, deepest, 1) + 4.0 * (tile_pixels / lowest) * deepest
    if decode:
        flop = (_conv(vae.z_channels, deepest) + middle) / lowest
        width = deepest
        for level in reversed(range(levels)):
            out = vae.ch * vae.ch_mult[level]
            for _ in range(vae.num_res_blocks + 1):
                flop += _resblock(width, out) / 4 ** level
                width = out
            if level:
                flop += _conv(width, width) / 4 ** (level - 1)      # upsample, then a convolution
        return flop + _conv(width, vae.image_channels)
    flop, width = _conv(vae.image_channels, vae.ch), vae.ch
    for level in range(levels):
        out = vae.ch * vae.ch_mult[level]
        for _ in range(vae.num_res_blocks):
            flop += _resblock(width, out) / 4 ** level
            width = out
        if level != levels - 1:
            flop += _conv(width, width) / 4 ** (level + 1)          # a strided convolution
    return flop + (middle + _conv(deepest, 2 * vae.z_channels)) / lowest


@dataclass(frozen=True)
class VaeWork:
    """A VAE pass over a canvas: its tiles as the pack's planner cuts them (one tile: untiled), their FLOPs and the
    bytes they move over the host link (float32 pixels and latents, the canvas held on the host)."""
    tiles: int
    tile_pixels: int
    flop: float
    host_bytes: float


def vae_work(route: RouteStages, model: Model, canvas: Canvas, decode: bool, tiled: bool = True) -> VaeWork:
    """The tiles TiledVAEEncode / TiledVAEDecode cut at the route's settings (fused_dit/tiling/vae.py latent_plan:
    the overlap at most half a tile, the planned margin), or the whole canvas as one tile (VAEDecode)."""
    factor = model.vae.factor
    height, width = canvas.height // factor, canvas.width // factor
    if tiled:
        plan_module, _ = _tiling()
        tile = max(1, route.vae_tile_px // factor)
        overlap = min(route.vae_overlap_px // factor, tile // 2)
        layout = plan_module.plan(height, width, tile, overlap, margin=plan_module.margin_for(overlap))
        first = layout.boxes[0]
        count, pixels = layout.count, (first.y1 - first.y0) * (first.x1 - first.x0) * factor * factor
    else:
        count, pixels = 1, height * width * factor * factor
    per_pixel = vae_flop_per_pixel(route.vae, pixels, decode)
    moved = route.vae.image_channels * FLOAT32_BYTES + route.vae.z_channels * FLOAT32_BYTES / factor ** 2
    return VaeWork(count, pixels, count * pixels * per_pixel, count * pixels * moved)


def vae_seconds(work: VaeWork, efficiency: Efficiency, gpu: Gpu) -> float:
    return work.flop / (gpu.bf16_tflops * 1e12 * efficiency.value) + work.host_bytes / (gpu.host_link_gbs * 1e9)


def host_seconds(efficiency: Efficiency, canvas: Canvas, cores: int) -> float:
    """A host stage: core-seconds per megapixel x the canvas's megapixels, over `cores` cores."""
    return efficiency.value * canvas.width * canvas.height * canvas.frames / MEGAPIXEL / cores


def route_of(data: BudgetData, model: Model) -> RouteStages | None:
    """The measured stages of the model's tiled route (its VAE's), or None where none were measured."""
    route = data.measured.route
    return route if route is not None and model.key in route.models else None


def route_stages(data: BudgetData, request: Request, era: Era, config: str, base: RouteBase | None,
                 cores: int | None = None) -> tuple[tuple[Stage, ...], tuple[Stage, ...]]:
    """The stages before the refinement and after it, priced on the request's GPU: ((generate, decode_base, upscale,
    encode), (decode, save)); the generation's three only where the template's `base` is known, none where the
    model's VAE was not measured. The host's stages at `cores` (None: the measuring host's)."""
    route, model, gpu, canvas = route_of(data, request.model), request.model, request.gpu, request.canvas
    if route is None:
        return (), ()
    on = ("measured" if gpu.key == route.gpu
          else f"projected by bf16 peak from the {data.gpus[route.gpu].name}'s measurement")
    cores = cores or route.host_cores
    host = f"host, {cores} cores" + (" as measured" if cores == route.host_cores
                                     else f", projected from {route.host_cores} measured")
    before = []
    if base is not None:
        work, priced = price_all(request, data, era, base.canvas)
        chosen = next((p for p in runnable(priced) if p.config == config), None) or min(
            runnable(priced) or priced[:1], key=lambda p: p.forward_s)
        generate = chosen.forward_s * request.cfg_forwards * base.steps
        before.append(Stage("generate", "KSampler", generate, f"{base.canvas.label}, {base.steps} steps, "
                                                               f"{config_words(chosen.config)}"))
        decoded = vae_work(route, model, base.canvas, decode=True, tiled=False)
        before.append(Stage("decode_base", "VAEDecode", vae_seconds(decoded, route.decode, gpu),
                            f"VAE, {base.canvas.label} whole, {on}"))
        before.append(Stage("upscale", "ImageScale", host_seconds(route.upscale, canvas, cores), host))
    encoded, decoded = (vae_work(route, model, canvas, decode=False), vae_work(route, model, canvas, decode=True))
    tiles = f"{encoded.tiles} tiles of {route.vae_tile_px} px"
    before.append(Stage("encode", "TiledVAEEncode", vae_seconds(encoded, route.encode, gpu), f"VAE, {tiles}, {on}"))
    after = (Stage("decode", "TiledVAEDecode", vae_seconds(decoded, route.decode, gpu), f"VAE, {tiles}, {on}"),
             Stage("save", "SaveImagePNG", host_seconds(route.save, canvas, cores), host))
    return tuple(before), after


@dataclass(frozen=True)
class TiledRoute:
    """One tile size as the Tiled Sampling node would run it: its tiles and batch, its peak, and where it fits the
    fastest config's cost for every step of the refinement, and the route's other stages (`stages`, in the order
    the template runs them, the refinement among them; `seconds` their sum)."""
    node: str | None                     # "Tiled Sampling", or None where no node of the pack tiles the model
    tile_px: int
    overlap_px: int
    tiles: int
    batch: int
    tile_activation_bytes: int
    peak_bytes: int
    fits: bool
    steps: int
    config: str | None = None
    seconds_per_tile: float | None = None     # all steps
    seconds: float | None = None              # the whole route: every stage
    stock_seconds: float | None = None        # the whole route with a stock refinement
    refine_seconds: float | None = None
    stages: tuple[Stage, ...] = ()
    streamed_bytes: int = 0                   # weights beyond the card, streamed from the host every forward

    @property
    def settings(self) -> dict:
        """The node's inputs for this route."""
        return {"tile_px": self.tile_px, "overlap_px": self.overlap_px, "tile_batch": self.batch}

    @property
    def fixed_seconds(self) -> float:
        """The stages whose time does not depend on the refinement's steps."""
        return (self.seconds or 0.0) - (self.refine_seconds or 0.0)

    def as_json(self) -> dict:
        out = {"node": self.node, "tile_px": self.tile_px, "overlap_px": self.overlap_px, "tiles": self.tiles,
               "batch": self.batch, "tile_activation_bytes": self.tile_activation_bytes,
               "peak_bytes": self.peak_bytes, "fits": self.fits, "settings": self.settings, "steps": self.steps,
               "streamed_weights_bytes": self.streamed_bytes}
        if self.fits:
            out.update({"config": self.config, "words": config_words(self.config),
                        "seconds_per_tile": self.seconds_per_tile, "seconds": self.seconds,
                        "stock_seconds": self.stock_seconds, "refine_seconds": self.refine_seconds,
                        "stages": [stage.as_json() for stage in self.stages]})
        return out


def _tiling():
    """The overlay pack's planner and its table of the models the Tiled Sampling node tiles (fused_dit/tiling, loaded
    by path: torch-free), so that the budget prices the tiles, the batch and the memory the node plans."""
    return load_pack_module("tiling.plan"), load_pack_module("tiling.models")


def tile_shape(model: Model, tile_px: int, overlap_px: int, plan_module, known) -> object:
    """The planner's ModelShape of a budget model: the node's own entry where it tiles the model, else one made of
    the budget's numbers (batch of 1: nothing measured). Reference images ride in every tile's stream beside the
    text that does (the planner's text tokens, so that a tile's memory holds them)."""
    joint = bool(model.groups) and model.groups[0].stream == "all"
    mine = next((shape for shape in known.MODELS.values() if shape.key == (model.tiles_as or model.key)), None)
    reference = reference_tokens(model, Canvas(tile_px, tile_px, 1))
    return plan_module.ModelShape(model.key, model.patch, model.vae.factor, model.hidden, model.activation_widths,
                                  (model.text_tokens if joint else 0) + reference, joint or reference > 0, tile_px,
                                  overlap_px, mine.max_batch if mine else 1)


def tiled_routes(data: BudgetData, request: Request, era: Era, base: RouteBase | None = None,
                 cores: int | None = None) -> list[TiledRoute]:
    """Each tile size of the model's list smaller than the canvas, as the Tiled Sampling node would run it: the tiles
    and the batch its planner chooses in the memory beside the weights, the fastest config's cost for the request's
    route steps, and the route's other stages (route_stages; `base`: the template's generation)."""
    plan_module, known = _tiling()
    canvas, overlap, reserve = request.canvas, data.measured.tile_overlap_px, data.measured.reserve_bytes
    tokens = token_counts(request.model, canvas)
    memory = request.memory_bytes
    node = ("Tiled Sampling" if any(shape.key == (request.model.tiles_as or request.model.key)
                                    for shape in known.MODELS.values()) else None)
    steps = request.route_steps
    routes = []
    for tile in request.model.tile_px:
        if tile >= max(canvas.width, canvas.height) or tile <= overlap:
            continue
        tile_canvas = Canvas(min(tile, canvas.width), min(tile, canvas.height), canvas.frames)
        work, priced = price_all(request, data, era, tile_canvas)
        can_run = runnable(priced)
        best = min(can_run, key=lambda p: p.forward_s) if can_run else None
        weights = best.weights_bytes if best else weight_bytes(request.model, work, True, request.dynamic_vram)
        shape = tile_shape(request.model, tile, overlap, plan_module, known)
        settings = plan_module.choose(shape, tokens.latent_height, tokens.latent_width,
                                      max(0, memory - weights - reserve), frames=tokens.latent_frames)
        count = settings.plan.count
        # a tile's activations must fit; weights beyond what is left stream from the host every forward, as
        # ComfyUI's partial loading does (DynamicVRAM), and the config's price holds that stream
        fits = best is not None and settings.tile_bytes + reserve <= memory
        needed = weights + settings.batch * settings.tile_bytes + reserve
        streamed = max(0, needed - memory) if fits else 0
        cost = {}
        if fits:
            per_tile = best.forward_s * request.cfg_forwards * steps
            stock = priced[0]
            before, after = route_stages(data, request, era, best.config, base, cores)
            refine = Stage("refine", "KSampler", per_tile * count,
                           f"Tiled Sampling, {count} tiles, {steps} steps, {config_words(best.config)}")
            stages = (*before, refine, *after)
            other = sum(stage.seconds for stage in before + after)
            cost = {"config": best.config, "seconds_per_tile": per_tile, "seconds": per_tile * count + other,
                    "stock_seconds": (stock.forward_s * request.cfg_forwards * steps * count + other
                                      if stock in can_run else None),
                    "refine_seconds": per_tile * count, "stages": stages}
        routes.append(TiledRoute(node, tile, overlap, count, settings.batch, settings.tile_bytes,
                                 min(needed, memory) if fits else needed, fits, steps, **cost,
                                 streamed_bytes=streamed))
    return routes
