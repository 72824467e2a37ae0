"""The Tiled Sampling node's hooks on a ModelPatcher clone: two of ComfyUI's wrappers.

- PREPARE_SAMPLING (before the model loads): ComfyUI sizes the memory it keeps free for the forward from the
  latent's shape (sampler_helpers.estimate_memory), which for a canvas would push the weights out of VRAM; the
  wrapper hands it the shape of one batch of tiles instead, planned in the memory the weights leave.
- SAMPLER_SAMPLE (once per sampling run, around the sampler): plans the run's tiles from the latent's shape and the
  free memory (plan.choose, the memory model applier budget prices with), says so in one INFO line, opens one
  progress bar that counts tiles x steps, and decides where the canvas lives. Where the canvas's tensors (the
  sampler's latent, noise and steps, and the blender's sums: `CANVAS_COPIES` latents) would take more than a tenth
  of one batch of tiles' memory, they stay on the host and the sampler steps there: only a batch of tiles goes to
  the GPU, so the device's peak tracks a tile (within that tenth), not the canvas.
- CALC_COND_BATCH (every model call): sampling.tiled_calc_cond_batch with the run's plan; a call outside a run
  (a sampler path without SAMPLER_SAMPLE) plans from the latent it is given. Where ComfyUI's model_options carry
  multi-GPU clones of the model (`multigpu_clones`, and its `multigpu_thread_pool`), the batches of tiles are spread
  over the clones' devices (devices.py); without them, or in a ComfyUI without multi-GPU support, one device.

Cancel (ComfyUI's interrupt) is honoured between two batches of tiles.
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field

import torch

from .. import state
from .models import ModelFacts, recognise
from .plan import ModelShape, Plan, PlanError, Settings, choose
from .sampling import Progress, tiled_calc_cond_batch

KEY = "fused_dit_tiled"
# comfy.patcher_extension.WrappersMP's values, used where that module is not importable (tests)
PREPARE_SAMPLING, SAMPLER_SAMPLE, CALC_COND_BATCH = "prepare_sampling", "sampler_sample", "calc_cond_batch"
HOST_SHARE = 0.1          # the canvas on the host when its tensors exceed this share of a batch's activations
# the sampler's x, noise, denoised, its step's d and the latent image, and the blender's sum and result
CANVAS_COPIES = 7
# ComfyUI's model_options keys for its multi-GPU clones and their threads (comfy/samplers.py outer_sample)
MULTIGPU_CLONES, MULTIGPU_POOL = "multigpu_clones", "multigpu_thread_pool"
log = logging.getLogger("fused_dit")


@dataclass(frozen=True)
class Request:
    tile_px: int = 0              # 0: planned
    overlap_px: int = -1          # -1: planned
    batch: int = 0                # 0: planned
    canvas: str = "auto"          # auto | gpu | host
    margin_px: int = -1           # -1: planned (a quarter of the overlap)


@dataclass
class Run:
    """One sampling run's plan and progress."""
    settings: Settings
    sigmas: torch.Tensor | None
    on_host: bool
    device: torch.device
    bar: object = None
    last_value: int = field(default=0)

    def step_of(self, timestep: torch.Tensor | None) -> int:
        """The sampling step a model call belongs to: the schedule's sigma nearest its timestep (once per call)."""
        if self.bar is None or self.sigmas is None or timestep is None or len(self.sigmas) < 2:
            return 0
        sigma = float(timestep.flatten()[0])
        return int((self.sigmas[:-1] - sigma).abs().argmin())

    def advance(self, done: int, total: int, step: int) -> None:
        if self.bar is None:
            return
        value = max(self.last_value, step * total + done)
        self.last_value = value
        self.bar.update_absolute(value)


def free_bytes(device: torch.device) -> int:
    """Memory the tiles may use on `device`: ComfyUI's own figure where it runs, capped by a per-process fraction
    where one is set (torch's allocator refuses past it, whatever the device has free)."""
    try:
        import comfy.model_management as mm
        free = int(mm.get_free_memory(device))
    except ImportError:
        free = int(torch.cuda.mem_get_info(device)[0]) if device.type == "cuda" else 2 ** 34
    if device.type == "cuda":
        fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)
        if fraction is not None:
            limit = int(fraction(device) * torch.cuda.get_device_properties(device).total_memory)
            free = min(free, limit - torch.cuda.memory_allocated(device))
    return max(free, 0)


def model_facts(patcher) -> ModelFacts:
    """What the ModelPatcher's model is, from ComfyUI's own objects: its model config's unet_config, its latent
    format, the diffusion model's class and patch (None for what cannot be read)."""
    base = patcher.model
    diffusion_model = base.diffusion_model
    config = getattr(getattr(base, "model_config", None), "unet_config", None)
    latent_format = getattr(base, "latent_format", None)
    patch = getattr(diffusion_model, "patch_size", None)
    if isinstance(patch, (tuple, list)) and patch:
        patch = patch[-1]
    return ModelFacts(tuple(cls.__name__ for cls in type(diffusion_model).__mro__),
                      config.get("image_model") if isinstance(config, dict) else None,
                      getattr(latent_format, "latent_channels", None),
                      getattr(latent_format, "spacial_downscale_ratio", None),
                      patch if isinstance(patch, int) else None,
                      dict(config) if isinstance(config, dict) else None)


def _progress_bar(total: int):
    try:
        import comfy.utils
    except ImportError:
        return None
    return comfy.utils.ProgressBar(total)


def _check_cancel() -> None:
    try:
        import comfy.model_management as mm
    except ImportError:
        return
    mm.throw_exception_if_processing_interrupted()


class TiledSampling:
    """The two wrappers over one request, for one model (see the module docstring)."""

    def __init__(self, shape: ModelShape, request: Request, device: torch.device):
        self.shape, self.request, self.device = shape, request, device
        self.run: Run | None = None
        self.prepared: tuple | None = None      # (latent shape, Settings) planned before the model loaded

    def settings_for(self, latent_shape, weights_to_load: int = 0) -> Settings:
        latent_shape = tuple(latent_shape)
        if self.prepared is not None and self.prepared[0] == latent_shape:
            return self.prepared[1]
        frames = latent_shape[2] if len(latent_shape) == 5 else 1
        return choose(self.shape, latent_shape[-2], latent_shape[-1],
                      max(0, free_bytes(self.device) - weights_to_load),
                      tile_px=self.request.tile_px, overlap_px=self.request.overlap_px, batch=self.request.batch,
                      frames=frames, margin_px=self.request.margin_px)

    def prepare_sampling(self, executor, model, noise_shape, conds, *args, **kwargs):
        """ComfyUI's memory estimate for one batch of tiles, not the canvas; planned in what the weights leave."""
        self.prepared = None
        try:
            unloaded = int(model.model_size()) - int(getattr(model, "loaded_size", lambda: 0)())
            settings = self.settings_for(noise_shape, max(0, unloaded))
        except (PlanError, AttributeError, TypeError):
            return executor(model, noise_shape, conds, *args, **kwargs)
        self.prepared = (tuple(noise_shape), settings)
        if settings.plan.single:
            return executor(model, noise_shape, conds, *args, **kwargs)
        box = settings.plan.boxes[0]
        tiles_shape = [noise_shape[0] * settings.batch, *noise_shape[1:-2], box.y1 - box.y0, box.x1 - box.x0]
        return executor(model, tiles_shape, conds, *args, **kwargs)

    def on_host(self, latent: torch.Tensor, settings: Settings) -> bool:
        if self.request.canvas != "auto" or self.device.type != "cuda":
            return self.request.canvas == "host"
        canvas_bytes = CANVAS_COPIES * latent.numel() * 4
        return not settings.plan.single and canvas_bytes > HOST_SHARE * settings.batch * settings.tile_bytes

    def sampler_sample(self, executor, guider, sigmas, extra_args, callback, noise, latent_image=None,
                       denoise_mask=None, disable_pbar=False):
        try:
            settings = self.settings_for(tuple(noise.shape))
        except PlanError as error:
            state.say_once("Tiled Sampling: this canvas stays untiled: %s", str(error), level=logging.WARNING)
            return executor(guider, sigmas, extra_args, callback, noise, latent_image, denoise_mask, disable_pbar)
        host = self.on_host(noise, settings)
        steps = max(1, len(sigmas) - 1)
        self.run = Run(settings, sigmas.detach().float().cpu(), host, self.device)
        layout = settings.plan
        where = "host" if host else str(self.device)
        log.info("Tiled Sampling: %s", describe(settings, self.shape, noise.shape, where))
        if not layout.single:
            self.run.bar = _progress_bar(steps * layout.count)
        if host:
            # in place: ComfyUI's outer_sample moved these canvases to the GPU and still holds them; their storage
            # moves to the host, so the GPU keeps no copy of the canvas while the tiles run
            for canvas in (noise, latent_image, denoise_mask):
                if isinstance(canvas, torch.Tensor) and canvas.device.type != "cpu":
                    canvas.data = canvas.data.cpu()
            sigmas = sigmas.cpu()
        try:
            out = executor(guider, sigmas, extra_args, callback, noise, latent_image, denoise_mask, disable_pbar)
        finally:
            self.run, self.prepared = None, None
        return out.to(self.device) if host else out

    def calc_cond_batch(self, executor, model, conds, x_in, timestep, model_options):
        run = self.run

        def plan_for(x: torch.Tensor) -> tuple[Plan, int]:
            settings = run.settings if run is not None else self.settings_for(tuple(x.shape))
            return settings.plan, settings.batch

        step = run.step_of(timestep) if run is not None else 0
        progress = Progress(
            advance=(lambda done, total: run.advance(done, total, step)) if run is not None else Progress.advance,
            check_cancel=_check_cancel)
        return tiled_calc_cond_batch(executor, model, conds, x_in, timestep, model_options, plan_for=plan_for,
                                     progress=progress, device=self.device,
                                     devices=multigpu_devices(executor, model_options),
                                     pool=model_options.get(MULTIGPU_POOL) if isinstance(model_options, dict) else None)


def multigpu_devices(executor, model_options) -> list | None:
    """ComfyUI's multi-GPU clones of the model as (device, executor-like call) pairs: `model_options[
    'multigpu_clones']` (load device -> ModelPatcher, the main one included), which ComfyUI's outer_sample sets where
    the workflow made clones (its MultiGPU nodes). None where there are fewer than two, or the ComfyUI has no such key
    (one device: the single-device loop)."""
    clones = model_options.get(MULTIGPU_CLONES) if isinstance(model_options, dict) else None
    if not isinstance(clones, dict) or len(clones) < 2:
        return None
    pairs = []
    for device, patcher in clones.items():
        base = getattr(patcher, "model", None)
        if base is None:
            state.say_once("Tiled Sampling: a multi-GPU clone holds no model: the tiles run on one device")
            return None
        device = torch.device(device)
        pairs.append((device, _clone_call(executor, base, device, _options_for(model_options, device))))
    return pairs


def _options_for(model_options: dict, device: torch.device) -> dict:
    """One device's model_options: without the multi-GPU keys (ComfyUI's _calc_cond_batch would split the batch
    over the devices again), the sampler's sigmas on the device."""
    options = {key: value for key, value in model_options.items() if key not in (MULTIGPU_CLONES, MULTIGPU_POOL)}
    transformer = options.get("transformer_options")
    if isinstance(transformer, dict) and isinstance(transformer.get("sample_sigmas"), torch.Tensor):
        options["transformer_options"] = {**transformer, "sample_sigmas": transformer["sample_sigmas"].to(device)}
    return options


def _clone_call(executor, base_model, device: torch.device, options: dict):
    """The rest of ComfyUI's CALC_COND_BATCH chain on one clone's model, with the device current on the thread."""
    def call(model, conds, x_in, timestep, model_options):
        with _device_context(device):
            return executor(base_model, conds, x_in, timestep, options)
    return call


def _device_context(device: torch.device):
    try:
        import comfy.model_management as mm
        return mm.cuda_device_context(device)
    except (ImportError, AttributeError):
        return contextlib.nullcontext()


def describe(settings: Settings, shape: ModelShape, latent_shape, where: str) -> str:
    """The run's one INFO line: tiles, their size and overlap, the batch and why, where the canvas lives."""
    layout = settings.plan
    canvas = f"{latent_shape[-1] * shape.vae_factor}x{latent_shape[-2] * shape.vae_factor}"
    if layout.single:
        return f"the {canvas} canvas fits one {settings.tile_px} px tile: the model runs untiled"
    planned = f" (planned: {', '.join(settings.planned)})" if settings.planned else ""
    return (f"{layout.count} tiles of {settings.tile_px} px, overlap {settings.overlap_px} px (its outer "
            f"{layout.margin * shape.vae_factor} px not blended), on a {canvas} canvas "
            f"({len(layout.ys)} x {len(layout.xs)}), {settings.batch} per batch, "
            f"{settings.tile_bytes / 2 ** 30:.2f} GiB of activations a tile{planned}; canvas on the {where}")


def apply(patcher, request: Request):
    """A clone of the ModelPatcher `patcher` that samples tile by tile; `patcher` itself where the model is not one
    the node knows or the ComfyUI has no CALC_COND_BATCH wrapper (said once: then it runs untiled)."""
    shape, reason = recognise(model_facts(patcher))
    if shape is None:
        state.say_once("Tiled Sampling: %s: it runs untiled", reason)
        return patcher
    try:
        from comfy.patcher_extension import WrappersMP
        names = (WrappersMP.PREPARE_SAMPLING, WrappersMP.SAMPLER_SAMPLE, WrappersMP.CALC_COND_BATCH)
    except ImportError:
        names = (PREPARE_SAMPLING, SAMPLER_SAMPLE, CALC_COND_BATCH)
    except AttributeError:
        state.say_once("Tiled Sampling: this ComfyUI has no CALC_COND_BATCH wrapper: the model runs untiled")
        return patcher
    hooks = TiledSampling(shape, request, torch.device(patcher.load_device))
    clone = patcher.clone()
    for name, wrapper in zip(names, (hooks.prepare_sampling, hooks.sampler_sample, hooks.calc_cond_batch)):
        clone.remove_wrappers_with_key(name, KEY)
        clone.add_wrapper_with_key(name, KEY, wrapper)
    return clone
