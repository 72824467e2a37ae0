"""The budget as text for the terminal: the verdict first, then what it rests on, one line each.

By default one screen: the node caps as one line (the lowest that matters, how many others), the configs in one
line when none of them fits; with verbose every config, every node cap and every note. Pure: the CLI prints.
"""
from __future__ import annotations

from applier.budget.plan import Budget
from applier.budget.records import config_words
from applier.budget.verdict import (duration_words, human_bytes, human_seconds, node_caps_words, route_cost_words,
                                    route_words)

FP8_ASSUMES = ("FP8 times are device time, as measured with --disable-dynamic-vram; under DynamicVRAM small canvases "
               "are host-bound and slower (benchmarks/results/budget-validation.json)")
LABEL = 15


def _line(label: str, text: str) -> str:
    return f"{label:{LABEL}}{text}"


def report_lines(budget: Budget, verbose: bool = False) -> list[str]:
    """The report in words, one line each: the verdict and why, the steps, then the numbers it rests on."""
    request = budget.request
    canvas = request.canvas
    size = f"{canvas.width}x{canvas.height}" + (f", {canvas.frames} frames" if canvas.frames > 1 else "")
    version = f", ComfyUI {request.comfyui_version}" if request.comfyui_version else ""
    lines = [f"{request.model.name} at {size} on {request.gpu.name} ({request.gpu_how}){version}"]
    lines += _verdict_lines(budget)
    lines.append(_line("steps", _steps_words(budget)))
    lines.append(_line("basis", budget.basis))
    lines.append(_line("comfyui", f"{budget.era_why}: priced as {budget.era.name}"))
    if request.vram_how:
        lines.append(_line("vram", request.vram_how))
    lines += _work_lines(budget)
    lines += _config_lines(budget, verbose)
    for route in budget.routes:
        cost = (f"{route_cost_words(route)}, peak {human_bytes(route.peak_bytes)}" if route.fits
                else "does not fit in memory")
        lines.append(_line("tiled route", f"{route_words(route)}: {cost}"))
    lines += _stage_lines(budget)
    lines += _caps_lines(budget, verbose)
    return lines


STAGE_WORDS = {"decode_base": "base decode", "refine": "refinement"}


def _stage_lines(budget: Budget) -> list[str]:
    """The stages of the verdict's route (else of the fastest that fits) in one line, and what they rest on."""
    fitting = [r for r in budget.routes if r.fits]
    if not fitting:
        return []
    route = budget.verdict.tile or min(fitting, key=lambda r: r.seconds)
    if route.fixed_seconds <= 0:
        return [_line("route stages", f"the refinement only: the route's other stages are measured for "
                                      f"{', '.join(budget.route_models) or 'no model'}'s VAE")]
    stages = ", ".join(f"{STAGE_WORDS.get(s.name, s.name)} {human_seconds(s.seconds)}" for s in route.stages)
    rests = {s.name: s.basis for s in route.stages}
    cores = "" if budget.request.cpu_cores else "; --cpu-cores N for the cores of ComfyUI's machine"
    return [_line("route stages", f"{route.tile_px} px tiles, {human_seconds(route.seconds)}: {stages} "
                                  f"(VAE {rests['encode'].split(', ')[-1]}; {rests['save']}{cores})")]


def _verdict_lines(budget: Budget) -> list[str]:
    verdict = budget.verdict
    within = duration_words(budget.request.within_s)
    head = verdict.kind.upper()
    if verdict.tile is not None and verdict.tile.fixed_seconds > 0:
        head += (f" with {config_words(verdict.config)}, {human_seconds(verdict.seconds)} end to end "
                 f"({verdict.steps} refinement steps)")
    elif verdict.config:
        head += f" with {config_words(verdict.config)}, {human_seconds(verdict.seconds)} for {verdict.steps} steps"
    lines = [_line("verdict", f"{head} (within {within})")]
    lines += [f"  {reason}" for reason in verdict.reasons]
    if verdict.advice:
        lines.append("  to reach it: " + "; ".join(verdict.advice))
    return lines


def _steps_words(budget: Budget) -> str:
    request = budget.request
    native = f"{request.steps} ({request.steps_how})" if request.steps_how else str(request.steps)
    if not budget.routes or request.route_steps == request.steps:
        return native + ("" if request.steps_how == "--steps" else "; --steps N prices N")
    tiled = (f"{request.route_steps} ({request.tiled_steps_how})" if request.tiled_steps_how
             else str(request.route_steps))
    return f"native {native}; tiled {tiled}; --steps N prices both at N"


def _work_lines(budget: Budget) -> list[str]:
    request, work, memory, vae = budget.request, budget.work, budget.memory, budget.vae
    tokens = work.tokens
    latent = f"{tokens.latent_width}x{tokens.latent_height}" + (f"x{tokens.latent_frames}"
                                                                if tokens.latent_frames > 1 else "")
    forwards = ("1 forward per step" if request.cfg_forwards == 1 else
                f"{request.cfg_forwards} forwards per step (classifier-free guidance)")
    return [
        _line("tokens", f"{tokens.image:,} image"
                        + (f" ({tokens.reference:,} of them the reference image's)" if tokens.reference else "")
                        + f" + {tokens.text:,} text (latent {latent}, "
                        f"{request.model.vae.channels} channels); per forward attention {work.attention_flop:.3g} "
                        f"FLOP, GEMMs {work.gemm_flop:.3g} FLOP; {forwards}"),
        _line("memory", f"weights {human_bytes(memory.weights_bf16_bytes)} bf16"
                        + (f" (stock holds {human_bytes(memory.weights_stock_bytes)}: the file users load stores "
                           "its matrices in FP8)" if memory.weights_stock_bytes != memory.weights_bf16_bytes else "")
                        + " / "
                        f"{human_bytes(memory.weights_fp8_bytes)} with FP8 linears"
                        + (" (codes per call under DynamicVRAM)" if request.dynamic_vram else "") + "; activations "
                        f"{human_bytes(memory.activation_peak_bytes)} peak (one hidden state "
                        f"{human_bytes(memory.hidden_state_bytes)}); GPU {human_bytes(memory.gpu_bytes)}"),
        _line("vae decode", f"whole {human_bytes(vae.whole_bytes)}"
                            + ("" if vae.whole_fits else " (does not fit: ComfyUI falls back to tiles)")
                            + f"; tiled {human_bytes(vae.tiled_bytes)} per {vae.tile_px} px tile; image on the host "
                              f"{human_bytes(vae.output_image_host_bytes)}"),
    ]


def _config_lines(budget: Budget, verbose: bool) -> list[str]:
    steps = budget.request.steps
    timed = [c for c in budget.configs if c.seconds_per_step is not None]
    if not verbose and timed and not any(c.priced.fits for c in timed):
        stock = timed[0]
        return [_line("native", f"no config fits (activations {human_bytes(budget.memory.activation_peak_bytes)}); "
                                f"{config_words(stock.config)} {human_seconds(stock.seconds_per_step)}/step, "
                                f"{human_seconds(stock.seconds_per_generation)} for {steps} steps "
                                "(--verbose: every config)")]
    lines = []
    for config in budget.configs:
        priced, name = config.priced, config_words(config.config) + ":"
        if not priced.available:
            lines.append(f"  {name} not on this GPU: {priced.reason}")
        elif config.seconds_per_step is None:
            lines.append(f"  {name} weights {human_bytes(priced.weights_bytes)}; time not predicted: {priced.reason}")
        else:
            speed = config.speedup_vs_stock
            lines.append(f"  {name} {human_seconds(config.seconds_per_step)}/step, "
                         f"{human_seconds(config.seconds_per_generation)} for {steps} steps"
                         + (f" ({speed:.2f}x stock)" if speed and config.config != "stock" else "")
                         + ("" if priced.fits else "  [activations do not fit]")
                         + (f"  [{human_bytes(priced.streamed_bytes)} of weights streamed]"
                            if priced.streamed_bytes else ""))
    if any("fp8" in c.config for c in timed):
        lines.append(f"  ({FP8_ASSUMES})")
    return lines


def _caps_lines(budget: Budget, verbose: bool) -> list[str]:
    caps = budget.caps
    if not caps.checked:
        return [_line("caps", "; ".join(caps.notes))]
    lines = [_line("caps", f"{b.cap} = {b.value} ({b.where}): {b.effect}; lift it: {b.fix}") for b in caps.blocking]
    if not caps.blocking:
        lines.append(_line("caps", "the target's caps allow this size"))
    if caps.node_caps:
        if verbose:
            lines.append(_line("node caps", f"{len(caps.node_caps)} node inputs cap a side below {caps.longest}, "
                                            "each only where a workflow uses its node:"))
            lines += [f"  {c.node + ' ' if c.node else ''}{c.cap} = {c.value} at {c.where}"
                      + ("" if c.canvas_side else " (not a canvas side)") for c in caps.node_caps]
        else:
            lines.append(_line("node caps", node_caps_words(caps) + " (--verbose lists them)"))
    if caps.notes:
        lines += ([_line("notes", note) for note in caps.notes] if verbose
                  else [_line("notes", "; ".join(caps.notes))])
    return lines
