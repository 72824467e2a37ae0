"""The one place that picks: for the model a ComfyUI node was given, which implementation each op family runs (or why
it stays stock), said once per line on ComfyUI's console.

The families and what their implementations need are data (families.py); the picking walks a family's
implementations in order and keeps the first whose needs hold: the ComfyUI code it was verified on (checked block by
block through integration/eras.py, by `recognition` and the install plan), the load device's compute capability,
the VRAM mode, capture-safety where ComfyUI's model compiler captures blocks in CUDA graphs, and for the attention
override the release's SDPA backend order (it runs where the order's first backend leaves it a gain: `order_refusal`).
The FP8 family also gets its weight mechanism here (families.FP8_WEIGHTS). Every line goes through the pack's
once-only log (state.say_once): per model one INFO line (what runs, what stays stock, a short reason each), the
long reasons per family at DEBUG.

The node picks in two steps: `decide` when it runs, from cheap facts only (the request, the release's SDPA order,
the ModelPatcher's load device, VRAM mode and options, the diffusion model's class), and `settle` at the model's
first use, on its blocks (recognition, fingerprints, the install plan), where the lines are said; `choose` is both.

Per op call, dispatch.py still chooses Triton or eager for the tensors it is given; the installer
(integration/__init__.py) puts the chosen families in around each model call (`enable`, `disable`).
"""
from __future__ import annotations

import contextlib
import logging
import sys
from dataclasses import dataclass

import torch

from . import dispatch, state
from .families import (ATTENTION_MODES, CACHED_CODES, CODES_BESIDE_WEIGHTS, CODES_IN_PLACE, DYNAMIC, EXACT, FAMILIES,
                       FASTEST_SDPA, FP8, FP8_ATTENTION, FP8_WEIGHTS, GENERIC_FP8_EVIDENCE, LEGACY, LINEAR_FP8_SEAM,
                       NO_EXTRA_MEMORY, PER_CALL_CODES, PER_CALL_EVIDENCE, RESIDENT_CODES, Implementation, Needs,
                       fp8_weight_policy)
from .integration import (BLOCK_SPECS, GENERIC_MIN_BLOCKS, OP_FAMILIES, UNSUPPORTED, UnsupportedModelError,
                          attention, attention_fp8, fp8_codes, fp8_weights, fp8_linear_modules, generic_blocks,
                          is_active, recognition, supported_blocks)
from .integration import disable as _disable
from .integration import enable as _enable
from .ops import fp8_linear
from .ops.fp8_linear import OP as FP8_OP

NODE_LINE = "Fused DiT Ops on %s"        # the node's one line per model on ComfyUI's console (INFO), said once
DETAIL_LINE = "Fused DiT Ops: %s"        # the long reason of each family (DEBUG), said once each
UNKNOWN_MODEL = "no Flux or Wan blocks"


def enable(model: torch.nn.Module, ops=OP_FAMILIES, fp8_weights: str = CODES_BESIDE_WEIGHTS) -> dict:
    """Install the op families `ops` on every block of `model` that runs their verified code (integration.enable);
    returns what was installed and what stayed stock. For scripts that enable once and run many calls,
    fp8_weights=NO_EXTRA_MEMORY (earlier "replace") holds the FP8 Linears' weights as WEIGHTS_IN_HOST_MEMORY."""
    return _enable(model, ops, weights_in_host_memory=fp8_weight_policy(fp8_weights) == NO_EXTRA_MEMORY)


disable = _disable


@contextlib.contextmanager
def enabled(model: torch.nn.Module, ops, keep_resident_codes: bool = False, device: torch.device | None = None):
    """The families `ops` installed on `model` for the calls inside, the stock forwards back in `finally` (the
    node's APPLY_MODEL wrapper); keep_resident_codes: the codes_beside_weights policy under DynamicVRAM; device:
    where the model computes (the input's device)."""
    _enable(model, ops)
    if "fp8_linear" in ops and device is not None and device.type == "cuda":
        # the FP8 GEMM path's per-stream buffers, made before the model's forward opens the compiler's record
        for dtype in fp8_linear.SUPPORTED_ACTIVATION_DTYPES:
            fp8_linear.prepare_stream(device, dtype)
    try:
        with fp8_weights.keep_resident_codes(keep_resident_codes):
            yield
    finally:
        _disable(model)


def drop_fp8_weights(model: torch.nn.Module) -> None:
    """Forget every FP8 copy of `model`'s weights (ComfyUI's ON_CLEANUP of the node's clone)."""
    _disable(model, drop_fp8_weights=True)


def install_attention(model_options: dict, selection: "Selection | Decision | None" = None) -> str:
    """Put the attention family's override for `selection`'s mode (None: exact) into a cloned ModelPatcher's
    options (decide said whether it runs)."""
    if selection is None or selection.attention_mode != FP8:
        return attention.install(model_options)
    exact = attention.FastestSdpa() if selection.attention_exact_fallback else None
    return attention.install(model_options, attention_fp8.Fp8Attention(exact))


def put_codes_in_place(patcher) -> fp8_codes.Replacement:
    """CODES_IN_PLACE on the ModelPatcher ComfyUI is about to load (the node's PREPARE_SAMPLING hook): an object
    patch of FP8 codes for each Linear FP8 runs, once per patcher (one that has them, or came from one that had
    them, keeps them: nothing is quantised again)."""
    if fp8_codes.holds_codes(patcher):
        return fp8_codes.Replacement(0, 0)
    return fp8_codes.add_object_patches(patcher, fp8_linear_modules(patcher.model.diffusion_model))


@dataclass(frozen=True)
class Request:
    """What the node was asked for."""
    families: tuple[str, ...]
    fp8_weights: str = NO_EXTRA_MEMORY           # a policy, or its earlier spelling
    graphs_captured: bool = False                # ComfyUI's model compiler captures each block in a CUDA graph
    attention_mode: str = EXACT                  # families.ATTENTION_MODES


@dataclass(frozen=True)
class Selection:
    """What the node installs on its clone of the ModelPatcher."""
    ops: tuple[str, ...]                         # the families enable() installs around each model call
    wrap: bool                                   # whether that changes anything the model runs
    attention: bool                              # put the attention override into the clone's options
    fp8_weights: str | None                      # the weight mechanism (families.FP8_WEIGHTS); None: FP8 off
    lines: tuple[str, ...]                       # what runs per family, or why it stays stock (DEBUG)
    attention_mode: str = EXACT                  # the override put in where `attention` (families.ATTENTION_MODES)
    attention_exact_fallback: bool = False       # fp8: the exact mode takes the calls FP8 refuses (else ComfyUI's)
    summary: str = ""                            # the one line (INFO): what runs, what stays stock and why, briefly

    @property
    def keep_resident_codes(self) -> bool:
        """Whether the model calls keep the codes of resident weights (the codes_beside_weights policy)."""
        return self.fp8_weights in (RESIDENT_CODES, CACHED_CODES)


def vram_mode(patcher) -> str:
    """DYNAMIC for ComfyUI's ModelPatcherDynamic (is_dynamic() true), else LEGACY."""
    is_dynamic = getattr(patcher, "is_dynamic", None)
    return DYNAMIC if callable(is_dynamic) and is_dynamic() else LEGACY


def runs_on(device, needs: Needs) -> str | None:
    """None where an implementation's kernels can run on `device` (a ModelPatcher's load device), else why not."""
    if device is None:
        return "the ModelPatcher names no load device"
    if needs.min_capability is None:
        return None
    choice = dispatch.choose(FP8_OP, torch.empty(0, device=device, dtype=torch.bfloat16),
                             min_capability=needs.min_capability)
    return None if choice.triton else choice.reason


def capture_refusal(implementation: Implementation, request: Request) -> str | None:
    """Why `implementation` must not run where blocks are captured in CUDA graphs, or None."""
    if request.graphs_captured and not implementation.needs.capture_safe:
        return f"{implementation.name} is not capture-safe ({implementation.needs.capture_note})"
    return None


def order_refusal(implementation: Implementation, order: list[str] | None) -> str | None:
    """Why `implementation` gains nothing on the release's SDPA backend order `order` (names, first first), or None
    where it does (needs.gains_after: its first backend; no such need: any order)."""
    gains_after = implementation.needs.gains_after
    if not gains_after:
        return None
    if not order:
        return "this ComfyUI orders no SDPA backends here (comfy.ops.SDPA_BACKEND_PRIORITY: no CUDA, or a release " \
               "before it), so there is nothing to reorder"
    if order[0] in gains_after:
        return None
    cited = f"; {implementation.no_gain.cite()}" if implementation.no_gain else ""
    return (f"the release's SDPA order puts {order[0]} first, where {implementation.name} was measured no faster "
            f"than that order{cited}")


def _runs_on_order(implementation: Implementation, order: list[str] | None) -> str:
    """The attention line where the override runs: what it does, and on which order it was measured faster."""
    why = [f"the release's SDPA order puts {order[0]} first"] if order else []
    why += [implementation.faster.cite()] if implementation.faster else []
    return f"{attention.RUNS} ({'; '.join(why)})" if why else attention.RUNS


@dataclass(frozen=True)
class Decision:
    """What the node decides when it runs, from cheap facts: the request, the loaded ComfyUI (its SDPA order), the
    ModelPatcher (load device, VRAM mode, options) and the diffusion model's class. What needs the model's blocks
    (recognising and fingerprinting them, the install plan, FP8 codes) waits for its first call: `settle`."""
    request: Request
    model_name: str                              # the diffusion model's class name
    model_module: str                            # the module that defines it
    blocks_named: bool                           # its class's module names a block class the overlays know
    asked_ops: tuple[str, ...]                   # the op families asked for, in OP_FAMILIES' order
    captured: tuple[tuple[str, str], ...]        # (family, line): refused where blocks are captured in CUDA graphs
    fp8_weights: str | None                      # the weight mechanism where FP8 runs (families.FP8_WEIGHTS)
    fp8_line: str                                # its line ("" where fp8_linear is not asked or refused)
    attention: bool                              # put the attention override into the clone's options
    attention_mode: str
    attention_exact_fallback: bool
    attention_line: str                          # "" where attention is not asked for
    attention_brief: str

    @property
    def may_run(self) -> tuple[str, ...]:
        """The op families the first model call may run: block families only on a class that names their blocks
        (`names_known_blocks`), FP8 on any model (the Linear seam of its transformer stacks)."""
        refused = {name for name, _ in self.captured}
        return tuple(name for name in self.asked_ops
                     if name not in refused and (name == "fp8_linear" or self.blocks_named))


def names_known_blocks(model_class: type) -> bool:
    """Whether the module of `model_class`, or of one of its bases, names a class of the blocks the overlays know
    (ComfyUI's Flux and Wan models import or define theirs there): read from the class, without walking a model."""
    for cls in model_class.__mro__:
        namespace = getattr(sys.modules.get(cls.__module__), "__dict__", {})
        if any(isinstance(value, type) and any(c.__name__ in BLOCK_SPECS for c in value.__mro__)
               for value in list(namespace.values())):
            return True
    return False


def decide(patcher, request: Request) -> Decision:
    """The node's choice when it runs, from cheap facts only (see Decision); says none of the node's lines."""
    model_class = type(patcher.model.diffusion_model)
    policy = fp8_weight_policy(request.fp8_weights)
    asked = set(request.families)
    asked_ops = tuple(name for name in OP_FAMILIES if name in asked)
    captured = []
    for name in asked_ops:
        refused = [capture_refusal(impl, request) for impl in FAMILIES[name].implementations]
        if all(refused):
            captured.append((name, f"{name}: stock ({'; '.join(refused)})"))
    mechanism, fp8_line = None, ""
    if "fp8_linear" in asked_ops and "fp8_linear" not in dict(captured):
        mechanism, fp8_line = _fp8_weights(patcher, policy)
    attention_parts = (False, EXACT, False, "", "")
    if "attention" in asked:
        attention_parts = _attention(patcher, request)
    use_attention, mode, exact_fallback, attention_line, brief = attention_parts
    return Decision(request, model_class.__name__, model_class.__module__, names_known_blocks(model_class),
                    asked_ops, tuple(captured), mechanism, fp8_line, use_attention, mode, exact_fallback,
                    attention_line, brief)


def choose(patcher, request: Request) -> Selection:
    """The implementation of each family asked for on `patcher`'s diffusion model, or why it stays stock, all at
    once (scripts, tests): `decide`, then `settle` on the model."""
    return settle(decide(patcher, request), patcher.model.diffusion_model)


def settle(decision: Decision, model: torch.nn.Module | None = None) -> Selection:
    """The decision made on `model`'s blocks (the node's first model call): one line per model said once at INFO
    (logger `fused_dit`, shown on ComfyUI's console), each family's long reason at DEBUG. model None: where
    nothing waits for a first call (decision.may_run empty), the class's facts stand for its blocks."""
    ops = decision.asked_ops
    lines: list[str] = []
    stock: dict[str, str] = {}                   # family -> why it stays stock, in a few words
    if model is None:
        if not decision.blocks_named:
            unknown = UnsupportedModelError(UNSUPPORTED.format(model=f"{decision.model_module}.{decision.model_name}",
                                                               blocks=", ".join(BLOCK_SPECS)))
            ops, lines, stock = _on_unknown_model(None, tuple(n for n in ops if n != "fp8_linear"), unknown)
            ops += ("fp8_linear",) if "fp8_linear" in decision.asked_ops else ()
    else:
        try:
            supported_blocks(model)
        except UnsupportedModelError as unknown:
            ops, lines, stock = _on_unknown_model(model, ops, unknown)
        lines += [f"{family}: {line}" for family, line in recognition(model, ops).items()]
    refused = dict(decision.captured)
    lines += [refused[name] for name in ops if name in refused]
    stock.update((name, CAPTURE_SHORT) for name in ops if name in refused)
    ops = tuple(name for name in ops if name not in refused)
    wrap = bool(ops) and is_active(model, ops)
    if ops and not wrap:
        # nothing to install around the calls: the model runs as ComfyUI's own
        lines.append(f"{', '.join(ops)}: every one stays stock on {decision.model_name} (above), so the node's "
                     f"wrapper passes its model calls straight through")
    runs: dict[str, str] = {}                    # family -> what runs, in a few words
    for name in ops:
        if wrap and (len(ops) == 1 or is_active(model, (name,))):
            runs[name] = "FP8 Linears" if name == "fp8_linear" else "fused Triton kernels"
        else:
            stock[name] = _code_differs(name)
    mechanism = None
    if "fp8_linear" in ops:
        mechanism = decision.fp8_weights
        lines.append(decision.fp8_line)
        if mechanism and "fp8_linear" in runs:
            runs["fp8_linear"] = f"FP8 Linears, {FP8_WEIGHTS[mechanism].brief}"
    if decision.attention_line:
        lines.append(decision.attention_line)
        (runs if decision.attention else stock)["attention"] = decision.attention_brief
    off = [name for name in FAMILIES if name not in decision.request.families]
    summary = summary_line(decision.model_name, runs, stock, off)
    for line in lines:
        state.say_once(DETAIL_LINE, line, level=logging.DEBUG)
    state.say_once(NODE_LINE, summary)
    return Selection(ops, wrap, decision.attention, mechanism, tuple(lines), decision.attention_mode,
                     decision.attention_exact_fallback, summary)


CAPTURE_SHORT = "not safe under the model compiler's CUDA graphs"


def summary_line(model_name: str, runs: dict[str, str], stock: dict[str, str], off: list[str]) -> str:
    """The node's one line for a model: the families that run and what, those that stay stock and why (families
    sharing a reason named together), those switched off."""
    def grouped(by_family: dict[str, str]) -> str:
        groups: dict[str, list[str]] = {}
        for family, words in by_family.items():
            groups.setdefault(words, []).append(family)
        return "; ".join(f"{', '.join(families)} ({words})" for words, families in groups.items())
    parts = [f"runs {grouped(runs)}" if runs else "runs nothing of its own: the model is ComfyUI's as loaded"]
    parts += [f"Stock: {grouped(stock)}"] if stock else []
    parts += [f"Off: {', '.join(off)}"] if off else []
    return f"{model_name}: {'. '.join(parts)}. Details at DEBUG."


def _code_differs(family: str) -> str:
    """Why a family whose code the model has stays stock, in a few words: the code it was verified on is not this
    ComfyUI's (the long reason, with the differing code, is the family's DEBUG line)."""
    if state.STATE.variants_problem:
        return state.STATE.variants_problem
    variants = state.all_variants()
    names = [impl.needs.verified_code for impl in FAMILIES[family].implementations if impl.needs.verified_code]
    legacy = [name for name, impl in zip(names, FAMILIES[family].implementations) if impl.legacy]
    releases = sorted({release.split(":")[0] for name in (legacy or names) if name in variants
                       for release in variants[name].verified_on})
    releases = ", ".join(releases) or "none"
    if legacy:
        return f"written for ComfyUI {releases}'s blocks, not this release's"
    return f"verified on ComfyUI {releases}, not on this code"


def _attention(patcher, request: Request) -> tuple[bool, str, bool, str, str]:
    """(whether an override goes in, its mode, whether fp8's refused calls take the exact mode, the line, in a few
    words what runs or why it stays stock)."""
    if request.attention_mode not in ATTENTION_MODES:
        raise ValueError(f"attention_mode={request.attention_mode!r}; expected one of {', '.join(ATTENTION_MODES)}")
    order = attention.release_order()
    another = attention.stays_stock(patcher.model_options)
    refusals = ((capture_refusal(FASTEST_SDPA, request), CAPTURE_SHORT), (another, another),
                (order_refusal(FASTEST_SDPA, order),
                 f"{order[0]} is first in this release's SDPA order" if order else "no SDPA order to change"))
    exact_refused, brief = next(((long, short) for long, short in refusals if long), (None, attention.RUNS))
    exact_line = _runs_on_order(FASTEST_SDPA, order) if exact_refused is None else f"stock: {exact_refused}"
    if request.attention_mode == FP8:
        fp8_refused = (another or capture_refusal(FP8_ATTENTION, request)
                       or runs_on(getattr(patcher, "load_device", None), FP8_ATTENTION.needs))
        if fp8_refused is None:
            behind = "the exact mode" if exact_refused is None else "ComfyUI's own attention"
            return (True, FP8, exact_refused is None, f"attention: {attention_fp8.RUNS} (refused calls: {behind})",
                    f"fp8 mode, lossy; refused calls: {behind}")
        exact_line = f"fp8 -> exact ({fp8_refused}): {exact_line}"
        brief = f"fp8 mode cannot run here; {brief}"
    return exact_refused is None, EXACT, False, f"attention: {exact_line}", brief


def _on_unknown_model(model, ops: tuple[str, ...], unknown: UnsupportedModelError
                      ) -> tuple[tuple, list[str], dict[str, str]]:
    """A model whose blocks the block families do not know (Qwen-Image, Lumina, SD3, ...): they stay stock; FP8
    takes the Linear seam in its transformer stacks' blocks where it has some (integration.generic_blocks).
    Returns (the families left to run, their long lines, {family: why it stays stock, briefly})."""
    lines = []
    block_families = [name for name in ops if name != "fp8_linear"]
    stock = dict.fromkeys(block_families, UNKNOWN_MODEL)
    if block_families:
        lines.append(f"{', '.join(block_families)}: stock ({unknown})")
    if "fp8_linear" not in ops:
        return (), lines, stock
    if not generic_blocks(model):
        lines.append(f"fp8_linear: stock ({unknown}, and no stack of {GENERIC_MIN_BLOCKS} or more blocks of one "
                     f"class)")
        stock["fp8_linear"] = f"{UNKNOWN_MODEL}, and no stack of blocks of one class"
        return (), lines, stock
    lines.append("fp8_linear on a model the block families do not know was measured on Qwen-Image and Z-Image: "
                 "faster from 2048 px on both; slower at 1024 px on Qwen-Image, where its text stream's short Linears "
                 f"cost more than FP8 saves ({GENERIC_FP8_EVIDENCE.cite()}). Turn it on for large canvases")
    return ("fp8_linear",), lines, stock


def _fp8_weights(patcher, policy: str) -> tuple[str | None, str]:
    """(the weight mechanism, its line) for the node's FP8 Linears under `patcher`."""
    mode = vram_mode(patcher)
    if policy == CODES_BESIDE_WEIGHTS:
        mechanism = RESIDENT_CODES if mode == DYNAMIC else CACHED_CODES
        return mechanism, f"fp8_weights: {mechanism} ({FP8_WEIGHTS[mechanism].does})"
    cannot = runs_on(getattr(patcher, "load_device", None), LINEAR_FP8_SEAM.needs)
    if cannot:
        return None, f"fp8_weights: {NO_EXTRA_MEMORY} left the bf16 weights ({cannot})"
    if mode == DYNAMIC:
        return PER_CALL_CODES, (
            f"fp8_weights: {PER_CALL_CODES} ({FP8_WEIGHTS[PER_CALL_CODES].does}: ComfyUI's DynamicVRAM (comfy-aimdo) "
            f"owns the weights, and codes in their place would take LoRA (weight_lowvram_function) in the codes' "
            f"unscaled values. Against {CODES_BESIDE_WEIGHTS} ({RESIDENT_CODES}) and against a start with "
            f"--disable-dynamic-vram ({CODES_IN_PLACE}): {PER_CALL_EVIDENCE.cite()})")
    return CODES_IN_PLACE, f"fp8_weights: {CODES_IN_PLACE} ({FP8_WEIGHTS[CODES_IN_PLACE].does})"
