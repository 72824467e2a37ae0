"""The verdict's rules: whether the target's caps let a canvas through, which route runs it (native, tiled or none)
and why in words, and what to change when nothing finishes in the time given.

The rules, each stated in the reasons it gives:
- native runs whenever one forward's activations fit and a config finishes in time: every token of a native
  generation attends to the whole canvas, a tile only to its neighbourhood (tiles suit a refinement at low denoise,
  as the pack's template runs them), so a faster tiled route does not win over it;
- stock is named when it finishes in time (nothing to install), else the fastest config;
- tiled: the largest tile that finishes in time (fewer seams, more of the canvas in each tile), even where a
  smaller tile is faster;
- out of reach: the fastest option's time, and the changes that reach it (--within, --steps, a smaller canvas,
  another GPU), each priced.
Pure: nothing here reads a file or prints.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Callable

from applier.budget.cost import TiledRoute
from applier.budget.records import GIB, STOCK_WORDS, Canvas, Request, TargetCaps, config_words
from applier.strenum import StrEnum


class VerdictKind(StrEnum):
    """The verdict on a canvas (the "kind" of the report's verdict)."""
    NATIVE = "native"               # fits in memory and finishes within the time given
    TILED = "tiled"                 # a tile size that fits finishes within it
    OUT_OF_REACH = "out of reach"


# ---------------------------------------------------------------- words

def human_bytes(count: float) -> str:
    for unit, size in (("TiB", 1024 ** 4), ("GiB", GIB), ("MiB", 1024 ** 2)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count / 1024:.1f} KiB"


def human_seconds(seconds: float) -> str:
    if seconds >= 86400 * 2:
        return f"{seconds / 86400:.1f} d"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.3g} s"


def duration_words(seconds: float) -> str:
    """A time the user gave, as given when it is whole hours or minutes ("1 h", "90 min"), else as human_seconds."""
    if seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return human_seconds(seconds)


def duration_option(seconds: float) -> str:
    """A --within value at least `seconds`, rounded up as a person would type it (70m, 5h, 90s)."""
    if seconds < 60:
        return f"{math.ceil(seconds)}s"
    if seconds < 10 * 3600:
        return f"{math.ceil(seconds / 300) * 5}m"
    return f"{math.ceil(seconds / 3600)}h"


def route_words(route: TiledRoute) -> str:
    """How a tiled route is run: the node and the settings it would plan, or that no node of the pack tiles it."""
    if route.node is None:
        return (f"{route.tiles} tiles of {route.tile_px} px (no node of the pack tiles this model: the pack's model "
                "table has no entry for it)")
    return (f"Tiled Sampling, tile_px {route.tile_px}, overlap_px {route.overlap_px}, tile_batch {route.batch}: "
            f"{route.tiles} tiles")


def route_cost_words(route: TiledRoute) -> str:
    """A fitting route's time: the whole route's, and its refinement's where other stages are priced."""
    refine = f"{config_words(route.config)}, {route.steps} steps"
    if route.streamed_bytes:
        refine += (f"; {human_bytes(route.streamed_bytes)} of the weights do not fit beside a tile and stream from "
                   "the host every forward")
    if route.fixed_seconds <= 0:
        return f"{human_seconds(route.seconds)} ({refine})"
    return (f"{human_seconds(route.seconds)} end to end ({len(route.stages)} stages; the refinement "
            f"{human_seconds(route.refine_seconds)} with {refine})")


# ---------------------------------------------------------------- caps

# An input that sets a side of the canvas: width, height, a MAX_RESOLUTION of the node's own (not resolution_steps,
# octree_resolution or spacing_width, which the resolution-caps scan also finds); and the nodes a workflow of
# images or latents goes through (EmptyLatentImage, ImageScale...), whose caps come first.
_CANVAS_SIDE = re.compile(r"(?i)^(?:\w*max_resolution|width|height)$")
_IMAGE_NODE = re.compile(r"Latent|Image")


@dataclass(frozen=True)
class BlockingCap:
    """A cap every workflow meets (MAX_RESOLUTION, Pillow's bound), and the patch that lifts it."""
    cap: str
    where: str
    value: int
    effect: str
    fix: str

    def as_json(self) -> dict:
        return {"cap": self.cap, "where": self.where, "value": self.value, "effect": self.effect, "fix": self.fix}


@dataclass(frozen=True)
class NodeCap:
    """A node input's hard-coded cap below the canvas: it refuses the size only where a workflow uses the node."""
    cap: str
    where: str
    value: int
    node: str
    canvas_side: bool            # the input sets a side of the canvas (width, height, resolution)

    def as_json(self, longest: int) -> dict:
        return {"cap": self.cap, "where": self.where, "value": self.value, "node": self.node,
                "canvas_side": self.canvas_side,
                "effect": f"this input refuses a side of {longest} where a workflow uses its node",
                "fix": "a hard-coded cap: MAX_RESOLUTION does not reach it (edit or avoid that node)"}


@dataclass(frozen=True)
class CapsVerdict:
    """Whether the target's caps, as its files hold them, let the canvas through, and which do not."""
    checked: bool
    longest: int
    blocking: tuple[BlockingCap, ...] = ()
    node_caps: tuple[NodeCap, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def allowed(self) -> bool | None:
        return not self.blocking if self.checked else None

    @property
    def lowest_that_matters(self) -> NodeCap | None:
        """The lowest cap on a side of the canvas of an image or latent node, else of any node, else the lowest."""
        sides = [c for c in self.node_caps if c.canvas_side]
        found = [c for c in sides if _IMAGE_NODE.search(c.node)] or sides or list(self.node_caps)
        return min(found, key=lambda c: c.value) if found else None

    def as_json(self) -> dict:
        return {"checked": self.checked, "allowed": self.allowed,
                "blocking": [b.as_json() for b in self.blocking],
                "node_caps": [c.as_json(self.longest) for c in self.node_caps], "notes": list(self.notes)}


def caps_verdict(canvas: Canvas, caps: TargetCaps | None) -> CapsVerdict:
    """Whether the target's caps, as its files hold them, let this canvas through, and which do not."""
    longest = max(canvas.width, canvas.height)
    if caps is None:
        return CapsVerdict(False, longest, notes=("no ComfyUI at the target: caps not read",))
    blocking, facts = [], []
    fix = f"applier apply --target {caps.target} --only"
    if caps.max_resolution is None:
        facts.append(f"no MAX_RESOLUTION found ({caps.max_resolution_where})")
    elif longest > caps.max_resolution:
        blocking.append(BlockingCap(
            "MAX_RESOLUTION", caps.max_resolution_where, caps.max_resolution,
            f"EmptyLatentImage and the core image nodes refuse a side of {longest} ('Value {longest} bigger than "
            f"max of {caps.max_resolution}')", f"{fix} comfyui/max-resolution"))
    else:
        facts.append(f"MAX_RESOLUTION {caps.max_resolution} ({caps.max_resolution_where}) allows {longest}")
    pixels = canvas.width * canvas.height
    if caps.pillow_max_image_pixels is None:
        facts.append(f"Pillow's decompression-bomb bound is off ({caps.pillow_where})")
    elif pixels > 2 * caps.pillow_max_image_pixels:
        blocking.append(BlockingCap(
            "PIL.Image.MAX_IMAGE_PIXELS", caps.pillow_where, caps.pillow_max_image_pixels,
            f"LoadImage refuses the saved image (DecompressionBombError above {2 * caps.pillow_max_image_pixels:,} "
            "pixels)", f"{fix} comfyui/pil-pixel-limit"))
    else:
        facts.append(f"Pillow opens {pixels:,} pixels (bound {caps.pillow_max_image_pixels:,}, {caps.pillow_where})")
    node_caps = tuple(NodeCap(cap.what, cap.where, cap.value, cap.node, bool(_CANVAS_SIDE.match(cap.what)))
                      for cap in caps.hard_caps if cap.value < longest)
    return CapsVerdict(True, longest, tuple(blocking), node_caps, tuple(facts) + tuple(caps.notes))


def node_caps_words(caps: CapsVerdict) -> str:
    """The node caps in one line: the lowest that matters and how many others."""
    lowest = caps.lowest_that_matters
    if lowest is None:
        return f"no node input caps a side below {caps.longest}"
    others = len(caps.node_caps) - 1
    node = f"{lowest.node}'s " if lowest.node else ""
    kind = "" if lowest.canvas_side else " (none of them a canvas side)"
    return (f"lowest {node}{lowest.cap} = {lowest.value} ({lowest.where}){kind}"
            + (f", and {others} other{'s' if others > 1 else ''} below {caps.longest}" if others else "")
            + ": each refuses the size only where a workflow uses its node")


# ---------------------------------------------------------------- the verdict

@dataclass(frozen=True)
class NativeOption:
    """A config that runs the whole canvas at once: its time for the request's steps, and whether it fits."""
    config: str
    seconds: float
    fits: bool


@dataclass(frozen=True)
class Verdict:
    kind: VerdictKind
    config: str | None
    seconds: float | None
    steps: int | None                    # the steps the named route was priced at
    tile: TiledRoute | None
    reasons: tuple[str, ...]             # why, in words: native's fate, the route chosen over the others, the caps
    advice: tuple[str, ...] = ()         # out of reach: each change that reaches it, priced

    def as_json(self) -> dict:
        out = {"kind": self.kind, "config": self.config, "words": config_words(self.config) if self.config else None,
               "seconds": self.seconds, "steps": self.steps,
               "reasons": list(self.reasons), "advice": list(self.advice)}
        if self.tile is not None:
            out["tile"] = self.tile.as_json()
        return out


# Prices a changed request: the seconds of its verdict's route when it is in reach, else None.
Alternative = Callable[[Request], "float | None"]


def decide(request: Request, native: list[NativeOption], routes: list[TiledRoute], caps: CapsVerdict,
           activation_bytes: int, alternative: Alternative | None = None, other_gpus: tuple = ()) -> Verdict:
    """native, tiled or out of reach, by the rules of this module's docstring, with the reasons in words; out of
    reach, `alternative` prices each change (steps, within, canvas, the GPUs of `other_gpus`) for the advice."""
    within = request.within_s
    given = duration_words(within)
    cap_words = _cap_reasons(caps)
    runnable = [n for n in native if n.fits]
    fitting = [r for r in routes if r.fits]
    in_time = [r for r in fitting if r.seconds <= within]
    reasons = []
    if runnable:
        best = min(runnable, key=lambda n: n.seconds)
        stock = next((n for n in runnable if n.config == "stock"), None)
        chosen = stock if stock and stock.seconds <= within else best
        if chosen.seconds <= within:
            reasons.append(f"native: fits in memory and finishes in {human_seconds(chosen.seconds)} with "
                           f"{config_words(chosen.config)} ({request.steps} steps), within {given}")
            if chosen is not best:
                reasons.append(f"{STOCK_WORDS} named over {config_words(best.config)}, faster at "
                               f"{human_seconds(best.seconds)}: it finishes in time without the node pack")
            faster = [r for r in fitting if r.seconds < chosen.seconds]
            if faster:
                route = min(faster, key=lambda r: r.seconds)
                reasons.append(f"native over the faster {route.tile_px} px tiles ({human_seconds(route.seconds)}, "
                               f"{route.steps} steps): "
                               "native attends to the whole canvas, a tile to its neighbourhood only (tiles suit a "
                               "refinement at low denoise, as in the template)")
            return Verdict(VerdictKind.NATIVE, chosen.config, chosen.seconds, request.steps, None,
                           tuple(reasons + cap_words))
        reasons.append(f"native: {human_seconds(best.seconds)} with {config_words(best.config)} ({request.steps} "
                       f"steps), over the {given} given")
    elif native:
        reasons.append(f"native: one forward's activations ({activation_bytes / GIB:.1f} GiB) do not fit in "
                       f"{request.memory_bytes / GIB:.1f} GiB")
    else:
        reasons.append("native: no config's time is predicted for this model on this GPU")
    if in_time:
        route = in_time[0]          # the largest tile that finishes in time: fewest seams
        reasons.append(f"tiled: {route_words(route)}: {route_cost_words(route)}")
        fastest = min(fitting, key=lambda r: r.seconds)
        if fastest is not route:
            reasons.append(f"{route.tile_px} px tiles over the faster {fastest.tile_px} px "
                           f"({human_seconds(fastest.seconds)}): the largest tile that finishes within {given} "
                           "has the fewest seams and sees the most of the canvas")
        return Verdict(VerdictKind.TILED, route.config, route.seconds, route.steps, route,
                       tuple(reasons + cap_words))
    if fitting:
        cheapest = min(fitting, key=lambda r: r.seconds)
        reasons.append(f"tiled: the fastest route ({route_words(cheapest)}) takes {route_cost_words(cheapest)}")
    elif routes:
        reasons.append("tiled: no tile size of the model's fits in memory")
    else:
        reasons.append("tiled: the canvas is no larger than the model's tiles")
    options = [(n.seconds, request.steps, 0.0) for n in runnable] + [(r.seconds, r.steps, r.fixed_seconds)
                                                                       for r in fitting]
    advice = _advice(request, min(options) if options else None, alternative, other_gpus)
    return Verdict(VerdictKind.OUT_OF_REACH, None, None, None, None, tuple(reasons + cap_words), advice)


def _cap_reasons(caps: CapsVerdict) -> list[str]:
    if not caps.blocking:
        return []
    names = " and ".join(b.cap for b in caps.blocking)
    return [f"caps: {names} refuse{'s' if len(caps.blocking) == 1 else ''} this size until patched "
            "(the commands below)"]


def _advice(request: Request, fastest: tuple[float, int, float] | None, alternative: Alternative | None,
            other_gpus: tuple) -> tuple[str, ...]:
    """What reaches the canvas within the time given, each change priced: more time, fewer steps (the route's stages
    other than the steps, `fastest`'s third, stay), a smaller canvas, another GPU."""
    within = request.within_s
    advice = []
    if fastest is not None:
        seconds, steps, fixed = fastest
        advice.append(f"--within {duration_option(seconds)}")
        fewer = math.floor((within - fixed) / ((seconds - fixed) / steps))
        if 1 <= fewer < steps:
            advice.append(f"--steps {fewer} (of {steps})")
    if alternative is None:
        return tuple(advice)
    smaller = _largest_canvas_in_reach(request, alternative)
    if smaller is not None:
        canvas, seconds = smaller
        advice.append(f"a smaller canvas: --size {canvas.width}x{canvas.height} ({human_seconds(seconds)})")
    gpus = []
    for gpu in other_gpus:
        seconds = alternative(replace(request, gpu=gpu, memory_mib=None, gpu_how="--gpu"))
        if seconds is not None:
            gpus.append((seconds, gpu.key))
    if gpus:
        advice.append("another GPU: " + ", ".join(f"--gpu {key} ({human_seconds(s)})" for s, key in sorted(gpus)[:2]))
    return tuple(advice)


def _largest_canvas_in_reach(request: Request, alternative: Alternative) -> tuple[Canvas, float] | None:
    """The largest canvas of the request's shape (sides multiples of 64) in reach, by bisection on the scale."""
    canvas = request.canvas

    def scaled(scale: float) -> Canvas:
        return Canvas(max(64, int(canvas.width * scale) // 64 * 64), max(64, int(canvas.height * scale) // 64 * 64),
                      canvas.frames)

    low, high, found = 0.0, 1.0, None
    for _ in range(12):
        middle = (low + high) / 2
        trial = scaled(middle)
        seconds = alternative(replace(request, canvas=trial))
        if seconds is not None:
            low, found = middle, (trial, seconds)
        else:
            high = middle
    return found
