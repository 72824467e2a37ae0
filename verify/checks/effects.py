"""effect:<patch id>: run each catalog patch's effect probe in the target's interpreter (verify/probes/)."""
from __future__ import annotations

from ..registry import CheckResult, Outcome, check
from .resolution import COMFY_IMPORT_PROBE

# Probes that import the target's nodes.py (and with it torch and all of comfy): seconds to minutes, and they need
# every requirement of ComfyUI in that interpreter, so they run only when the user asks with --real-import.
PROBES_IMPORTING_COMFYUI = frozenset({COMFY_IMPORT_PROBE, "pil_limit"})


def _patch_ids(ctx) -> list[str]:
    return [patch.id for patch in ctx.catalog]


@check("effect", "each catalog patch's effect probe, run in the target's interpreter against what the state "
       "says is applied", slow=True, each=_patch_ids)
def effect(ctx, patch_id: str) -> CheckResult:
    name = f"effect:{patch_id}"
    patch = ctx.patch(patch_id)
    target = ctx.target
    expect_applied = patch_id in ctx.applied
    numbers = {"probe": patch.effect_probe, "expect_applied": expect_applied}
    if not patch.effect_probe:
        return CheckResult(name, Outcome.SKIP, "patch.toml declares no effect_probe", numbers)
    unusable = ctx.no_interpreter()
    if unusable:
        return CheckResult(name, Outcome.SKIP, unusable, numbers)
    if patch.component == "torch" and (target.site_packages is None or target.torch_version is None):
        return CheckResult(name, Outcome.SKIP, "torch is not installed in the target's environment", numbers)
    if patch.component == "comfyui" and target.comfyui_root is None:
        return CheckResult(name, Outcome.SKIP, "the target has no ComfyUI", numbers)
    if patch.effect_probe in PROBES_IMPORTING_COMFYUI and not ctx.options.real_import:
        also = "; max-resolution checked nodes.py statically" if patch.effect_probe == COMFY_IMPORT_PROBE else ""
        return CheckResult(name, Outcome.SKIP, f"the {patch.effect_probe} probe imports the target's ComfyUI, "
                                               f"which is opt-in (--real-import){also}", numbers)
    result = ctx.run_probe(patch.effect_probe, ctx.probe_args(patch)).to_check(name)
    result.numbers = {**numbers, **result.numbers}
    return result
