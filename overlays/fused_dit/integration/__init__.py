"""Swapping overlay forwards into a diffusion model and restoring them.

A block is recognised by its class name (ComfyUI's `DoubleStreamBlock`, `SingleStreamBlock`, `WanAttentionBlock`,
or a subclass that keeps their forward) and by its forward's parameter names, so a ComfyUI release that changes a
block's signature leaves that block stock (logged) instead of running mismatched math. Overlay forwards are set as
per-instance `forward` attributes: the classes and module-level functions of ComfyUI are never modified, so other
models in the same process are unaffected, and `disable` restores exactly what was there before.

The block classes the overlays know are flux.BLOCKS and wan.BLOCKS (BlockSpecs, integration/blocks.py); helpers
the overlay forwards need from the model's own code are looked up in the module that defines the block class.

Every block forward and the FP8 Linear seam are variants verified on given ComfyUI releases (fused_dit.variants):
a block's forward overlay runs only where the code that block runs has the fingerprints of a verified release
(`eras.block_match`), each Linear's FP8 forward only where its op's forward does (`eras.linear_match`). Anything
else stays stock, says why once (logger `fused_dit`) and is listed in the report's "skipped"; op seams report in
its "seams" (integration/seams.py).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from .. import state
from . import eras, flux, seams, wan
from .blocks import BlockSpec, forward_matches
from .fp8_modules import (SAVED_FORWARD_ATTR, drop_fp8_cache, ffn_overlay, is_gelu_tanh_ffn, is_linear,
                          linear_overlay, new_enable_epoch, restore_stored_weight, slot_of, stock_forward_of,
                          store_fp8_only)

OP_FAMILIES = ("norm_rope", "adaln", "gate", "fp8_linear")
OVERLAY_MARK = "_fused_dit_overlay"
# (key, saved forward, the partial, id of the module): the overlay forward of the last enable, handed out again by
# the next enable of the same overlay, so torch.compile's guards on `module.forward` hold across ComfyUI's
# enable/disable per step. The id: a deep copy of the module brings the record along, but its partial's lambdas
# still name the original module (deepcopy keeps functions as they are)
_REUSED_FORWARD_ATTR = "_fused_dit_reused_forward"


class UnsupportedModelError(ValueError):
    """The model has no block the overlays know (only ComfyUI's Flux and Wan are supported)."""


def install_forward(module: torch.nn.Module, overlay_forward, key) -> None:
    """Set `module.forward` to `overlay_forward(stock_forward, *args, **kwargs)`; idempotent.

    `key` names the overlay (e.g. the op families): a later install with the same key over the same stock forward
    gets the same forward object back.
    """
    if OVERLAY_MARK in module.__dict__:
        return
    saved = module.__dict__.get("forward")
    module.__dict__[SAVED_FORWARD_ATTR] = saved
    reused = module.__dict__.get(_REUSED_FORWARD_ATTR)
    if reused is not None and reused[0] == key and reused[1] is saved and reused[3] == id(module):
        forward = reused[2]
    else:
        forward = functools.partial(overlay_forward, stock_forward_of(module))
        module.__dict__[_REUSED_FORWARD_ATTR] = (key, saved, forward, id(module))
    module.__dict__["forward"] = forward
    module.__dict__[OVERLAY_MARK] = True


def restore_forward(module: torch.nn.Module) -> bool:
    if OVERLAY_MARK not in module.__dict__:
        return False
    saved = module.__dict__.pop(SAVED_FORWARD_ATTR, None)
    del module.__dict__[OVERLAY_MARK]
    if saved is None:
        module.__dict__.pop("forward", None)
    else:
        module.__dict__["forward"] = saved
    return True


def _fp8_units(block: torch.nn.Module, skip_prefixes: tuple[str, ...]):
    """(module, is_ffn) for each unit of a block that runs in FP8: GELU(tanh) FFNs as one, other Linears alone;
    modulation Linears (skip_prefixes) stay stock."""
    handled: set[int] = set()
    for name, module in block.named_modules():
        if any(name == p or name.startswith(p + ".") for p in skip_prefixes) or id(module) in handled:
            continue
        if is_gelu_tanh_ffn(module):
            handled.update({id(module[0]), id(module[2])})
            yield module, True
        elif is_linear(module):
            yield module, False


def _fp8_seam_units(block: torch.nn.Module, skip_prefixes: tuple[str, ...]):
    """_fp8_units whose Linear ops have a forward the FP8 seam was verified on (the others stay stock, said once)."""
    for module, is_ffn in _fp8_units(block, skip_prefixes):
        if all(eras.linear_match(linear).matched for linear in ((module[0], module[2]) if is_ffn else (module,))):
            yield module, is_ffn


def planned_fp8_linears(block: torch.nn.Module, skip_prefixes: tuple[str, ...]) -> tuple[list, list]:
    """(installs, linears): the FP8 forwards for a block's Linear layers as (module, overlay forward, key) to hand
    to install_forward (FFNs get the fused GELU path), and the Linear modules they run in FP8. Modulation Linears
    stay stock, and so do Linear ops whose forward the FP8 seam was not verified on."""
    installs: list = []
    linears: list[torch.nn.Module] = []
    for module, is_ffn in _fp8_seam_units(block, skip_prefixes):
        slot_of(module)
        if is_ffn:
            installs.append((module, functools.partial(ffn_overlay, module), "fp8_ffn"))
            linears += [module[0], module[2]]
        else:
            installs.append((module, functools.partial(linear_overlay, module), "fp8_linear"))
            linears.append(module)
    return installs, linears


def planned_block_overlays(block: torch.nn.Module, spec: BlockSpec, ops: frozenset,
                           forward_verified: bool = True) -> tuple[list, list]:
    """(installs, FP8 Linears) for one recognised block: its forward overlay (where its code is the verified one)
    and its Linears' FP8 forwards, as (module, overlay forward, key) for install_forward."""
    installs: list = []
    block_ops = ops - {"fp8_linear"}
    if block_ops and forward_verified:
        installs.append((block, functools.partial(spec.forward, block, block_ops), ("block", block_ops)))
    if "fp8_linear" not in ops:
        return installs, []
    fp8_installs, linears = planned_fp8_linears(block, spec.linear_skip)
    return installs + fp8_installs, linears


BLOCK_SPECS: dict[str, BlockSpec] = {spec.class_name: spec for spec in (*flux.BLOCKS, *wan.BLOCKS)}


def _recognised_blocks(model: torch.nn.Module, skipped: list[str]):
    """(block, spec, forward_verified) for every block of a known class; forward_verified: its forward is the one
    its overlay was written for and the code it runs matches a release the variant was verified on. The others are
    logged once and listed in `skipped` (their Linears may still take the FP8 seam)."""
    specs = BLOCK_SPECS
    for module in model.modules():
        for class_name, spec in specs.items():
            if any(c.__name__ == class_name for c in type(module).__mro__):
                reason = forward_matches(module, class_name, spec.parameters)
                if reason is None:
                    verdict = eras.block_match(module, spec.variant, spec.dependencies)
                    reason = None if verdict.matched else f"{spec.variant}: {verdict.reason}"
                else:
                    eras.say_once(type(module).__name__, reason)
                if reason:
                    skipped.append(f"{type(module).__name__}: {reason}")
                yield module, spec, reason is None
                break


# the FP8 Linear seam on a model whose blocks the overlays do not know (Qwen-Image, Lumina, SD3, ...): the blocks of
# its transformer stacks are the members of every nn.ModuleList of GENERIC_MIN_BLOCKS or more modules of one class;
# their Linears run the seam (the same per-op verification, LoRA and cast handling as Flux's and Wan's), but those
# under a submodule whose name holds "mod" (img_mod, txt_mod, modulation, adaLN_modulation: one timestep row, the
# numbers every token's scale and shift come from) stay stock, as the known blocks' modulation does
GENERIC_MIN_BLOCKS = 4


def generic_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The blocks of `model`'s transformer stacks (see GENERIC_MIN_BLOCKS), in model order."""
    blocks: list[torch.nn.Module] = []
    for module in model.modules():
        if (isinstance(module, torch.nn.ModuleList) and len(module) >= GENERIC_MIN_BLOCKS
                and len({type(member) for member in module}) == 1 and not is_linear(module[0])):
            blocks.extend(module)
    return blocks


def modulation_prefixes(block: torch.nn.Module) -> tuple[str, ...]:
    """The submodules of a generic block whose Linears stay stock under fp8_linear (a name holding "mod")."""
    return tuple(name for name, _ in block.named_modules() if name and "mod" in name.rsplit(".", 1)[-1])


UNSUPPORTED = ("fused_dit supports ComfyUI's Flux (comfy.ldm.flux.model.Flux) and Wan (comfy.ldm.wan.model.WanModel) "
               "diffusion models; {model} has none of their blocks ({blocks})")


def supported_blocks(model: torch.nn.Module) -> int:
    """How many blocks of `model` the overlays know; raises UnsupportedModelError when none."""
    names = tuple(BLOCK_SPECS)
    count = sum(1 for m in model.modules() if any(c.__name__ in names for c in type(m).__mro__))
    if not count:
        raise UnsupportedModelError(UNSUPPORTED.format(model=f"{type(model).__module__}.{type(model).__name__}",
                                                       blocks=", ".join(names)))
    return count


def fp8_linear_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """(name in model, module) of every Linear `enable(model, ops=("fp8_linear",))` would run in FP8, in model
    order, without installing anything; raises UnsupportedModelError like enable."""
    chosen = {id(linear) for linear in plan(model, ("fp8_linear",)).fp8_modules}
    return [(name, module) for name, module in model.named_modules() if id(module) in chosen]


@dataclass
class Plan:
    """What `enable` installs on one model for one set of op families, worked out once and kept on the model
    (ComfyUI's node enables and disables around every model call: recognising blocks, matching fingerprints and
    walking every block's Linears each time cost tens of milliseconds of host time per step). It is used again
    while the model has the same modules in the same places (`structure`; `modules` holds them, so no id is
    reused while the plan lives), the recognised blocks' classes have the same forward and no verified era was
    added or removed (eras.epoch)."""
    key: tuple
    structure: list[int]
    modules: list[torch.nn.Module]
    installs: list                       # (module, overlay forward, key) for install_forward
    class_forwards: tuple                # type(module).forward of each install, in order
    fp8_modules: list[torch.nn.Module]
    report: dict                         # enable's report, "seams" filled in per enable where wants_seams
    wants_seams: bool                    # norm_rope asked for and some block runs no block-forward variant
    rope_namespace: dict | None          # seams.rope_module_globals(model) where wants_seams


_PLAN_ATTR = "_fused_dit_install_plans"   # {op families: Plan}
_ENABLED_ATTR = "_fused_dit_enabled"     # the plan the last enable installed, for disable


def _walk(model: torch.nn.Module) -> tuple[list[int], list[torch.nn.Module]]:
    """(ids, modules) of the model and every submodule, in a fixed order: a walk of `_modules` without
    named_modules' prefixes and set (a quarter of its cost)."""
    ids: list[int] = []
    modules: list[torch.nn.Module] = []
    stack = [model]
    while stack:
        module = stack.pop()
        if module is None:
            continue
        ids.append(id(module))
        modules.append(module)
        stack.extend(module._modules.values())
    return ids, modules


def plan(model: torch.nn.Module, ops=OP_FAMILIES) -> Plan:
    """The install plan for `model` and `ops` (frozenset), the cached one while it still holds; raises
    UnsupportedModelError like enable."""
    ops = frozenset(ops)
    key = (ops, eras.epoch())
    structure, modules = _walk(model)
    plans = model.__dict__.setdefault(_PLAN_ATTR, {})
    cached = plans.get(ops)
    if (cached is not None and cached.key == key and cached.structure == structure
            and all(type(module).forward is forward
                    for (module, _, _), forward in zip(cached.installs, cached.class_forwards))):
        return cached
    generic = _generic_fp8_blocks(model, ops)
    report = {"blocks": 0, "fp8_linears": 0, "skipped": []}
    installs: list = []
    fp8_modules: list[torch.nn.Module] = []
    for block, spec, forward_verified in _recognised_blocks(model, report["skipped"]):
        block_installs, linears = planned_block_overlays(block, spec, ops, forward_verified)
        installs += block_installs
        fp8_modules += linears
        report["blocks"] += forward_verified
    for block in generic:
        block_installs, linears = planned_fp8_linears(block, modulation_prefixes(block))
        installs += block_installs
        fp8_modules += linears
    if generic:
        report["generic_blocks"] = len(generic)
    report["fp8_linears"] = len(fp8_modules)
    # blocks that run their block-forward variant apply RoPE themselves; the seam serves the others
    wants_seams = "norm_rope" in ops and bool(report["skipped"] or not report["blocks"])
    report["seams"] = {}
    fresh = Plan(key=key, structure=structure, modules=modules, installs=installs,
                 class_forwards=tuple(type(module).forward for module, _, _ in installs),
                 fp8_modules=fp8_modules, report=report, wants_seams=wants_seams,
                 rope_namespace=seams.rope_module_globals(model) if wants_seams else None)
    plans[ops] = fresh
    return fresh


def _generic_fp8_blocks(model: torch.nn.Module, ops: frozenset) -> list[torch.nn.Module]:
    """[] for a model with blocks the overlays know; for any other model asked for fp8_linear alone, its generic
    blocks (the FP8 Linear seam needs no block forward); otherwise UnsupportedModelError, as before."""
    try:
        supported_blocks(model)
        return []
    except UnsupportedModelError:
        blocks = generic_blocks(model) if ops == {"fp8_linear"} else []
        if not blocks:
            raise
        return blocks


def enable(model: torch.nn.Module, ops=OP_FAMILIES, weights_in_host_memory: bool = False) -> dict:
    """Install the overlays on every supported block of `model`; returns what was patched and what was skipped.

    weights_in_host_memory (with the fp8_linear family): quantise the FP8 linears' weights now and keep only their
    FP8 codes on the GPU, the bf16/fp16 originals in host memory until `disable` moves them back. For scripts that
    enable once and run many calls; each enable/disable pair copies those weights across PCIe twice. (The public
    `fused_dit.enable` names it by its FP8 weight policy: registry.py.)
    """
    ops = frozenset(ops)
    unknown = ops - set(OP_FAMILIES)
    if unknown:
        raise ValueError(f"unknown op families {sorted(unknown)}; known: {', '.join(OP_FAMILIES)}")
    chosen = plan(model, ops)
    new_enable_epoch()
    for module, forward, key in chosen.installs:
        install_forward(module, forward, key)
    model.__dict__[_ENABLED_ATTR] = chosen
    report = {**chosen.report, "skipped": list(chosen.report["skipped"])}
    if chosen.wants_seams:
        report["seams"] = seams.install(model, ops, chosen.rope_namespace)
    if weights_in_host_memory:
        freed = [store_fp8_only(module) for module in chosen.fp8_modules]
        report["fp8_weights_stored_in_host_memory"] = sum(1 for b in freed if b)
        report["gpu_bytes_freed"] = sum(freed)
    return report


def is_active(model: torch.nn.Module, ops=OP_FAMILIES) -> bool:
    """Whether enabling `ops` on `model` would change anything it runs: a forward to install or an op seam
    that would run (the node adds no per-call wrapper where nothing would)."""
    chosen = plan(model, ops)
    return bool(chosen.installs) or (chosen.wants_seams and seams.would_install(chosen.rope_namespace))


def disable(model: torch.nn.Module, drop_fp8_weights: bool = False) -> int:
    """Restore every forward and op seam the overlays replaced and move weights stored in host memory back; returns
    how many forwards and seams. FP8 weight copies are kept unless asked. After an enable of this process it
    visits only what that enable installed; otherwise (and when dropping FP8 copies) every module. Dropping FP8
    copies also forgets the model's install plans: they hold the modules they were made for, among them a clone's
    FP8 codes Linears that ComfyUI has taken out of the model again."""
    restored = seams.restore(model)
    enabled = model.__dict__.pop(_ENABLED_ATTR, None)
    if enabled is not None:
        for module, _, _ in enabled.installs:
            restored += restore_forward(module)
        for module in enabled.fp8_modules:
            restore_stored_weight(module)
        if not drop_fp8_weights:
            return restored
    if drop_fp8_weights:
        for stale in model.__dict__.pop(_PLAN_ATTR, {}).values():
            for module in stale.fp8_modules:
                drop_fp8_cache(module)
    for module in model.modules():
        restored += restore_forward(module)
        restore_stored_weight(module)
        if drop_fp8_weights:
            drop_fp8_cache(module)
    return restored


def _fp8_verdicts(block: torch.nn.Module, skip_prefixes: tuple[str, ...], where: str = ""):
    """One line per Linear of a block that fp8_linear would reach: the seam's variant, or why it stays stock."""
    for unit, is_ffn in _fp8_units(block, skip_prefixes):
        for linear in ((unit[0], unit[2]) if is_ffn else (unit,)):
            verdict = eras.linear_match(linear)
            yield f"{type(linear).__name__}{where}: " + (
                f"{verdict.variant} (verified on ComfyUI {verdict.verified_on})" if verdict.matched
                else f"stock ({verdict.reason})")


def recognition(model: torch.nn.Module, ops=OP_FAMILIES) -> dict[str, str]:
    """{op family: what the overlays would run for it on this model, or why it stays stock}, one line each, without
    installing anything (the registry says these once, as the node runs)."""
    said: dict[str, set[str]] = {family: set() for family in ops}
    all_verified = True
    for block, spec, forward_verified in _recognised_blocks(model, []):
        all_verified = all_verified and forward_verified
        block_verdict = eras.block_match(block, spec.variant, spec.dependencies)
        for family in set(ops) - {"fp8_linear"}:
            said[family].add(f"{type(block).__name__}: "
                             + (f"{spec.variant} (verified on ComfyUI {block_verdict.verified_on})"
                                if forward_verified else f"stock ({block_verdict.reason})"))
        if "fp8_linear" in ops:
            said["fp8_linear"].update(_fp8_verdicts(block, spec.linear_skip))
    try:
        generic = _generic_fp8_blocks(model, frozenset({"fp8_linear"})) if "fp8_linear" in ops else []
    except UnsupportedModelError:
        generic = []
    for block in generic:
        said["fp8_linear"].update(_fp8_verdicts(
            block, modulation_prefixes(block),
            f" in {type(block).__name__} (blocks the other families do not know; modulation stays stock)"))
    if "norm_rope" in ops and not all_verified:       # as enable: blocks running their variant apply RoPE there
        namespace = seams.rope_module_globals(model)
        if namespace is not None:
            verdict = eras.seam_match(seams.ROPE_VARIANT, seams.rope_dependencies(namespace))
            off = state.all_variants()[seams.ROPE_VARIANT].switched_off() if verdict.matched else None
            said["norm_rope"].add(
                f"RoPE through comfy.quant_ops.ck: stock ({verdict.reason if not verdict.matched else off})"
                if off or not verdict.matched else
                f"RoPE through comfy.quant_ops.ck: {seams.ROPE_VARIANT} (verified on ComfyUI {verdict.verified_on})")
    return {family: "; ".join(sorted(lines)) or "no block of this model uses it" for family, lines in said.items()}


def model_fingerprints(model: torch.nn.Module) -> dict[str, dict[str, str | None]]:
    """{variant: {dependency key: sha256 or None}} of the code a model's recognised blocks, their Linear ops and the
    op seams they call run (the first of each block class; Linears of every block), e.g. to record a fixture era or
    report a real tree."""
    specs = BLOCK_SPECS
    prints: dict[str, dict[str, str | None]] = {}
    namespace = seams.rope_module_globals(model)
    if namespace is not None:
        prints[seams.ROPE_VARIANT] = {dep: eras.fingerprint_of(obj)[0]
                                      for dep, obj in seams.rope_dependencies(namespace).items()}
    seen: set[type] = set()
    for module in model.modules():
        spec = next((s for name, s in specs.items() if eras.class_named(module, name) is not None), None)
        if spec is None or type(module) in seen:
            continue
        seen.add(type(module))
        for dep, obj in spec.dependencies(module).items():
            prints.setdefault(spec.variant, {})[dep] = eras.fingerprint_of(obj)[0]
        for unit, is_ffn in _fp8_units(module, spec.linear_skip):
            for linear in ((unit[0], unit[2]) if is_ffn else (unit,)):
                linear_print = eras.fingerprint_of(type(linear).forward)[0]
                prints.setdefault(eras.LINEAR_VARIANT, {})[eras.LINEAR_FORWARD] = linear_print
    return prints


def add_verified_model(model: torch.nn.Module, label: str) -> dict[str, dict[str, str | None]]:
    """Accept the code `model` runs as one more verified era of each variant it uses all the code of (tests'
    fixtures); returns what was accepted."""
    known = state.all_variants()
    prints = {variant: found for variant, found in model_fingerprints(model).items()
              if variant in known and set(found) == set(known[variant].depends_on) and None not in found.values()}
    for variant, found in prints.items():
        state.add_verified(variant, label, found)
    eras.clear_caches()
    return prints
