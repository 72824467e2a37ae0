"""The op families of the pack, as data: what each implementation needs and how the FP8 family holds weights.

Read by the registry (registry.py), which picks one implementation per family for a loaded model, and by the
ComfyUI node for its inputs. Torch-free, like variants.py: the node's inputs are read without torch by applier's
node-pack tools.

In the spirit of comfy-kitchen's backend registry (constraints declared as data beside each backend, the first
capable one wins, the reasons the others were refused collected), one level up: an implementation here is a way
into ComfyUI (a block forward written for one release, an op replaced where ComfyUI calls it, ComfyUI's attention
override), and what it needs is
- `verified_code`: the variant in variants.json whose fingerprints the running ComfyUI code must have (the releases
  it was verified on; integration/eras.py compares the loaded objects, `applier overlay check` the files);
- `min_capability` and `dtypes`: the GPUs and activation dtypes its kernels take (below them an op runs its eager
  reference, and dispatch.py says why per op);
- `vram_modes`: the ModelPatchers it serves (LEGACY: ComfyUI loads the weights; DYNAMIC: ComfyUI's DynamicVRAM);
- `capture_safe`: whether ComfyUI's model compiler may capture a block running it in a CUDA graph (no measurement,
  host sync or allocation that differs from one call to the next).
- `gains_after`: for the attention override, the SDPA backends which, first in the release's own order, leave it
  a gain (`faster` and `no_gain` cite where that was measured); on another order it stays stock, toggle on or off.
Stock, ComfyUI's own code, is always there. The 0.3.64 block forwards are kept as the legacy entries they are
(`legacy`): written after that release's blocks, they run where its code does and nowhere else.

The FP8 family also holds the weights of its Linears one way or another. The node's `fp8_weights` input names a
policy (FP8_WEIGHT_POLICIES); the registry carries it out with the mechanism (FP8_WEIGHTS) that fits the loaded
model's VRAM mode. The names before issue 29, "replace" and "alongside", stay accepted (FP8_WEIGHT_ALIASES), so saved
workflows keep working.

A message that needs a measured figure cites where it is (`Evidence`: a file of the repository's
benchmarks/results/ and a key in it) instead of carrying it.
"""
from __future__ import annotations

from dataclasses import dataclass

LEGACY = "legacy"        # comfy.model_patcher.ModelPatcher: ComfyUI loads the weights (all, or part in low VRAM)
DYNAMIC = "dynamic"      # ModelPatcherDynamic (DynamicVRAM, comfy-aimdo): weights streamed to the GPU per call
SCRIPT = "script"        # fused_dit.enable from a script, no ModelPatcher
VRAM_MODES = (LEGACY, DYNAMIC)
BLOCK_FORWARD, OP_SEAM, OVERRIDE = "block_forward", "op_seam", "attention_override"
KERNEL_DTYPES = ("float32", "float16", "bfloat16")          # the element-wise kernels (ops.KERNEL_DTYPES)
FP8_ACTIVATION_DTYPES = ("bfloat16", "float16")             # ops.fp8_linear.SUPPORTED_ACTIVATION_DTYPES
FP8_MIN_CAPABILITY = (8, 9)                                  # ops.quantize_fp8.FP8_MIN_CAPABILITY


@dataclass(frozen=True)
class Evidence:
    """Where the figures behind a message are: a file under the repository's benchmarks/results/ (not shipped with
    the pack) and a key in it (`name`, `a.b`, or `runs[field=value|value, ...]`: the runs whose fields match)."""
    file: str
    key: str

    def cite(self) -> str:
        return f"see benchmarks/results/{self.file}: {self.key}"


@dataclass(frozen=True)
class Needs:
    """What an implementation needs to run."""
    verified_code: str | None            # variant name in variants.json (None: no ComfyUI code of its own to match)
    min_capability: tuple[int, int] | None
    dtypes: tuple[str, ...]              # activation dtypes its kernels take; () any
    vram_modes: tuple[str, ...]
    capture_safe: bool
    capture_note: str                    # why it is, or is not, safe to capture in a CUDA graph
    # the SDPA backends which, first in the release's order (comfy.ops.SDPA_BACKEND_PRIORITY), leave it a gain;
    # () where the release's SDPA order does not matter to it
    gains_after: tuple[str, ...] = ()


@dataclass(frozen=True)
class Implementation:
    name: str
    kind: str                            # BLOCK_FORWARD | OP_SEAM | OVERRIDE
    module: str                          # where it is implemented, under fused_dit/
    needs: Needs
    legacy: bool = False
    faster: Evidence | None = None       # where it was measured faster than stock (needs.gains_after)
    no_gain: Evidence | None = None      # where it was measured no faster (the other SDPA orders)


@dataclass(frozen=True)
class Family:
    name: str
    tooltip: str                         # the node's toggle
    node_default: bool
    implementations: tuple[Implementation, ...]     # in order of preference; stock after the last
    words: str = ""                      # what it changes, in ComfyUI's and PyTorch's words (overlay check, the log)


_ELEMENTWISE_CAPTURE = ("Triton kernels into outputs allocated alike on every call; the backend choice reads only "
                        "the environment and the device's capability")
FLUX_BLOCK_FORWARD = Implementation(
    "flux_block_forward_0.3", BLOCK_FORWARD, "integration/flux.py",
    Needs("flux_block_forward_0.3", None, KERNEL_DTYPES, VRAM_MODES, True, _ELEMENTWISE_CAPTURE), legacy=True)
WAN_BLOCK_FORWARD = Implementation(
    "wan_block_forward_0.3", BLOCK_FORWARD, "integration/wan.py",
    Needs("wan_block_forward_0.3", None, KERNEL_DTYPES, VRAM_MODES, True, _ELEMENTWISE_CAPTURE), legacy=True)
ROPE_SEAM = Implementation(
    "rope_ck_seam", OP_SEAM, "integration/seams.py",
    Needs("rope_ck_seam", None, KERNEL_DTYPES, VRAM_MODES, True, _ELEMENTWISE_CAPTURE))
LINEAR_FP8_SEAM = Implementation(
    "linear_fp8_seam", OP_SEAM, "integration/fp8_modules.py",
    Needs("linear_fp8_seam", FP8_MIN_CAPABILITY, FP8_ACTIVATION_DTYPES, VRAM_MODES, False,
          "alike under the compiler's malloc graph (a weight's codes and the stream's buffers are made outside its "
          "record), but replayed from a CUDA graph under DynamicVRAM its output moved from the eager one ("
          + Evidence("compiler-0.38.1.json", "runs[model=flux-dev, mode=cuda_graph]").cite() + ")"))
FLASH_FIRST = ("FLASH_ATTENTION",)      # the SDPA order of ComfyUI 0.29+ on Linux (cuDNN first before it)
FASTEST_SDPA = Implementation(
    "fastest_sdpa", OVERRIDE, "integration/attention.py",
    Needs(None, None, (), VRAM_MODES, True,
          "a shape's first (eager) call times the backends outside the compiler's recorded allocations (a shape "
          "first seen inside a capture runs the release's order, unmeasured), after which the choice reads shapes, "
          "dtypes and devices alone",
          gains_after=FLASH_FIRST),
    faster=Evidence("generation-0.33.0.json",
                    "runs[model=flux-dev|wan2.1-t2v-14b, config=stock|overlay_attention|node_defaults]"),
    no_gain=Evidence("generation-0.3.64.json", "runs[model=flux-dev|wan2.1-t2v-14b, config=stock|overlay_attention]"))

FP8_ATTENTION = Implementation(
    "fp8_attention", OVERRIDE, "integration/attention_fp8.py",
    Needs(None, FP8_MIN_CAPABILITY, FP8_ACTIVATION_DTYPES, VRAM_MODES, True,
          "scales derived on the GPU (no host sync), allocations alike on every call of a shape; a shape's first "
          "(eager) call times the kernel against exact outside the compiler's recorded allocations (a shape first "
          "seen inside a capture runs exact, unmeasured), after which the choice reads shapes, dtypes and devices "
          "alone"),
    faster=Evidence("attention-kernels-h200.json", "shapes.*.speed"))

FAMILIES: dict[str, Family] = {family.name: family for family in (
    Family("norm_rope", "fused QK RMSNorm + RoPE", True, (FLUX_BLOCK_FORWARD, WAN_BLOCK_FORWARD, ROPE_SEAM),
           "fused QK RMSNorm + RoPE"),
    Family("adaln", "fused LayerNorm + shift/scale modulation", True, (FLUX_BLOCK_FORWARD, WAN_BLOCK_FORWARD),
           "fused LayerNorm + modulation"),
    Family("gate", "fused gated residual add", True, (FLUX_BLOCK_FORWARD, WAN_BLOCK_FORWARD),
           "fused gated residual add"),
    Family("fp8_linear", "FP8 GEMMs for the blocks' Linear layers (sm_89+; lossy)", False, (LINEAR_FP8_SEAM,),
           "FP8 Linears"),
    Family("attention", "run ComfyUI's own attention with the fastest exact SDPA backend for each shape (measured "
                        "once per shape on the GPU), where the release's SDPA order puts FLASH first (0.29+ on "
                        "Linux); stock on an order that puts cuDNN first, and when off", True,
           (FASTEST_SDPA, FP8_ATTENTION), "attention"),
)}
# the attention family's modes: `exact` runs FASTEST_SDPA (where the release's order leaves it a gain), `fp8` runs
# FP8_ATTENTION, opt-in (lossy), with the exact mode for the calls its kernel refuses
EXACT, FP8 = "exact", "fp8"
ATTENTION_MODES = (EXACT, FP8)
ATTENTION_MODE_IMPLEMENTATIONS = {EXACT: FASTEST_SDPA, FP8: FP8_ATTENTION}
ATTENTION_MODE_TOOLTIP = (
    "with attention on: 'exact' runs the fastest exact SDPA backend per shape; 'fp8' (sm_89+, lossy) runs attention "
    "with 8-bit Q K^T (INT8, as SageAttention) and fp32 accumulation where that is faster than exact for the shape "
    "(timed on its first call), and the exact mode elsewhere and wherever it cannot (a mask, another head dim or "
    "dtype, an older GPU), saying why once")
NODE_TOGGLES = ("norm_rope", "adaln", "gate", "fp8_linear")      # required inputs; attention is optional


# ------------------------------------------------------------------------------------------------ FP8 weights
@dataclass(frozen=True)
class WeightMechanism:
    """How the FP8 family holds the weights of the Linears it runs, for one policy in one setting."""
    name: str
    policy: str
    where: str               # LEGACY or DYNAMIC (the node's ModelPatcher), or SCRIPT (fused_dit.enable)
    does: str
    brief: str = ""          # in a few words, for the node's one line per model


NO_EXTRA_MEMORY = "no_extra_memory"
CODES_BESIDE_WEIGHTS = "codes_beside_weights"
FP8_WEIGHT_POLICIES = (NO_EXTRA_MEMORY, CODES_BESIDE_WEIGHTS)
FP8_WEIGHT_ALIASES = {"replace": NO_EXTRA_MEMORY, "alongside": CODES_BESIDE_WEIGHTS}
FP8_WEIGHT_TOOLTIP = (
    f"with fp8_linear: '{NO_EXTRA_MEMORY}' never holds more weight memory on the GPU than stock (FP8 codes in the "
    f"weights' place, or under DynamicVRAM codes made per call); '{CODES_BESIDE_WEIGHTS}' keeps FP8 codes beside the "
    f"bf16 weights, 1 byte per parameter more (exact bf16 where FP8 declines; under DynamicVRAM the codes of resident "
    f"weights kept between calls). 'replace' and 'alongside' are their earlier names")
CODES_IN_PLACE, PER_CALL_CODES, WEIGHTS_IN_HOST_MEMORY = "codes_in_place", "per_call_codes", "weights_in_host_memory"
CACHED_CODES, RESIDENT_CODES = "cached_codes", "resident_codes"
FP8_WEIGHTS: dict[str, WeightMechanism] = {m.name: m for m in (
    WeightMechanism(CODES_IN_PLACE, NO_EXTRA_MEMORY, LEGACY,
                    "each FP8 Linear becomes FP8 codes in its weight's place through ComfyUI's object patches, 1 "
                    "byte per parameter on the GPU instead of 2", "codes in the weights' place"),
    WeightMechanism(PER_CALL_CODES, NO_EXTRA_MEMORY, DYNAMIC,
                    "each weight ComfyUI's cast hands a Linear is quantised for that call and dropped after it",
                    "codes made per call"),
    WeightMechanism(WEIGHTS_IN_HOST_MEMORY, NO_EXTRA_MEMORY, SCRIPT,
                    "the bf16 weights wait in host memory from enable to disable; only their codes stay on the GPU",
                    "bf16 weights in host memory"),
    WeightMechanism(CACHED_CODES, CODES_BESIDE_WEIGHTS, LEGACY,
                    "codes quantised once and kept beside the bf16 weights, 1 byte per parameter more; exact bf16 "
                    "for any call FP8 declines", "codes kept beside the weights"),
    WeightMechanism(RESIDENT_CODES, CODES_BESIDE_WEIGHTS, DYNAMIC,
                    "the codes of the weights comfy-aimdo keeps resident are kept between calls, 1 byte per "
                    "parameter more", "codes of resident weights kept"),
)}
PER_CALL_EVIDENCE = Evidence("generation-0.33.0.json", "runs[model=flux-dev, "
                             "config=overlay_fp8|overlay_fp8_alongside|overlay_all_fp8|overlay_all_fp8_alongside]")
GENERIC_FP8_EVIDENCE = Evidence("generation-0.33.0.json",
                                "runs[model=qwen-image|z-image, config=stock|overlay_all|overlay_all_fp8|"
                                "overlay_all_fp8_attn]")


def fp8_weight_policy(value: str) -> str:
    """The policy a node input or enable() argument names (an earlier spelling accepted); ValueError otherwise."""
    policy = FP8_WEIGHT_ALIASES.get(value, value)
    if policy not in FP8_WEIGHT_POLICIES:
        accepted = ", ".join((*FP8_WEIGHT_POLICIES, *FP8_WEIGHT_ALIASES))
        raise ValueError(f"fp8_weights={value!r}; expected one of {accepted}")
    return policy


def describe() -> list[dict]:
    """The families as rows: per family and implementation, what it needs (docs and tests)."""
    return [{"family": family.name, "implementation": impl.name, "kind": impl.kind, "module": impl.module,
             "legacy": impl.legacy, "verified_code": impl.needs.verified_code,
             "min_capability": impl.needs.min_capability, "dtypes": list(impl.needs.dtypes),
             "vram_modes": list(impl.needs.vram_modes), "capture_safe": impl.needs.capture_safe}
            for family in FAMILIES.values() for impl in family.implementations]
