"""ComfyUI custom node "FusedDiTOps": MODEL -> MODEL with the fused_dit overlays installed for sampling.

A thin call. The registry (fused_dit.registry) picks what each op family runs on the model it is given, or why the
family stays stock, and says so once per line (logger `fused_dit`, shown on ComfyUI's console); this module puts
that choice on a clone of the ModelPatcher, so the original MODEL, other branches of the graph and other models are
untouched:
- an APPLY_MODEL wrapper (the hook ComfyUI's own torch.compile helper uses) that installs the chosen families
  before each model call and restores the stock forwards in `finally`; none where every family stays stock;
- the attention family's `optimized_attention_override` in the clone's options;
- with FP8 holding its codes in the weights' place (fused_dit.families: `fp8_weights` no_extra_memory under
  ComfyUI's legacy ModelPatcher), one object patch per FP8 Linear, which ComfyUI restores when it unloads the clone;
- with FP8 on, an ON_CLEANUP callback that drops the FP8 copies of the weights when ComfyUI cleans the clone up.
The families and the fp8_weights policies, with their earlier names, are data in fused_dit/families.py.

The node module imports no torch (applier's node-pack tools read its inputs in a bare interpreter): the registry is
imported when the node first runs, and ComfyUI's own modules only where they exist (tests use fakes).
"""
from __future__ import annotations

import logging
import os
import sys


def _load_carried_fused_dit() -> None:
    """Installed the ComfyUI way (git URL, `comfy node install`: `applier overlay export` writes that folder), this
    folder carries the kernels package beside this file: load that copy as `fused_dit`, sys.path untouched. Installed
    by `applier overlay install`, fused_dit is in site-packages and the plain import finds it."""
    init = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fused_dit", "__init__.py")
    if "fused_dit" in sys.modules or not os.path.isfile(init):
        return
    import importlib.util
    spec = importlib.util.spec_from_file_location("fused_dit", init,
                                                  submodule_search_locations=[os.path.dirname(init)])
    sys.modules["fused_dit"] = module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["fused_dit"]
        raise


_load_carried_fused_dit()

from fused_dit import families  # noqa: E402  (found by the lines above where the folder carries it; no torch)

WRAPPER_KEY = "fused_dit"
log = logging.getLogger("fused_dit")
# the values of comfy.patcher_extension.WrappersMP.APPLY_MODEL and CallbacksMP.ON_CLEANUP, used when ComfyUI's
# module is not importable (tests); in ComfyUI the constants are read from the module itself
_APPLY_MODEL = "apply_model"
_ON_CLEANUP = "on_cleanup"


def _hook_names() -> tuple[str, str]:
    try:
        from comfy.patcher_extension import CallbacksMP, WrappersMP
    except ImportError:
        return _APPLY_MODEL, _ON_CLEANUP
    return WrappersMP.APPLY_MODEL, CallbacksMP.ON_CLEANUP


def _registry():
    """fused_dit.registry, imported when the node first runs (it imports torch; this module does not)."""
    from fused_dit import registry
    return registry


def make_apply_model_wrapper(ops: tuple[str, ...], keep_resident_codes: bool = False):
    """ComfyUI's APPLY_MODEL wrapper: `ops` installed on the diffusion model for each model call."""
    enabled = _registry().enabled

    def fused_dit_apply_model(executor, *args, **kwargs):
        x = args[0] if args else kwargs.get("x")
        with enabled(executor.class_obj.diffusion_model, ops, keep_resident_codes, getattr(x, "device", None)):
            return executor(*args, **kwargs)
    return fused_dit_apply_model


def _drop_fp8_weights(patcher) -> None:
    _registry().drop_fp8_weights(patcher.model.diffusion_model)


def apply(model, selection):
    """A clone of the ModelPatcher `model` carrying the registry's `selection` (see the module docstring); `model`
    itself where the selection runs nothing and `model` carries no wrapper of this node's (the MODEL as given:
    sampling is stock by construction, loading included)."""
    registry = _registry()
    apply_model, on_cleanup = _hook_names()
    runs_nothing = not (selection.wrap or selection.attention or selection.fp8_weights == families.CODES_IN_PLACE
                        or "fp8_linear" in selection.ops)
    if runs_nothing and not getattr(model, "wrappers", {}).get(apply_model, {}).get(WRAPPER_KEY):
        return model
    patched = model.clone()
    patched.remove_wrappers_with_key(apply_model, WRAPPER_KEY)
    if selection.wrap:
        patched.add_wrapper_with_key(apply_model, WRAPPER_KEY, make_apply_model_wrapper(
            selection.ops, keep_resident_codes=selection.keep_resident_codes))
    if selection.attention:
        registry.install_attention(patched.model_options, selection)
    if selection.fp8_weights == families.CODES_IN_PLACE:
        replaced = registry.put_codes_in_place(patched)
        log.info("fused_dit: %d Linears hold FP8 codes in place of their weights (%.1f GiB less)",
                 replaced.linears, replaced.bytes_saved / 2 ** 30)
    if "fp8_linear" in selection.ops and hasattr(patched, "add_callback_with_key"):
        patched.remove_callbacks_with_key(on_cleanup, WRAPPER_KEY)
        patched.add_callback_with_key(on_cleanup, WRAPPER_KEY, _drop_fp8_weights)
    return patched


def _toggle(name: str) -> tuple:
    family = families.FAMILIES[name]
    return ("BOOLEAN", {"default": family.node_default, "tooltip": family.tooltip})


class FusedDiTOps:
    CATEGORY = "advanced/model"
    RETURN_TYPES = ("MODEL",)
    FUNCTION = "patch"
    DESCRIPTION = ("Fused Triton kernels for Flux and Wan blocks: QK RMSNorm+RoPE, AdaLN, gated residual, and "
                   "optionally FP8 linear layers (sm_89+). Falls back to stock math where a kernel cannot run.")

    @classmethod
    def INPUT_TYPES(cls):
        # the earlier spellings stay in the list: ComfyUI refuses a saved workflow's value that is not in it
        weights = [*families.FP8_WEIGHT_POLICIES, *families.FP8_WEIGHT_ALIASES]
        return {"required": {"model": ("MODEL",), **{name: _toggle(name) for name in families.NODE_TOGGLES}},
                "optional": {"attention": _toggle("attention"),
                             "fp8_weights": (weights, {"default": families.NO_EXTRA_MEMORY,
                                                       "tooltip": families.FP8_WEIGHT_TOOLTIP}),
                             "attention_mode": (list(families.ATTENTION_MODES),
                                                {"default": families.EXACT,
                                                 "tooltip": families.ATTENTION_MODE_TOOLTIP})}}

    def patch(self, model, norm_rope=True, adaln=True, gate=True, fp8_linear=False,
              fp8_weights=families.NO_EXTRA_MEMORY, attention=families.FAMILIES["attention"].node_default,
              attention_mode=families.EXACT):
        registry = _registry()
        asked = {"norm_rope": norm_rope, "adaln": adaln, "gate": gate, "fp8_linear": fp8_linear,
                 "attention": attention}
        request = registry.Request(tuple(name for name, on in asked.items() if on), fp8_weights,
                                   attention_mode=attention_mode)
        return (apply(model, registry.choose(model, request)),)


from .tiled_sampling import TiledSampling  # noqa: E402  (the second node; it finds fused_dit as this one does)

NODE_CLASS_MAPPINGS = {"FusedDiTOps": FusedDiTOps, "TiledSampling": TiledSampling}
NODE_DISPLAY_NAME_MAPPINGS = {"FusedDiTOps": "Fused DiT Ops (Triton)", "TiledSampling": "Tiled Sampling"}
