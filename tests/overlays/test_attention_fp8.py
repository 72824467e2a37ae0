"""FP8 attention forward (issue 28's `fp8` mode): the kernel against its eager FP8 reference and against fp32 SDPA,
the block quantiser's round trip, the refusals, and the sm_89 / sm_90 builds; the same for the launch on SageAttention
2's recipe (Q's scales per warp's rows, V's per channel, the two-level fp32 sum of P V).

On CPU the kernels run under TRITON_INTERPRET=1 (conftest) at tiny shapes with 32-row tiles, so S = 48 leaves a
partial tile. There the kernels round to e4m3's grid before the interpreter's fp8 cast (the module docstring says
why), so codes are byte-exact and the kernel matches its reference to one rounding of the output dtype. The
compile test builds both kernels for sm_89 and sm_90 on this machine (no GPU) and reads the PTX.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fused_dit import state
from fused_dit.ops import attention_fp8 as af
from fused_dit.testing import byte_mismatch

OVERLAYS = Path(af.__file__).resolve().parents[2]
SMALL = af.AttentionFP8Launch(block_m=32, block_n=32, num_warps=4, num_stages=1, quantize_num_warps=4)
# the operand formats: INT8 Q K^T with P V in the inputs' dtype (the default), INT8 Q K^T with e4m3 P V, all e4m3,
# and SageAttention 2's recipe (Q's scales per 8 rows, a warp's share of the 32-row tile; V's per channel)
FORMATS = {"qk-i8 pv-16": SMALL, "qk-i8 pv-e4m3": dataclasses.replace(SMALL, pv_fp8=True),
           "qk-e4m3 pv-e4m3": dataclasses.replace(SMALL, qk_int8=False, pv_fp8=True),
           "sage2 recipe": af.sage2_recipe(SMALL)}
# output dtype -> the largest relative difference of two roundings of one fp32 value (one ulp: 2^-(mantissa bits))
ONE_ULP = {torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10}
interpreter_only = pytest.mark.skipif(torch.cuda.is_available(),
                                      reason="CPU tensors through the Triton interpreter (the GPU gates are separate)")


def inputs(seed: int, sq: int, skv: int, dtype: torch.dtype, d: int = 64, qk_std: float = 0.5):
    """q, k, v [1, 2, S, d]; k has a per-channel offset (what the smoothing removes), q and k a spread that keeps
    sm_scale * sum |q||k| near 1, where the e4m3 bound is informative."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 2, sq, d, generator=g) * qk_std
    k = (torch.randn(1, 2, skv, d, generator=g) + torch.randn(1, 2, 1, d, generator=g)) * qk_std
    v = torch.randn(1, 2, skv, d, generator=g)
    return q.to(dtype), k.to(dtype), v.to(dtype)


SHAPES = [(16, 16), (48, 48), (48, 16)]      # (Sq, Skv): one partial tile; one and a half tiles; cross-attention


@interpreter_only
@pytest.mark.parametrize("formats", FORMATS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("sq,skv", SHAPES)
def test_kernel_matches_its_fp8_reference(seed, sq, skv, dtype, formats):
    q, k, v = inputs(seed, sq, skv, dtype)
    launch = FORMATS[formats]
    out = af.attention_fp8_triton(q, k, v, launch=launch)
    ref = af.attention_fp8_reference(q, k, v, launch=launch)
    assert out.dtype == dtype and out.shape == q.shape and out.is_contiguous()
    # the same codes and the same fp32 steps: the two fp32 results differ by accumulation order only, so their
    # roundings to the output dtype are at most one ulp apart
    diff = (out.float() - ref.float()).abs()
    allowed = ONE_ULP[dtype] * ref.float().abs() + 2.0 ** -24
    if not launch.pv_fp8:
        # P rounded to a 16-bit dtype: where the interpreter's exp2 and torch's differ in fp32's last bit, a p may
        # round to the neighbouring value (one spacing, 2 u_p relative), each such term moving the output by at
        # most 2 u_p w_j |v_j| (w: the softmax weights; twice that for the quantised logits' drift)
        weights = torch.softmax(q.float() @ k.float().transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)
        allowed = allowed + 4 * af.P16_ROUNDING[dtype][0] * (weights @ v.float().abs())
    assert bool((diff <= allowed).all()), diff.max()


@interpreter_only
@pytest.mark.parametrize("formats", FORMATS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("sq,skv", SHAPES)
def test_kernel_within_the_rounding_bound_of_fp32_sdpa(seed, sq, skv, dtype, formats):
    """|kernel - fp32 SDPA| <= error_bound (the formats' rounding carried through the logits, the softmax and P V;
    derivation in af.error_bound) + half an ulp of the output dtype for the final rounding."""
    q, k, v = inputs(seed, sq, skv, dtype)
    exact = af.attention_exact_reference(q, k, v).double()
    launch = FORMATS[formats]
    bound = af.error_bound(q, k, v, launch=launch) + ONE_ULP[dtype] / 2 * exact.abs()
    for out in (af.attention_fp8_triton(q, k, v, launch=launch), af.attention_fp8_reference(q, k, v, launch=launch)):
        assert bool(((out.double() - exact).abs() <= bound).all())


@interpreter_only
def test_strided_inputs_take_the_kernel(seed):
    """Flux hands q, k, v as non-contiguous views of a packed qkv."""
    q, k, v = inputs(seed, 48, 48, torch.bfloat16)
    packed = torch.stack([q, k, v], dim=3).transpose(1, 2).contiguous()       # [B, S, H, 3, D]
    qs, ks, vs = (packed[:, :, :, i].transpose(1, 2) for i in range(3))
    assert not qs.is_contiguous()
    assert torch.equal(af.attention_fp8_triton(qs, ks, vs, launch=SMALL),
                       af.attention_fp8_triton(q, k, v, launch=SMALL))


@interpreter_only
def test_both_v_layouts_give_the_same_bits(seed):
    """V's codes stored [S, D] or transposed [D, S] (the K-major operand the FP8 tensor cores take): the same
    codes, the same products, the same output."""
    q, k, v = inputs(seed, 48, 40, torch.bfloat16)
    transposed = FORMATS["qk-i8 pv-e4m3"]
    rows = dataclasses.replace(transposed, v_transposed=False)
    assert torch.equal(af.attention_fp8_triton(q, k, v, launch=rows),
                       af.attention_fp8_triton(q, k, v, launch=transposed))


@interpreter_only
@pytest.mark.parametrize("smooth,transposed,int8", [(False, False, False), (True, False, False), (False, True, False),
                                                    (True, False, True)])
def test_quantize_round_trip(seed, smooth, transposed, int8):
    x = inputs(seed, 48, 48, torch.bfloat16)[1]
    mean = af.key_mean(x) if smooth else None
    codes, scales = af.quantize_blocks_triton(x, 32, mean, transposed=transposed, int8=int8)
    ref_codes, ref_scales = af.quantize_blocks_reference(x, 32, mean, int8=int8)
    assert torch.equal(scales, ref_scales) and scales.shape == (1, 2, 2)
    assert byte_mismatch(codes, ref_codes) == (0, 0.0)
    # dequantised: within e4m3's rounding of each value (u |x| + half the subnormal spacing, in code units)
    target = x.float() - mean if smooth else x.float()
    rows = torch.arange(48) // 32
    if int8:       # half a code
        tolerance = 0.5 * scales[:, :, rows, None] * (1 + 2.0 ** -20)
    else:          # e4m3: u |x| + half the subnormal spacing, in code units
        tolerance = af.E4M3_UNIT_ROUNDOFF * target.abs() + af.E4M3_HALF_SUBNORMAL_SPACING * scales[:, :, rows, None]
    assert bool(((af.dequantize_blocks(codes, scales, 32) - target).abs() <= tolerance).all())


@interpreter_only
@pytest.mark.parametrize("transposed", [False, True])
def test_the_per_channel_v_quantiser_matches_its_reference(seed, transposed):
    """SageAttention 2's recipe quantises V once, per channel over all tokens: the kernel's codes are the reference's,
    byte for byte, in either layout, and dequantise to within e4m3's rounding of each value."""
    v = inputs(seed, 16, 48, torch.bfloat16)[2]
    ref_codes, scales = af.quantize_channels_reference(v)
    assert scales.shape == (1, 2, 64) and torch.equal(scales, af.channel_scales(v))
    codes, _ = af.quantize_blocks_triton(v, 32, transposed=transposed, channel_scales=scales)
    assert byte_mismatch(codes, ref_codes) == (0, 0.0)
    error = (codes.float() * scales[:, :, None] - v.float()).abs()
    assert bool((error <= af.E4M3_UNIT_ROUNDOFF * v.float().abs()
                 + af.E4M3_HALF_SUBNORMAL_SPACING * scales[:, :, None]).all())


@interpreter_only
def test_the_recipes_entry_point_runs_the_recipes_launch_and_falls_back_like_the_kernel(seed):
    """attention_fp8_sage2 (what the fp8 mode calls for the recipe) is the kernel at sage2_launch_for's launch; a
    call the kernel refuses returns exact attention, as attention_fp8 does."""
    q, k, v = inputs(seed, 48, 40, torch.bfloat16)
    assert torch.equal(af.attention_fp8_sage2(q, k, v),
                       af.attention_fp8_triton(q, k, v, launch=af.sage2_launch_for(None)))
    q, k, v = inputs(seed, 16, 16, torch.bfloat16, d=96)
    try:
        assert torch.equal(af.attention_fp8_sage2(q, k, v),
                           torch.nn.functional.scaled_dot_product_attention(q, k, v))
    finally:
        state.forget_said()         # the refusal is said once: later tests expect to hear it


def test_the_sage2_recipe_is_a_launch_of_its_own_and_the_defaults_keep_theirs():
    """The recipe's Q groups are the rows one warp owns; the default launches keep per-block scales and labels."""
    for capability in ((8, 9), (9, 0), None):
        default, recipe = af.launch_for(capability), af.sage2_launch_for(capability)
        assert default.q_group == 0 and not default.v_per_channel and "channel" not in default.label
        assert recipe.q_group * recipe.num_warps == recipe.block_m and recipe.qk_int8 and recipe.pv_fp8
        assert recipe.v_per_channel and recipe.label != default.label
        assert (recipe.block_m, recipe.block_n, recipe.num_stages) == (default.block_m, default.block_n,
                                                                       default.num_stages)
    with pytest.raises(ValueError, match="q_group"):
        dataclasses.replace(SMALL, q_group=24)
    with pytest.raises(ValueError, match="pv_fp8"):
        dataclasses.replace(SMALL, v_per_channel=True)


def test_finer_q_scales_shrink_the_bound_where_one_row_is_large(seed):
    """One query row far larger than the others sets its whole block's scale; with the recipe's groups it sets only
    its own group's, so the other rows' logits keep their resolution and the bound shrinks there (CPU, no kernel)."""
    q, k, v = inputs(seed, 32, 32, torch.bfloat16)
    q[:, :, 0] *= 30
    block = dataclasses.replace(SMALL, pv_fp8=True)
    grouped = dataclasses.replace(block, q_group=8)
    rest = slice(8, None)
    assert bool((af.error_bound(q, k, v, launch=grouped)[:, :, rest]
                 < af.error_bound(q, k, v, launch=block)[:, :, rest]).all())


@interpreter_only
def test_quantiser_rounds_ties_to_even():
    """Midpoints between neighbouring e4m3 codes (block absmax 448, so the scale is 1): the kernel's rounding to
    the grid must pick the even code as torch's cast does, across normals and subnormals."""
    grid = torch.arange(0, 127, dtype=torch.uint8).view(af.FP8_DTYPE).float()       # every non-negative code
    ties = (grid[:-1] + grid[1:]) / 2
    values = torch.cat([ties, -ties, torch.tensor([448.0])])
    x = torch.zeros(1, 1, 32, 64)
    x.view(-1)[:values.numel()] = values
    codes, scales = af.quantize_blocks_triton(x, 32)
    assert scales.item() == 1.0
    assert byte_mismatch(codes, x.to(af.FP8_DTYPE)) == (0, 0.0)


@interpreter_only
def test_the_int8_quantiser_rounds_ties_to_even():
    """Block absmax 127, so the scale is 1: halves between integers round to the even one, as torch.round does."""
    values = torch.cat([torch.arange(-127, 127) + 0.5, torch.tensor([127.0])])
    x = torch.zeros(1, 1, 32, 64)
    x.view(-1)[:values.numel()] = values
    codes, scales = af.quantize_blocks_triton(x, 32, int8=True)
    assert scales.item() == 1.0 and codes.dtype == torch.int8
    assert torch.equal(codes, x.round().to(torch.int8))


def test_refusals(monkeypatch):
    q = torch.zeros(1, 2, 16, 64, dtype=torch.bfloat16)
    assert "head dim 96" in af.refusal(*(torch.zeros(1, 2, 16, 96, dtype=torch.bfloat16),) * 3)
    assert "bf16 or fp16" in af.refusal(q.float(), q.float(), q.float())
    assert "bf16 or fp16" in af.refusal(q, q, q.half())
    assert "k and v" in af.refusal(q, q, torch.zeros(1, 2, 8, 64, dtype=torch.bfloat16))
    assert "[B, H, S, D]" in af.refusal(q[0], q[0], q[0])
    assert "below sm_89" in af.capability_refusal((8, 6))
    assert af.capability_refusal((8, 9)) is None and af.capability_refusal((9, 0)) is None
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert "sm_89+ CUDA" in af.refusal(q, q, q)
    with pytest.raises(ValueError, match="sm_89"):
        af.attention_fp8_triton(q, q, q)


def test_refused_calls_return_exact_attention(caplog, seed):
    """A refusal is said once and the call returns SDPA in q's dtype: never an exception inside a prompt."""
    q, k, v = inputs(seed, 16, 16, torch.bfloat16, d=96)
    with caplog.at_level("INFO"):
        out = af.attention_fp8(q, k, v)
    assert torch.equal(out, torch.nn.functional.scaled_dot_product_attention(q, k, v))
    assert "head dim 96" in caplog.text


COMPILE = """
import dataclasses, json, re, sys
sys.path.insert(0, sys.argv[1])
try:
    from triton.backends.compiler import GPUTarget  # noqa: F401
    from triton.compiler import ASTSource  # noqa: F401
    import triton
    triton.compile
except (ImportError, AttributeError) as exc:
    print(json.dumps({"skip": f"this Triton cannot compile for another target ({exc})"}))
    raise SystemExit(0)
from fused_dit.ops import attention_fp8 as af
found = {}
def fp8_dot_accumulators(ttgir):
    # what each e4m3 x e4m3 dot of the kernel accumulates into: "zero" (a fresh accumulator) or the operand's name
    defined = dict(re.findall(r"^\\s*(%[\\w]+) = (.*)$", ttgir, re.M))
    found = []
    for a, b, acc in re.findall(r"(?:tt\\.dot|ttng\\.warp_group_dot) (%[\\w]+), (%[\\w]+), (%[\\w]+).*f8E4M3FN", ttgir):
        found.append("zero" if re.match(r"arith\\.constant dense<0\\.0+e\\+00>", defined.get(acc, "")) else acc)
    return found
for arch in (89, 90):
    default = af.launch_for(divmod(arch, 10))
    for formats, launch in (("default", default), ("fp8", dataclasses.replace(default, qk_int8=False, pv_fp8=True)),
                            ("sage2", af.sage2_launch_for(divmod(arch, 10)))):
        for name, asm in af.compile_for(arch, launch=launch).items():
            found[f"{arch}/{formats}/{name}"] = {
                "instructions": sorted(set(re.findall(r"(mma\\.sync\\.aligned\\.[\\w.]+|wgmma\\.mma_async\\.[\\w.]+|"
                                                       r"cvt\\.rn\\.satfinite\\.e4m3x2\\.f32)", asm["ptx"]))),
                "target": re.search(r"\\.target\\s+(\\S+)", asm["ptx"]).group(1),
                "cubin_bytes": len(asm["cubin"]), "fp8_dot_accumulators": fp8_dot_accumulators(asm["ttgir"])}
print(json.dumps(found))
"""
# the operands of each format's two products in PTX's spelling: Q K^T's, then P V's (bf16 inputs)
PRODUCTS = {"default": ("s32.s8.s8", "f32.bf16.bf16"), "fp8": ("f32.e4m3.e4m3", "f32.e4m3.e4m3"),
            "sage2": ("s32.s8.s8", "f32.e4m3.e4m3")}


def test_kernels_build_for_sm89_and_sm90_without_a_gpu():
    """Triton compiles for a GPU it does not have (GPUTarget + ASTSource, ptxas included); both products run on the
    tensor cores in their formats (INT8 Q K^T and 16-bit P V by default; e4m3 both, with the hardware e4m3
    conversion, when asked; INT8 then e4m3 on SageAttention 2's recipe, whose P V dot accumulates into a fresh zero
    accumulator per tile): mma.sync on sm_89, only wgmma on sm_90."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    run = subprocess.run([sys.executable, "-c", COMPILE, str(OVERLAYS)], env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(run.stdout.strip().splitlines()[-1])
    if "skip" in found:
        pytest.skip(found["skip"])
    for arch, target in (("89", "sm_89"), ("90", "sm_90a")):
        for formats, products in PRODUCTS.items():
            attention, quantiser = found[f"{arch}/{formats}/attention_fp8"], found[f"{arch}/{formats}/quantize_blocks"]
            assert attention["target"] == target and attention["cubin_bytes"] > 0 and quantiser["cubin_bytes"] > 0
            mma = [i for i in attention["instructions"] if "mma" in i]
            for operands in products:
                assert any(operands in i for i in mma), (arch, formats, mma)
            assert all(i.startswith("mma.sync" if arch == "89" else "wgmma") for i in mma), (arch, formats, mma)
            if formats != "default":
                assert "cvt.rn.satfinite.e4m3x2.f32" in attention["instructions"]
            if formats == "fp8":
                assert "cvt.rn.satfinite.e4m3x2.f32" in quantiser["instructions"]
            if formats == "sage2":
                # V quantised per channel by its own kernel (e4m3); each P V tile's FP8 dot starts from a zero
                # accumulator, its sum with the running output left to fp32 arithmetic (the two-level sum)
                v_quantiser = found[f"{arch}/{formats}/quantize_v"]
                assert v_quantiser["cubin_bytes"] > 0
                assert "cvt.rn.satfinite.e4m3x2.f32" in v_quantiser["instructions"]
                assert attention["fp8_dot_accumulators"] == ["zero"], attention["fp8_dot_accumulators"]


@interpreter_only
def test_torch_compile_sees_one_custom_op(seed):
    q, k, v = inputs(seed, 48, 48, torch.bfloat16)
    compiled = torch.compile(lambda q, k, v: af.attention_fp8(q, k, v), fullgraph=True,
                             backend="eager")
    assert torch.equal(compiled(q, k, v), af.attention_fp8(q, k, v))
