"""ComfyUI custom node "FusedDiTOps": MODEL -> MODEL with the fused_dit overlays installed for sampling.

A thin call, cheap at the node's run: the registry (fused_dit.registry) decides from cheap facts (the request, the
loaded ComfyUI's SDPA order, the ModelPatcher's load device, VRAM mode and options, the diffusion model's class) what
may run, and this module puts that decision on a clone of the ModelPatcher, so the original MODEL, other branches of
the graph and other models are untouched. What needs the model's blocks waits for its first use (`FirstCall`, once
per model): the registry settles each family on the blocks and says so in one line per model (logger `fused_dit`,
shown on ComfyUI's console; the long reasons at DEBUG). On the clone:
- an APPLY_MODEL wrapper (the hook ComfyUI's own torch.compile helper uses) that, from the first call on, installs
  the families that run before each model call and restores the stock forwards in `finally`; none where nothing
  may run (the MODEL as given comes back where neither that nor the attention override applies);
- the attention family's `optimized_attention_override` in the clone's options;
- with FP8 holding its codes in the weights' place (fused_dit.families: `fp8_weights` no_extra_memory under
  ComfyUI's legacy ModelPatcher), a PREPARE_SAMPLING wrapper that, at the first sampling and before ComfyUI loads
  the weights, adds one object patch per FP8 Linear, which ComfyUI restores when it unloads the clone;
- with FP8 asked for, an ON_CLEANUP callback that drops the FP8 copies of the weights when ComfyUI cleans the clone up.
The families and the fp8_weights policies, with their earlier names, are data in fused_dit/families.py.

The node module imports no torch (applier's node-pack tools read its inputs in a bare interpreter): the registry is
imported when the node first runs, and ComfyUI's own modules only where they exist (tests use fakes). Its toggles
default off where their family cannot run on the ComfyUI loaded in the process (`runs_here`: the loaded modules'
code and SDPA order, read without torch), and keep their defaults where none is loaded.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import weakref


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

# found by the lines above where the folder carries it; none of these imports torch
from fused_dit import families, fingerprint, state, variants  # noqa: E402

WRAPPER_KEY = "fused_dit"
log = logging.getLogger("fused_dit")
# the values of comfy.patcher_extension's WrappersMP.APPLY_MODEL, WrappersMP.PREPARE_SAMPLING and
# CallbacksMP.ON_CLEANUP, used when ComfyUI's module is not importable (tests); in ComfyUI they are read from it
_APPLY_MODEL = "apply_model"
_PREPARE_SAMPLING = "prepare_sampling"
_ON_CLEANUP = "on_cleanup"
FAILED_LINE = "Fused DiT Ops on %s: stock, the node's setup at the model's first use failed (%s: %s)"


def _hook_names() -> tuple[str, str, str]:
    try:
        from comfy.patcher_extension import CallbacksMP, WrappersMP
    except ImportError:
        return _APPLY_MODEL, _PREPARE_SAMPLING, _ON_CLEANUP
    return WrappersMP.APPLY_MODEL, WrappersMP.PREPARE_SAMPLING, CallbacksMP.ON_CLEANUP


def _registry():
    """fused_dit.registry, imported when the node first runs (it imports torch; this module does not)."""
    from fused_dit import registry
    return registry


class FirstCall:
    """The node's hooks on its clone, for one patch-time decision (registry.Decision). What reads the model's
    blocks is done once per diffusion model, at its first use, and kept: `settle` (recognising and fingerprinting
    the blocks, the install plan, the one line for the model) and, with FP8 codes in the weights' place, their
    object patches. Under a lock: ComfyUI's executor may run two prompts' samplers on threads. Any exception of
    that work leaves the model stock, said once; the model call's own exceptions are its own.
    - prepare_sampling (ComfyUI's PREPARE_SAMPLING wrapper, before the sampler loads the model): the codes must be
      object patches before ComfyUI loads the weights, as ComfyUI applies those at load;
    - apply_model (the APPLY_MODEL wrapper, the hook ComfyUI's own torch.compile helper uses): the chosen families
      installed around each model call, the stock forwards back in `finally`. The first-use work is host work done
      here, before the model's forward: never inside the model compiler's record or a CUDA graph capture, which
      open within the forward (integration/model_compiler.py)."""

    def __init__(self, decision):
        self.decision = decision
        self._lock = threading.Lock()
        self._selections: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # model -> Selection or None

    def selection(self, diffusion_model):
        """The registry's selection for `diffusion_model`, settled at its first use; None: stock after a failure."""
        with self._lock:
            if diffusion_model not in self._selections:
                self._selections[diffusion_model] = self._guarded(diffusion_model, _registry().settle,
                                                                  self.decision, diffusion_model)
            return self._selections[diffusion_model]

    def _guarded(self, diffusion_model, work, *args):
        try:
            return work(*args)
        except Exception as error:      # never into the user's prompt: this model stays stock
            state.say_once(FAILED_LINE, self.decision.model_name, type(error).__name__, str(error),
                           level=logging.WARNING)
            self._selections[diffusion_model] = None
            return None

    def prepare_sampling(self, executor, patcher, *args, **kwargs):
        diffusion_model = patcher.model.diffusion_model
        selection = self.selection(diffusion_model)
        if selection is not None and selection.fp8_weights == families.CODES_IN_PLACE:
            with self._lock:
                replaced = self._guarded(diffusion_model, _registry().put_codes_in_place, patcher)
            if replaced is not None and replaced.linears:
                log.info("fused_dit: %d Linears hold FP8 codes in place of their weights (%.1f GiB less)",
                         replaced.linears, replaced.bytes_saved / 2 ** 30)
        return executor(patcher, *args, **kwargs)

    def apply_model(self, executor, *args, **kwargs):
        selection = self.selection(executor.class_obj.diffusion_model)
        if selection is None or not selection.wrap:
            return executor(*args, **kwargs)
        x = args[0] if args else kwargs.get("x")
        with _registry().enabled(executor.class_obj.diffusion_model, selection.ops, selection.keep_resident_codes,
                                 getattr(x, "device", None)):
            return executor(*args, **kwargs)


def _drop_fp8_weights(patcher) -> None:
    _registry().drop_fp8_weights(patcher.model.diffusion_model)


def apply(model, decision):
    """A clone of the ModelPatcher `model` carrying the registry's patch-time `decision` (see the module
    docstring); `model` itself where nothing may run and `model` carries no hook of this node's (the MODEL as given:
    sampling is stock by construction, loading included)."""
    apply_model, prepare_sampling, on_cleanup = _hook_names()
    ours = [getattr(model, "wrappers", {}).get(name, {}).get(WRAPPER_KEY) for name in (apply_model, prepare_sampling)]
    if not (decision.may_run or decision.attention) and not any(ours):
        return model
    patched = model.clone()
    for name in (apply_model, prepare_sampling):
        patched.remove_wrappers_with_key(name, WRAPPER_KEY)
    if decision.may_run:
        first = FirstCall(decision)
        patched.add_wrapper_with_key(apply_model, WRAPPER_KEY, first.apply_model)
        if decision.fp8_weights == families.CODES_IN_PLACE:
            patched.add_wrapper_with_key(prepare_sampling, WRAPPER_KEY, first.prepare_sampling)
    if decision.attention:
        _registry().install_attention(patched.model_options, decision)
    if "fp8_linear" in decision.may_run and hasattr(patched, "add_callback_with_key"):
        patched.remove_callbacks_with_key(on_cleanup, WRAPPER_KEY)
        patched.add_callback_with_key(on_cleanup, WRAPPER_KEY, _drop_fp8_weights)
    return patched


BLOCKS_KEY = "{blocks}:"                 # variants.json's key prefix for code in the module of the model's blocks
_LOADED_VERDICTS: dict = {}             # (variant, verdict epoch, ids of the objects fingerprinted) -> bool


def _block_forward_here(spec) -> bool | None:
    """Whether a block-forward variant's code is in the loaded ComfyUI: True where a comfy.ldm module defines its
    blocks with code one verified release has, False where its blocks are loaded and none has it, None where none
    is loaded. The live objects of the module, fingerprinted as eras.py does for a model's blocks (no torch)."""
    keys = [key for key in spec.depends_on if key.startswith(BLOCKS_KEY)]
    block_class = keys[0][len(BLOCKS_KEY):].split(".")[0]
    verdicts = []
    for name, module in list(sys.modules.items()):
        if not name.startswith("comfy.ldm.") or not isinstance(getattr(module, block_class, None), type):
            continue
        objects = {}
        for key in keys:
            path = key[len(BLOCKS_KEY):].split(".")
            if not hasattr(module, path[0]):
                continue                # not in this module: not compared (as a model without single blocks)
            obj = module
            for part in path:
                obj = getattr(obj, part, None)
            objects[key] = obj
        cache_key = (spec.name, state.STATE.verdict_epoch, tuple((k, id(v)) for k, v in objects.items()))
        if cache_key not in _LOADED_VERDICTS:
            found = {}
            for key, obj in objects.items():
                try:
                    found[key] = fingerprint.of_object(obj) if callable(obj) else None
                except (OSError, TypeError, ValueError, SyntaxError):
                    found[key] = None
            _LOADED_VERDICTS[cache_key] = variants.match(spec, found).matched
        verdicts.append(_LOADED_VERDICTS[cache_key])
    return any(verdicts) if verdicts else None


def _sdpa_order_here(implementation) -> bool | None:
    """Whether the loaded release's SDPA order leaves the attention override a gain (attention.release_order and
    registry.order_refusal read the same list, with torch); None where no ComfyUI is loaded."""
    ops = sys.modules.get("comfy.ops")
    if ops is None:
        return None
    order = getattr(ops, "SDPA_BACKEND_PRIORITY", None)
    if not isinstance(order, list) or not order:
        return False                    # no CUDA, or a release before the list: nothing to reorder
    return getattr(order[0], "name", str(order[0])) in implementation.needs.gains_after


def runs_here(name: str) -> bool | None:
    """Whether family `name` can run on the ComfyUI loaded in this process, decided cheaply and without torch for
    the node's default toggles: False where it cannot (every implementation refused: a block forward whose code
    this ComfyUI does not have, an op seam off by default, an SDPA order the override gains nothing on), True or
    None (not known: no ComfyUI loaded, or code only the registry checks) where it may. The registry still decides
    at each run, on the model it is given."""
    family = families.FAMILIES[name]
    implementations = ((families.ATTENTION_MODE_IMPLEMENTATIONS[families.EXACT],) if name == "attention"
                       else family.implementations)
    verdicts = []
    for implementation in implementations:
        spec = state.all_variants().get(implementation.needs.verified_code or "")
        if implementation.needs.gains_after:
            verdicts.append(_sdpa_order_here(implementation))
        elif spec is not None and spec.switched_off():
            verdicts.append(False)
        elif spec is not None and implementation.kind == families.BLOCK_FORWARD:
            verdicts.append(_block_forward_here(spec))
        else:
            verdicts.append(None)
    if any(verdicts):
        return True
    return False if verdicts and all(v is False for v in verdicts) else None


def _toggle(name: str) -> tuple:
    """A family's toggle: on by default where the family is, unless it cannot run on the loaded ComfyUI."""
    family = families.FAMILIES[name]
    default = family.node_default and runs_here(name) is not False
    return ("BOOLEAN", {"default": default, "tooltip": family.tooltip})


class FusedDiTOps:
    CATEGORY = "advanced/model"
    RETURN_TYPES = ("MODEL",)
    FUNCTION = "patch"
    DESCRIPTION = ("Speeds up sampling where it can on this ComfyUI and says what runs in one console line per "
                   "model. Attention: ComfyUI's own, with the fastest exact SDPA backend for each shape, on releases "
                   "whose SDPA order puts FLASH first (0.29+ on Linux). Fused Triton kernels for Flux and Wan blocks "
                   "(QK RMSNorm+RoPE, AdaLN, gated residual): only on the block code they were written for (ComfyUI "
                   "0.3.64); later releases fuse these themselves. Optional, lossy, sm_89+: FP8 Linears and FP8 "
                   "attention. Everything else stays ComfyUI's own code.")

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
        decision = registry.decide(model, request)
        if not decision.may_run:
            registry.settle(decision)   # nothing waits for a first call: the model's line is said now
        return (apply(model, decision),)


# the route's other nodes; they find fused_dit as this one does
from .save_png import SaveImagePNG  # noqa: E402
from .tiled_sampling import TiledSampling  # noqa: E402
from .tiled_vae import TiledVAEDecode, TiledVAEEncode  # noqa: E402

NODE_CLASS_MAPPINGS = {"FusedDiTOps": FusedDiTOps, "TiledSampling": TiledSampling, "TiledVAEDecode": TiledVAEDecode,
                       "TiledVAEEncode": TiledVAEEncode, "SaveImagePNG": SaveImagePNG}
NODE_DISPLAY_NAME_MAPPINGS = {"FusedDiTOps": "Fused DiT Ops (Triton)", "TiledSampling": "Tiled Sampling",
                              "TiledVAEDecode": "VAE Decode (Tiled, one pass)",
                              "TiledVAEEncode": "VAE Encode (Tiled, one pass)",
                              "SaveImagePNG": "Save Image (PNG on every core)"}
