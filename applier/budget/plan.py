"""The budget of one request, built in one step from the cost model and the verdict's rules: Budget, the report that
`applier budget` prints (report.py) and writes as JSON (Budget.as_json; docs/budget.md describes every key).

Nothing here prints; the one file it reads is the pack's tiled template (template.py), for the generation a tiled
route starts from (its base size and steps).
"""
from __future__ import annotations

from dataclasses import dataclass

from applier.budget.cost import (Priced, RouteBase, TiledRoute, Work, activation_bytes, hidden_state_bytes,
                                 output_image_bytes, price_all, text_in_stream, tiled_routes, vae_decode_bytes,
                                 weight_bytes)
from applier.budget.inputs import era_for
from applier.budget.records import (BF16_BYTES, FAMILY_WORDS, BudgetData, Canvas, Era, Model, Request, TargetCaps,
                                    config_words)
from applier.budget.template import template_for
from applier.budget.verdict import CapsVerdict, NativeOption, Verdict, VerdictKind, caps_verdict, decide


@dataclass(frozen=True)
class ConfigCost:
    """One config at the whole canvas: its price per forward, and per step and generation where it is predicted."""
    priced: Priced
    basis: str
    seconds_per_step: float | None = None
    seconds_per_generation: float | None = None
    speedup_vs_stock: float | None = None

    @property
    def config(self) -> str:
        return self.priced.config

    def as_json(self) -> dict:
        p = self.priced
        out = {"config": p.config, "words": config_words(p.config), "families": [FAMILY_WORDS[f] for f in p.families],
               "available": p.available, "note": p.reason}
        if p.available:
            out.update({"predicted": p.predicted, "fits": p.fits, "weights_bytes": p.weights_bytes,
                        "streamed_weights_bytes": p.streamed_bytes})
        if self.seconds_per_step is not None:
            out.update({
                "attention_backend": p.attention_backend,
                "seconds_per_forward": {"attention": p.attention_s, "gemm": p.gemm_s, "fp8_quantize": p.quantize_s,
                                        "elementwise": p.elementwise_s, "host_gap": p.host_s,
                                        "weight_streaming": p.stream_s, "total": p.forward_s},
                "seconds_per_step": self.seconds_per_step, "seconds_per_generation": self.seconds_per_generation,
                "speedup_vs_stock": self.speedup_vs_stock,
                "basis": self.basis + ("; weights streamed over the host link: not measured" if p.streamed_bytes
                                       else ""),
            })
        return out


@dataclass(frozen=True)
class Memory:
    weights_bf16_bytes: int
    weights_stock_bytes: int     # what stock ComfyUI holds: bf16, or FP8 matrices where the file stores them so
    weights_fp8_bytes: int
    activation_peak_bytes: int
    hidden_state_bytes: int
    reserve_bytes: int
    gpu_bytes: int
    activations_fit: bool


@dataclass(frozen=True)
class VaeDecode:
    whole_bytes: int
    whole_fits: bool
    tiled_bytes: int
    tile_px: int
    tile_overlap_px: int
    output_image_host_bytes: int
    source: str


@dataclass(frozen=True)
class Budget:
    """What a canvas costs on a GPU, and the verdict: the whole report of `applier budget`."""
    request: Request
    basis: str                           # measured on this GPU, or projected from its published peaks
    era: Era
    era_why: str
    work: Work
    configs: tuple[ConfigCost, ...]
    memory: Memory
    vae: VaeDecode
    caps: CapsVerdict
    routes: tuple[TiledRoute, ...]
    verdict: Verdict
    route_models: tuple[str, ...] = ()  # the names of the models whose route's other stages (VAE, host) are measured

    @property
    def measured(self) -> bool:
        return self.basis.startswith("measured")

    @property
    def stream_tokens(self) -> int:
        return self.work.tokens.image + text_in_stream(self.request.model, self.work.tokens)

    def as_json(self) -> dict:
        request, model, gpu, canvas, tokens = (self.request, self.request.model, self.request.gpu,
                                               self.request.canvas, self.work.tokens)
        return {
            "model": {"key": model.key, "name": model.name, "parameters": model.parameters,
                      "source": model.sources.get("source", "")},
            "gpu": {"key": gpu.key, "name": gpu.name, "how": request.gpu_how, "measured": self.measured,
                    "basis": self.basis, "memory_bytes": request.memory_bytes, "bandwidth_gbs": gpu.bandwidth_gbs,
                    "bf16_tflops": gpu.bf16_tflops, "fp8_tflops": gpu.fp8_tflops, "int8_tops": gpu.int8_tops,
                    "compute_capability": ".".join(map(str, gpu.compute_capability)), "source": gpu.source},
            "canvas": {"width": canvas.width, "height": canvas.height, "frames": canvas.frames,
                       "pixels": canvas.width * canvas.height * canvas.frames},
            "comfyui": {"version": request.comfyui_version, "era": self.era.name, "why": self.era_why,
                        "stock_attention": self.stock_attention, "dynamic_vram": request.dynamic_vram,
                        "vram": request.vram_how},
            "steps": request.steps, "tiled_steps": request.route_steps,
            "steps_source": {"native": request.steps_how, "tiled": request.tiled_steps_how or request.steps_how},
            "forwards_per_step": request.cfg_forwards, "within_seconds": request.within_s,
            "cpu_cores": request.cpu_cores,
            "tokens": {"latent": {"width": tokens.latent_width, "height": tokens.latent_height,
                                  "frames": tokens.latent_frames, "channels": model.vae.channels},
                       "image": tokens.image, "reference": tokens.reference, "text": tokens.text,
                       "stream": self.stream_tokens},
            "per_forward": {"attention_flop": self.work.attention_flop, "gemm_flop": self.work.gemm_flop,
                            "fp8_capable_gemm_flop": self.work.fp8_gemm_flop},
            "memory": dict(vars(self.memory)),
            "vae_decode": dict(vars(self.vae)),
            "configs": [c.as_json() for c in self.configs],
            "caps": self.caps.as_json(),
            "tiled_routes": [r.as_json() for r in self.routes],
            "verdict": self.verdict.as_json(),
        }

    @property
    def stock_attention(self) -> str:
        return self.era.stock_attention_windows if self.request.windows else self.era.stock_attention


def _basis(data: BudgetData, request: Request) -> str:
    gpu = request.gpu
    if gpu.key == data.measured.gpu:
        return f"measured: efficiencies from {gpu.name}'s own runs"
    return (f"projected from {gpu.name}'s published peaks with {data.gpus[data.measured.gpu].name}'s measured "
            "efficiencies")


def _configs(priced: list[Priced], request: Request, basis: str) -> tuple[ConfigCost, ...]:
    stock = priced[0]
    out = []
    for p in priced:
        if not (p.available and p.predicted):
            out.append(ConfigCost(p, basis))
            continue
        step_s = p.forward_s * request.cfg_forwards
        out.append(ConfigCost(p, basis, step_s, step_s * request.steps,
                              stock.forward_s / p.forward_s if stock.available else None))
    return tuple(out)


def _native(configs: tuple[ConfigCost, ...]) -> list[NativeOption]:
    return [NativeOption(c.config, c.seconds_per_generation, c.priced.fits)
            for c in configs if c.seconds_per_generation is not None]


def route_base(data: BudgetData, model: Model) -> RouteBase | None:
    """The generation the pack's tiled template for the model starts from (its size and steps), None without one."""
    template = template_for(data, model)
    if template is None or template.base is None:
        return None
    width, height, steps = template.base
    return RouteBase(Canvas(width, height), steps)


def _priced(data: BudgetData, request: Request, base: RouteBase | None):
    """(era, why, work, configs, routes) of a request: the cost model's part of a budget (`base`: the model's
    route_base, read once per plan: the alternatives the advice prices are the same model)."""
    era, era_why = era_for(data.measured, request.comfyui_version)
    work, priced = price_all(request, data, era, request.canvas)
    configs = _configs(priced, request, _basis(data, request))
    return era, era_why, work, configs, tiled_routes(data, request, era, base, request.cpu_cores)


def in_reach_seconds(data: BudgetData, request: Request, base: RouteBase | None) -> float | None:
    """The seconds of the request's verdict when it is native or tiled, None when out of reach (no advice)."""
    _, _, work, configs, routes = _priced(data, request, base)
    verdict = decide(request, _native(configs), routes, caps_verdict(request.canvas, None),
                     activation_bytes(request.model, work.tokens))
    return None if verdict.kind == VerdictKind.OUT_OF_REACH else verdict.seconds


def plan_budget(data: BudgetData, request: Request, caps: TargetCaps | None = None) -> Budget:
    """The whole report of one request."""
    model, canvas, measured = request.model, request.canvas, data.measured
    base = route_base(data, model)
    era, era_why, work, configs, routes = _priced(data, request, base)
    activations = activation_bytes(model, work.tokens)
    caps_found = caps_verdict(canvas, caps)
    others = tuple(g for g in data.gpus.values() if g.key != request.gpu.key)
    verdict = decide(request, _native(configs), routes, caps_found, activations,
                     lambda changed: in_reach_seconds(data, changed, base), others)
    whole_vae = vae_decode_bytes(model, canvas)
    memory = Memory(model.parameters * BF16_BYTES, weight_bytes(model, work, False),
                    weight_bytes(model, work, True, request.dynamic_vram),
                    activations, hidden_state_bytes(model, work.tokens), measured.reserve_bytes, request.memory_bytes,
                    configs[0].priced.fits)
    vae = VaeDecode(whole_vae, whole_vae + measured.reserve_bytes <= request.memory_bytes,
                    vae_decode_bytes(model, canvas, measured.vae_tile_px), measured.vae_tile_px,
                    measured.vae_tile_overlap_px, output_image_bytes(canvas),
                    f"{model.vae.source}; {measured.vae_tiled_source}")
    return Budget(request, _basis(data, request), era, era_why, work, configs, memory, vae, caps_found,
                  tuple(routes), verdict,
                  tuple(data.models[k].name if k in data.models else k for k in measured.route.models)
                  if measured.route else ())
