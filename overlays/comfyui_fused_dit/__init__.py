"""ComfyUI custom node "FusedDiTOps": MODEL -> MODEL with the fused_dit overlays installed for sampling.

The node clones the ModelPatcher and adds an APPLY_MODEL wrapper (the hook ComfyUI's own torch.compile helper
uses) that swaps the overlay forwards into the diffusion model before each model call and restores the stock
forwards in `finally`, so the original MODEL output, other branches of the graph and other models are untouched.
With FP8 on, `fp8_weights` says where the bf16 weights stay: "replace" (the default) swaps each FP8 Linear for
FP8 codes through ComfyUI's object patches on the clone (fused_dit.integration.fp8_codes: 1 byte per parameter on
the GPU instead of 2, restored by ComfyUI when it unloads the clone); "alongside" keeps the bf16 weights and
caches the codes beside them (exact bf16 for any call FP8 declines, 1 byte per parameter more); under DynamicVRAM,
where nothing is swapped, "alongside" keeps the codes of the weights comfy-aimdo holds resident between calls
instead of quantising them per call. The cached codes persist between steps and are dropped by an ON_CLEANUP
callback when ComfyUI cleans the patcher up. Where every family asked for stays stock on the loaded model, no
wrapper is added at all. The block families know ComfyUI's Flux (comfy.ldm.flux.model.Flux) and Wan
(comfy.ldm.wan.model.WanModel); on any other model they stay stock and the node says why once (never an error inside a
prompt). FP8 goes through ComfyUI's Linear ops, so on other models (Qwen-Image, ...) it takes the Linears of their
transformer blocks, modulation aside; the attention family, ComfyUI's attention seam, applies to every model. Each op
family runs only the variant verified for the code the loaded model runs (fused_dit.variants); the node says once,
per family, which variant runs or why it stays stock (logger `fused_dit`, shown on ComfyUI's console). The `attention` toggle (off by default) sets the clone's
`optimized_attention_override` to the fastest exact SDPA backend per shape (fused_dit.integration.attention).

ComfyUI is imported lazily inside the node so the package imports without it (tests use fakes).
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

WRAPPER_KEY = "fused_dit"
# what FP8 on a model the block families do not know was measured to give (said once where it runs)
GENERIC_FP8_MEASURED = ("fp8_linear on a model the block families do not know was measured on Qwen-Image 1024 only "
                        "(H200, ComfyUI 0.33.0, benchmarks/results/generation-0.33.0.json): with "
                        "--disable-dynamic-vram 0.92x the time at 12.7 GiB less (25.7 against 38.4), under "
                        "DynamicVRAM slower still; its text stream's 115-row Linears cost more than FP8 saves. "
                        "Turn it on there for memory, not speed")
FP8_WEIGHTS = ("replace", "alongside")
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


def make_apply_model_wrapper(ops: tuple[str, ...], keep_resident_codes: bool = False):
    """keep_resident_codes: fp8_weights "alongside" under DynamicVRAM keeps the FP8 codes of weights comfy-aimdo
    holds resident between calls (fused_dit.integration.fp8_weights)."""
    import fused_dit
    from fused_dit.integration.fp8_weights import keep_resident_codes as keeping

    def fused_dit_apply_model(executor, *args, **kwargs):
        diffusion_model = executor.class_obj.diffusion_model
        fused_dit.enable(diffusion_model, ops=ops)
        try:
            with keeping(keep_resident_codes):
                return executor(*args, **kwargs)
        finally:
            fused_dit.disable(diffusion_model)
    return fused_dit_apply_model


def say_once(line: str) -> None:
    """One line of what the node runs or leaves stock, on ComfyUI's console (the root logger prints INFO there)
    the first time it is true in this process."""
    from fused_dit import state
    state.say_once("Fused DiT Ops: %s", line)


def _drop_fp8_weights(patcher) -> None:
    import fused_dit
    fused_dit.disable(patcher.model.diffusion_model, drop_fp8_weights=True)


class FusedDiTOps:
    CATEGORY = "advanced/model"
    RETURN_TYPES = ("MODEL",)
    FUNCTION = "patch"
    DESCRIPTION = ("Fused Triton kernels for Flux and Wan blocks: QK RMSNorm+RoPE, AdaLN, gated residual, and "
                   "optionally FP8 linear layers (sm_89+). Falls back to stock math where a kernel cannot run.")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "model": ("MODEL",),
            "norm_rope": ("BOOLEAN", {"default": True, "tooltip": "fused QK RMSNorm + RoPE"}),
            "adaln": ("BOOLEAN", {"default": True, "tooltip": "fused LayerNorm + shift/scale modulation"}),
            "gate": ("BOOLEAN", {"default": True, "tooltip": "fused gated residual add"}),
            "fp8_linear": ("BOOLEAN", {"default": False,
                                       "tooltip": "FP8 GEMMs for the blocks' Linear layers (sm_89+; lossy)"}),
        }, "optional": {
            "attention": ("BOOLEAN", {
                "default": False,
                "tooltip": "run ComfyUI's own attention with the fastest exact SDPA backend for each shape "
                           "(measured once per shape on the GPU; off: stock)"}),
            "fp8_weights": (list(FP8_WEIGHTS), {
                "default": "replace",
                "tooltip": "with fp8_linear: 'replace' keeps only FP8 codes of those Linears on the GPU (half "
                           "their memory); 'alongside' keeps the bf16 weights too (exact bf16 where FP8 declines; under "
                           "DynamicVRAM it keeps the codes of resident weights between calls, 1 byte per "
                           "parameter more)"}),
        }}

    def patch(self, model, norm_rope=True, adaln=True, gate=True, fp8_linear=False, fp8_weights="replace",
              attention=False):
        import fused_dit
        from fused_dit.integration import (GENERIC_MIN_BLOCKS, UnsupportedModelError, generic_blocks, is_active,
                                           recognition, supported_blocks)

        if fp8_weights not in FP8_WEIGHTS:
            raise ValueError(f"fp8_weights={fp8_weights!r}; expected one of {', '.join(FP8_WEIGHTS)}")
        flags = {"norm_rope": norm_rope, "adaln": adaln, "gate": gate, "fp8_linear": fp8_linear}
        ops = tuple(name for name in fused_dit.OP_FAMILIES if flags[name])
        diffusion_model = model.model.diffusion_model
        try:
            supported_blocks(diffusion_model)
        except UnsupportedModelError as unknown:
            # a model whose blocks the overlays do not know (Qwen-Image, Lumina, SD3, ...) runs stock in the block
            # families, said once; FP8 takes the Linear seam in its transformer stacks' blocks where it has some
            # (integration.generic_blocks), and the attention family, ComfyUI's attention seam, fits any model
            block_families = tuple(name for name in ops if name != "fp8_linear")
            if block_families:
                say_once(f"{', '.join(block_families)}: stock ({unknown})")
            generic = "fp8_linear" in ops and bool(generic_blocks(diffusion_model))
            if generic:
                say_once(GENERIC_FP8_MEASURED)
            if "fp8_linear" in ops and not generic:
                say_once(f"fp8_linear: stock ({unknown}, and no stack of {GENERIC_MIN_BLOCKS} or more blocks of "
                         f"one class)")
            ops = ("fp8_linear",) if generic else ()
        fp8_linear = "fp8_linear" in ops
        for family, line in recognition(diffusion_model, ops).items():
            say_once(f"{family}: {line}")
        apply_model, on_cleanup = _hook_names()
        patched = model.clone()
        patched.remove_wrappers_with_key(apply_model, WRAPPER_KEY)
        if ops and is_active(diffusion_model, ops):
            patched.add_wrapper_with_key(apply_model, WRAPPER_KEY, make_apply_model_wrapper(
                ops, keep_resident_codes=fp8_linear and fp8_weights == "alongside"))
        elif ops:
            # a wrapper that installs nothing still costs a call per step: the model runs as ComfyUI's own
            say_once(f"{', '.join(ops)}: every one stays stock on {type(diffusion_model).__name__} (above), so the "
                     f"node adds no wrapper to its model calls")
        if attention:
            from fused_dit.integration import attention as attention_family
            say_once(f"attention: {attention_family.install(patched.model_options)}")
        if fp8_linear and fp8_weights == "replace":
            from fused_dit.integration import fp8_linear_modules
            from fused_dit.integration.fp8_codes import add_object_patches
            replaced = add_object_patches(patched, fp8_linear_modules(model.model.diffusion_model))
            if replaced.reason:
                say_once(f"fp8_weights=replace left the bf16 weights ({replaced.reason})")
            else:
                log.info("fused_dit: %d Linears hold FP8 codes in place of their weights (%.1f GiB less)",
                         replaced.linears, replaced.bytes_saved / 2 ** 30)
        if fp8_linear and hasattr(patched, "add_callback_with_key"):
            patched.remove_callbacks_with_key(on_cleanup, WRAPPER_KEY)
            patched.add_callback_with_key(on_cleanup, WRAPPER_KEY, _drop_fp8_weights)
        return (patched,)


NODE_CLASS_MAPPINGS = {"FusedDiTOps": FusedDiTOps}
NODE_DISPLAY_NAME_MAPPINGS = {"FusedDiTOps": "Fused DiT Ops (Triton)"}
