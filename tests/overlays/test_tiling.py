"""Tiled sampling (fused_dit/tiling, the Tiled Sampling node): the planner's grid and blend profiles (property tests),
the blender against an identity and a local convolution, the CALC_COND_BATCH body with ComfyUI-shaped conditionings,
ControlNet hints and masks, progress and Cancel, the canvas on the host, the node's validation and wiring, and the
model table against applier budget's."""
from __future__ import annotations

import logging
import sys
import tomllib
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings, strategies as st

import comfyui_fused_dit as node_pack
from comfy_fakes import FakeModelPatcher
from fused_dit import state
from fused_dit.tiling import blend, models, plan, sampling, wrappers

REPO = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------------- the planner
@st.composite
def axes(draw):
    align = draw(st.sampled_from([1, 2]))
    tile = draw(st.integers(1, 24)) * align
    overlap = draw(st.integers(0, tile // 2))
    margin = draw(st.integers(0, overlap // 2))
    length = draw(st.integers(1, 200))
    return length, tile, overlap, align, margin


@settings(max_examples=300, deadline=None)
@given(axes())
def test_axis_grid_covers_with_the_overlap_asked(case):
    length, tile, overlap, align, _ = case
    starts = plan.axis_starts(length, tile, overlap, align)
    size = min(tile, length)
    assert starts[0] == 0 and starts[-1] == max(0, length - tile)
    assert list(starts) == sorted(set(starts))
    assert all(b - a <= tile - overlap for a, b in zip(starts, starts[1:]))       # neighbours overlap enough
    assert all(s % align == 0 for s in starts[:-1]) or align > tile - overlap
    assert all(0 <= s and s + size <= length for s in starts)


@settings(max_examples=300, deadline=None)
@given(axes())
def test_profiles_are_a_partition_of_unity(case):
    """Every pixel has weight; where two tiles meet and their ramps do not cross, the two exact profiles add to 1;
    the blender's normalised fp32 weights add to 1 within 2 ulp everywhere."""
    length, tile, overlap, align, margin = case
    starts = plan.axis_starts(length, tile, overlap, align)
    size = min(tile, length)
    profiles = [plan.axis_profile(length, starts, tile, i, margin, exact=True) for i in range(len(starts))]
    total = [Fraction(0)] * length
    cover = [[] for _ in range(length)]
    for i, (start, profile) in enumerate(zip(starts, profiles)):
        assert len(profile) == size and all(0 <= v <= 1 for v in profile)
        for k, value in enumerate(profile):
            total[start + k] += value
            cover[start + k].append(i)

    def ramps_cross(i):
        before = starts[i - 1] + size - starts[i] if i else 0
        after = starts[i] + size - starts[i + 1] if i + 1 < len(starts) else 0
        return before + after > size

    for p in range(length):
        assert total[p] > 0
        if len(cover[p]) <= 2 and not any(ramps_cross(i) for i in cover[p]):
            assert total[p] == 1
    floats = torch.zeros(length, dtype=torch.float64)
    normalised = torch.zeros(length, dtype=torch.float32)
    weights = [torch.tensor([float(v) for v in profile], dtype=torch.float32) for profile in profiles]
    for start, w in zip(starts, weights):
        floats[start:start + size] += w.double()
    wsum = torch.zeros(length, dtype=torch.float32)
    for start, w in zip(starts, weights):
        wsum[start:start + size] += w
    for start, w in zip(starts, weights):
        normalised[start:start + size] += w / wsum[start:start + size]
    assert torch.all((normalised - 1).abs() <= 2 * torch.finfo(torch.float32).eps)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 90), st.integers(1, 90), st.sampled_from([8, 16, 32]), st.integers(0, 7))
def test_2d_weight_sum_is_positive_everywhere(height, width, tile, overlap):
    layout = plan.plan(height, width, tile, min(overlap, tile // 2), align=2 if tile % 2 == 0 else 1)
    rows, cols = blend.Profiles(layout, torch.float32, "cpu").sums()
    assert bool((rows > 0).all()) and bool((cols > 0).all())
    assert layout.count == len(layout.ys) * len(layout.xs)


@pytest.mark.parametrize("tile, overlap, message", [
    (16, 16, "must be smaller than the tile"), (16, 20, "must be smaller than the tile"),
    (16, 9, "at most half the tile"),
    (15, 2, "multiple of the model's patch"), (16, -1, "must not be negative")])
def test_settings_no_canvas_can_take_are_refused(tile, overlap, message):
    with pytest.raises(plan.PlanError, match=message):
        plan.plan(100, 100, tile, overlap, align=2)


def test_batch_follows_the_free_memory_and_the_model():
    flux = models.MODELS["flux-dev"]
    per_tile = flux.tile_bytes(1024)
    assert per_tile == int(15.1 * 3072 * (64 * 64 + 256) * 2)
    assert plan.choose_batch(3 * per_tile + 1, per_tile, 100, 8) == 3
    assert plan.choose_batch(100 * per_tile, per_tile, 100, 8) == 8
    assert plan.choose_batch(100 * per_tile, per_tile, 5, 8) == 5
    assert plan.choose_batch(0, per_tile, 100, 8) == 1
    chosen = plan.choose(flux, 4096, 2304, 5 * per_tile)       # 32768 x 18432
    assert (chosen.tile_px, chosen.overlap_px, chosen.batch, chosen.plan.margin) == (1024, 128, 5, 4)
    assert chosen.plan.count == 37 * 21 and chosen.planned == ("tile", "overlap", "margin", "batch")
    given_ = plan.choose(flux, 4096, 2304, 5 * per_tile, tile_px=2048, overlap_px=256, batch=2)
    assert (given_.tile_px, given_.overlap_px, given_.batch, given_.planned) == (2048, 256, 2, ("margin",))
    small = plan.choose(flux, 4096, 2304, 5 * per_tile, tile_px=256)
    assert (small.overlap_px, small.plan.margin) == (128, 4)          # a planned overlap fits any tile allowed


# ------------------------------------------------------------------------------------------- the body of the wrapper
def _run(x, conds, model_fn, layout, batch, **kwargs):
    calls = []

    def executor(model, conds_, x_in, timestep, model_options):
        calls.append((x_in, timestep, conds_))
        return [torch.zeros_like(x_in) if c is None else model_fn(x_in, c) for c in conds_]

    out = sampling.tiled_calc_cond_batch(executor, None, conds, x, torch.full((x.shape[0],), 0.5), {},
                                         plan_for=lambda _: (layout, batch), **kwargs)
    return out, calls


def _single_cover(layout: plan.Plan) -> torch.Tensor:
    count = torch.zeros(layout.height, layout.width)
    for b in layout.boxes:
        count[b.y0:b.y1, b.x0:b.x1] += 1
    return count == 1


@pytest.mark.parametrize("shape, tile, overlap, batch", [((1, 4, 40, 56), 16, 6, 3), ((2, 3, 33, 17), 12, 4, 4),
                                                          ((1, 2, 3, 24, 30), 10, 3, 2)])
def test_identity_model_gives_back_the_canvas(shape, tile, overlap, batch):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    layout = plan.plan(shape[-2], shape[-1], tile, overlap, align=1)
    (out, zeros), calls = _run(x, [[{}], None], lambda t, c: t.clone(), layout, batch)
    alone = _single_cover(layout)
    assert torch.equal(out[..., alone], x[..., alone])                          # bit for bit where one tile covers
    ulp = torch.finfo(torch.float32).eps * x.abs().clamp_min(torch.finfo(torch.float32).tiny)
    assert bool(((out - x).abs() <= 2 * ulp).all())                               # 2 ulp where tiles blend
    assert torch.equal(zeros, torch.zeros_like(x))
    assert len(calls) == -(-layout.count // batch)
    assert all(c[0].shape[0] == shape[0] * min(batch, layout.count) for c in calls[:-1])
    assert calls[0][1].shape[0] == calls[0][0].shape[0]                          # the timestep follows the tiles


def test_a_local_model_tiles_exactly_with_an_overlap_of_its_reach():
    """A fixed 5x5 convolution (zero padding at the tile's edges, reach 4): with an overlap of at least the reach
    and a margin of half of it, every pixel takes only tiles where its receptive field lies inside the tile."""
    torch.manual_seed(1)
    conv = torch.nn.Conv2d(3, 3, 5, padding=2, bias=False).double()
    x = torch.randn(1, 3, 45, 61, dtype=torch.float64)
    with torch.no_grad():
        whole = conv(x)
        layout = plan.plan(45, 61, 16, 6, margin=2)
        (tiled,), _ = _run(x, [[{}]], lambda t, c: conv(t), layout, 4)
    assert torch.allclose(tiled, whole, rtol=1e-12, atol=1e-12)
    without_margin = plan.plan(45, 61, 16, 6, margin=0)
    with torch.no_grad():
        (blurred,), _ = _run(x, [[{}]], lambda t, c: conv(t), without_margin, 4)
    assert not torch.allclose(blurred, whole, rtol=1e-6, atol=1e-6)            # the margin is what makes it exact


def test_a_canvas_of_one_tile_calls_the_model_once_untouched():
    x = torch.randn(1, 4, 16, 12)
    conds = [[{"model_conds": {}}]]
    layout = plan.plan(16, 12, 16, 4)
    out, calls = _run(x, conds, lambda t, c: t * 3, layout, 4)
    assert len(calls) == 1 and calls[0][0] is x and calls[0][2] is conds
    assert torch.equal(out[0], x * 3)
    smaller_than_overlap = plan.plan(3, 3, 16, 8)
    assert smaller_than_overlap.single


class NoiseShaped:
    """comfy.conds.CONDNoiseShape's shape: `cond`, `_copy_with`."""

    def __init__(self, cond):
        self.cond = cond

    def _copy_with(self, cond):
        return NoiseShaped(cond)


class Regular(NoiseShaped):
    pass


class FakeControlNet:
    """The attributes ComfyUI's ControlBase keeps (hint, resized hint cache, chain); records the hint it sees."""

    def __init__(self, hint, previous=None):
        self.cond_hint_original, self.cond_hint, self.previous_controlnet = hint, "cached", previous
        self.extra_concat_orig = [torch.ones(1, 1, 1, 1)]
        self.seen = []

    def get_control(self, x):
        if self.previous_controlnet is not None:
            self.previous_controlnet.get_control(x)
        self.seen.append(self.cond_hint_original.clone())
        return None


def test_spatial_conditionings_are_cut_to_each_tile():
    x = torch.arange(2 * 1 * 24 * 24, dtype=torch.float32).reshape(2, 1, 24, 24)
    concat = x * 10                                        # an inpaint concat latent: the canvas's size
    mask = (x[:, 0] > 300).float()                         # a mask the sampler resized to the latent
    hint = torch.arange(3 * 192 * 192, dtype=torch.float32).reshape(1, 3, 192, 192)   # image pixels: 8x
    previous = FakeControlNet(hint * 2)
    control = FakeControlNet(hint, previous)
    pooled = torch.randn(1, 8)
    entry = {"model_conds": {"c_concat": NoiseShaped(concat), "y": Regular(pooled)}, "mask": mask,
             "control": control}
    layout = plan.plan(24, 24, 16, 8)
    seen_conds = []

    def model_fn(t, conds_):
        (cond,) = conds_
        cut = cond["model_conds"]["c_concat"].cond
        assert torch.equal(cut, t * 10)                     # cut where the latent was cut, in the same order
        assert torch.equal(cond["mask"], (t[:, 0] > 300).float())
        assert cond["model_conds"]["y"].cond is pooled       # the others go through as they are
        cond["control"].get_control(t)
        seen_conds.append(cond)
        return t

    out, calls = _run(x, [[entry]], model_fn, layout, 2)
    assert entry["model_conds"]["c_concat"].cond is concat and entry["mask"] is mask    # originals untouched
    assert control.cond_hint_original is hint and control.cond_hint is None             # put back, cache dropped
    assert previous.cond_hint_original.data_ptr() != hint.data_ptr() and previous.cond_hint is None
    box = layout.boxes[0]
    first = control.seen[0]
    assert first.shape == (2 * 2, 3, 128, 128)               # 2 tiles x 2 samples, each 16 latent px = 128 px
    assert torch.equal(first[0], hint[0, :, box.y0 * 8:box.y1 * 8, box.x0 * 8:box.x1 * 8])
    assert torch.equal(first[0], first[1])                   # one hint repeated to each sample of the tile
    assert torch.equal(previous.seen[0][0], 2 * first[0])    # the chain's earlier ControlNet is cut too


def test_reference_latents_are_cut_where_canvas_shaped_and_kept_whole_elsewhere_said_once(caplog):
    """Qwen-Image-Edit's and Flux.2's reference images reach the model as `ref_latents` (ComfyUI's CONDList of
    latents, 5-D for Qwen-Image's Wan VAE): one of the canvas's size is cut with each tile, one of another size goes
    whole to every tile; each said once for the run."""
    state.forget_said()
    x = torch.randn(1, 16, 24, 24)
    canvas_ref, small_ref = torch.randn(1, 16, 1, 24, 24), torch.randn(1, 16, 1, 8, 8)
    entry = {"model_conds": {"ref_latents": NoiseShaped([canvas_ref, small_ref])}}
    layout = plan.plan(24, 24, 16, 8)
    seen = []

    def model_fn(t, conds_):
        cut_ref, whole = conds_[0]["model_conds"]["ref_latents"].cond
        seen.append((cut_ref.shape, whole is small_ref))
        return t

    with caplog.at_level(logging.INFO, logger="fused_dit"):
        _run(x, [[entry]], model_fn, layout, 1)
        _run(x, [[entry]], model_fn, layout, 1)
    assert seen == [((1, 16, 1, 16, 16), True)] * (2 * layout.count)
    lines = [r.getMessage() for r in caplog.records if "reference latents" in r.getMessage()]
    assert len(lines) == 2 and "cut to each tile" in lines[0] and "go whole to every tile" in lines[1]


def test_an_area_conditioning_stays_untiled_and_says_so(caplog):
    state.forget_said()
    x = torch.randn(1, 1, 40, 40)
    with caplog.at_level(logging.INFO, logger="fused_dit"):
        out, calls = _run(x, [[{"area": (8, 8, 0, 0)}]], lambda t, c: t, plan.plan(40, 40, 16, 4), 4)
    assert len(calls) == 1 and calls[0][0] is x
    assert "ConditioningSetArea" in caplog.text


def test_progress_counts_tiles_and_cancel_stops_between_batches():
    x = torch.randn(1, 1, 40, 40)
    layout = plan.plan(40, 40, 16, 4)
    seen = []
    _run(x, [[{}]], lambda t, c: t, layout, 3, progress=sampling.Progress(advance=lambda d, n: seen.append((d, n))))
    assert seen[-1] == (layout.count, layout.count) and [d for d, _ in seen] == sorted(d for d, _ in seen)

    class Cancelled(Exception):
        pass

    batches = []

    def cancel():
        if len(batches) == 2:
            raise Cancelled
        batches.append(1)

    with pytest.raises(Cancelled):
        _run(x, [[{}]], lambda t, c: t, layout, 3, progress=sampling.Progress(check_cancel=cancel))


# ---------------------------------------------------------------------------------------------------- the node
def comfy_class(name: str, patch, bases: tuple = (torch.nn.Module,)) -> type:
    """A diffusion model class named as ComfyUI 0.33.0's, with its `patch_size` attribute as that class sets it."""
    return type(name, bases, {"patch_size": patch, "__doc__": f"Named as ComfyUI's {name}."})


Flux = comfy_class("Flux", 2)                               # comfy.ldm.flux.model.Flux
MMDiT = comfy_class("MMDiT", 2)                             # comfy.ldm.modules.diffusionmodules.mmdit
Kandinsky5 = comfy_class("Kandinsky5", (1, 2, 2))           # comfy.ldm.kandinsky5.model (image and video)


@dataclass(frozen=True)
class Built:
    """What ComfyUI 0.33.0 builds for one model (comfy/supported_models.py's unet_config as
    comfy/model_detection.py detects it, comfy/latent_formats.py's channels and factor, the diffusion model's class
    and patch_size), at no size: the fields the table recognises a model by."""
    model_class: type
    patch: object
    unet_config: dict
    channels: int
    factor: int
    frames: int = 0                                         # a video model's latent is 5-D: this many frames

    def patcher(self, **changes):
        """A ModelPatcher of this model, with any of the fields changed (a look-alike)."""
        built = replace(self, **changes)
        model = built.model_class()
        model.patch_size = built.patch
        return _patcher(model, (built.unet_config, (built.channels, built.factor)))


# one per entry of the table the node tiles (fused_dit/models.json), as ComfyUI 0.33.0 builds it
BUILT = {
    "flux-dev": Built(Flux, 2, {"image_model": "flux", "hidden_size": 3072, "guidance_embed": True}, 16, 8),
    "flux2-dev": Built(Flux, 1, {"image_model": "flux2", "hidden_size": 6144, "mlp_ratio": 3.0}, 128, 16),
    "chroma": Built(comfy_class("Chroma", 2), 2, {"image_model": "chroma", "hidden_size": 3072}, 16, 8),
    "qwen-image": Built(comfy_class("QwenImageTransformer2DModel", 2), 2,
                        {"image_model": "qwen_image", "num_layers": 60, "in_channels": 64}, 16, 8),
    "z-image": Built(comfy_class("NextDiT", 2), 2, {"image_model": "lumina2", "dim": 3840, "n_layers": 30}, 16, 8),
    "lumina2": Built(comfy_class("NextDiT", 2), 2, {"image_model": "lumina2", "dim": 2304, "n_layers": 26}, 16, 8),
    "sd3.5-large": Built(comfy_class("OpenAISignatureMMDITWrapper", 2, (MMDiT,)), 2,
                         {"in_channels": 16, "patch_size": 2, "depth": 38}, 16, 8),
    "hidream-i1": Built(comfy_class("HiDreamImageTransformer2DModel", 2), 2,
                        {"image_model": "hidream", "num_attention_heads": 20, "num_layers": 16}, 16, 8),
    "hunyuan-image-2.1": Built(comfy_class("HunyuanVideo", [1, 1]), [1, 1],
                               {"image_model": "hunyuan_video", "hidden_size": 3584, "patch_size": [1, 1],
                                "vec_in_dim": None}, 64, 32),
    "wan-14b": Built(comfy_class("WanModel", (1, 2, 2)), (1, 2, 2),
                     {"image_model": "wan2.1", "dim": 5120, "model_type": "t2v"}, 16, 8, frames=3),
    "wan2.2-5b": Built(comfy_class("WanModel", (1, 2, 2)), (1, 2, 2),
                       {"image_model": "wan2.1", "dim": 3072, "out_dim": 48, "model_type": "t2v"}, 48, 16, frames=3),
    "kandinsky5-image": Built(Kandinsky5, (1, 2, 2), {"image_model": "kandinsky5", "model_dim": 2560,
                                                      "visual_embed_dim": 64, "num_visual_blocks": 50}, 16, 8),
    "kandinsky5-video": Built(Kandinsky5, (1, 2, 2), {"image_model": "kandinsky5", "model_dim": 1792,
                                                      "visual_embed_dim": 132, "num_visual_blocks": 32}, 16, 8,
                              frames=3),
    "kandinsky5-video-pro": Built(Kandinsky5, (1, 2, 2), {"image_model": "kandinsky5", "model_dim": 4096,
                                                          "visual_embed_dim": 132, "num_visual_blocks": 60}, 16, 8,
                                  frames=3),
}
FLUX1 = BUILT["flux-dev"].unet_config, (16, 8)


def _patcher(diffusion_model, config=FLUX1):
    from types import SimpleNamespace
    patcher = FakeModelPatcher(diffusion_model)
    patcher.load_device = "cpu"
    unet_config, (channels, factor) = config
    patcher.model.model_config = SimpleNamespace(unet_config=dict(unet_config))
    patcher.model.latent_format = SimpleNamespace(latent_channels=channels, spacial_downscale_ratio=factor)
    return patcher


def test_every_model_the_node_tiles_has_a_comfyui_built_fixture():
    assert set(BUILT) == set(models.MODELS)


@pytest.mark.parametrize("key", list(BUILT))
def test_each_model_is_recognised_from_its_config(key):
    shape, reason = models.recognise(wrappers.model_facts(BUILT[key].patcher()))
    assert (shape.key if shape else None, reason) == (key, "")


def look_alikes():
    """Each entry with one of the fields it is recognised by changed, and the words the refusal names it by."""
    for key, built in BUILT.items():
        width_key, width = next(iter(models.TABLE_ENTRIES[key]["comfyui"]["config"].items()))
        yield key, {"unet_config": {**built.unet_config, width_key: width + 64}}, width_key
        yield key, {"channels": built.channels * 2}, "latent channels"
        yield key, {"factor": built.factor * 2}, "latent factor"
        yield key, {"unet_config": {**built.unet_config, "image_model": "look_alike"}}, "image_model"


@pytest.mark.parametrize("key, changes, named", list(look_alikes()))
def test_a_look_alike_differing_in_one_field_runs_untiled_naming_it(key, changes, named, caplog):
    state.forget_said()
    node = node_pack.NODE_CLASS_MAPPINGS["TiledSampling"]()
    model = BUILT[key].patcher(**changes)
    with caplog.at_level(logging.INFO, logger="fused_dit"):
        (same,) = node.patch(model)
        node.patch(model)
    assert same is model
    lines = [r.getMessage() for r in caplog.records if "Tiled Sampling" in r.getMessage()]
    assert len(lines) == 1 and "runs untiled" in lines[0], lines
    assert f"its {named} differ" in lines[0] and "is not " in lines[0], lines[0]


def test_flux2_on_fluxs_class_is_tiled_with_its_own_numbers_and_klein_is_not():
    shape, _ = models.recognise(wrappers.model_facts(BUILT["flux2-dev"].patcher()))
    assert (shape.vae_factor, shape.patch, shape.latent_channels, shape.hidden) == (16, 1, 128, 6144)
    assert shape.tokens(1024) == 64 * 64 + 512                   # 16 px a token: Flux.1's tokens at the same tile
    klein = BUILT["flux2-dev"].patcher(unet_config={"image_model": "flux2", "hidden_size": 3072})
    shape, reason = models.recognise(wrappers.model_facts(klein))
    assert shape is None and "is not FLUX.2 [dev] (its hidden_size differs)" in reason
    no_config = FakeModelPatcher(Flux())
    no_config.load_device = "cpu"
    assert node_pack.NODE_CLASS_MAPPINGS["TiledSampling"]().patch(no_config)[0] is no_config   # which Flux? untiled


def test_kandinsky5s_three_models_on_one_class_are_told_apart_by_model_dim():
    """Kandinsky 5.0 Image Lite, Video Lite and Video Pro: one class (Kandinsky5), image_model kandinsky5, 16 latent
    channels at 1/8, patch 2; model_dim alone (comfy/model_detection.py's kandinsky5 branch) says which, and each is
    tiled with its own width and tile (Video Pro, 4096 wide, is an entry of its own)."""
    found = {}
    for key in ("kandinsky5-image", "kandinsky5-video", "kandinsky5-video-pro"):
        shape, reason = models.recognise(wrappers.model_facts(BUILT[key].patcher()))
        assert reason == "", reason
        found[BUILT[key].unet_config["model_dim"]] = (shape.key, shape.hidden, shape.tile_px)
    assert found == {2560: ("kandinsky5-image", 2560, 1024), 1792: ("kandinsky5-video", 1792, 512),
                     4096: ("kandinsky5-video-pro", 4096, 512)}
    pro = models.MODELS["kandinsky5-video-pro"]
    assert pro.tile_bytes(512, frames=31) > 2 * models.MODELS["kandinsky5-video"].tile_bytes(512, frames=31)


def test_the_node_wraps_a_known_model_and_hands_back_an_unknown_one(caplog):
    state.forget_said()
    assert "TiledSampling" in node_pack.NODE_CLASS_MAPPINGS
    node = node_pack.NODE_CLASS_MAPPINGS["TiledSampling"]()
    flux = _patcher(Flux())
    (patched,) = node.patch(flux, tile_px=512, overlap_px=64, tile_batch=2)
    assert patched is not flux
    assert set(patched.wrappers) == {"prepare_sampling", "sampler_sample", "calc_cond_batch"}
    other = _patcher(torch.nn.Linear(2, 2))
    with caplog.at_level(logging.INFO, logger="fused_dit"):
        (same,) = node.patch(other)
    assert same is other and "not a model the node tiles" in caplog.text


def comfyui_validation(node_class, inputs: dict) -> list[str]:
    """The errors ComfyUI 0.33's validation gives a node's literal inputs, as its execution.validate_inputs
    behaves (written here, not copied): an input VALIDATE_INPUTS names is checked by that call alone (one error
    per input it names), every other INT input against its min and max."""
    import inspect
    declared = {**node_class.INPUT_TYPES()["required"], **node_class.INPUT_TYPES().get("optional", {})}
    named = [n for n in inspect.signature(node_class.VALIDATE_INPUTS).parameters if n != "cls"]
    errors = []
    for name, value in inputs.items():
        spec = declared[name]
        if name in named or spec[0] != "INT":
            continue
        if value < spec[1].get("min", value):
            errors.append(f"Value {value} smaller than min of {spec[1]['min']}: {name}")
        if value > spec[1].get("max", value):
            errors.append(f"Value {value} bigger than max of {spec[1]['max']}: {name}")
    answer = node_class.VALIDATE_INPUTS(**{n: inputs[n] for n in named if n in inputs})
    if answer is not True:
        errors += [f"{n} - {answer}" for n in named]
    return errors


@pytest.mark.parametrize("inputs, message", [
    ({"tile_px": 1000}, "tile_px 1000 is not a multiple of 16"),
    ({"tile_px": 128}, "tile_px 128 is outside 256..16384"),
    ({"tile_px": -128}, "tile_px -128 is outside"),
    ({"tile_px": 20000}, "tile_px 20000 is outside"),
    ({"overlap_px": 200}, "bigger than max of 128: overlap_px"),
    ({"overlap_px": -5}, "smaller than min of -1: overlap_px"),
    ({"tile_batch": 1000}, "bigger than max of 64: tile_batch"),
    ({"tile_batch": -1}, "smaller than min of 0: tile_batch")])
def test_bad_settings_are_refused_in_validation_with_one_message_naming_the_input(inputs, message):
    node_class = node_pack.NODE_CLASS_MAPPINGS["TiledSampling"]
    errors = comfyui_validation(node_class, {"tile_px": 0, "overlap_px": -1, "tile_batch": 0, **inputs})
    assert len(errors) == 1 and message in errors[0], errors
    assert comfyui_validation(node_class, {"tile_px": 1024, "overlap_px": 128, "tile_batch": 8}) == []


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(models.MODELS)),
       st.sampled_from([0, *range(256, 4097, 16)]), st.integers(-1, 128), st.integers(1, 600), st.integers(1, 600))
def test_every_setting_validation_lets_through_tiles_every_canvas(model, tile_px, overlap_px, height, width):
    """No setting that passes validation leaves a canvas untiled at run time (at 32K that was an out-of-memory
    error with nothing to explain it)."""
    node_class = node_pack.NODE_CLASS_MAPPINGS["TiledSampling"]
    assert comfyui_validation(node_class, {"tile_px": tile_px, "overlap_px": overlap_px}) == []
    overlap_px = overlap_px // 8 * 8 if overlap_px > 0 else overlap_px
    chosen = plan.choose(models.MODELS[model], height, width, 2 ** 34, tile_px=tile_px, overlap_px=overlap_px)
    assert chosen.plan.count >= 1


def test_a_sampling_run_plans_once_says_one_line_and_can_keep_the_canvas_on_the_host(caplog):
    hooks = wrappers.TiledSampling(models.MODELS["flux-dev"], wrappers.Request(256, 64, 2, canvas="host"),
                                   torch.device("cpu"))
    noise = torch.randn(1, 16, 64, 80)          # 640 x 512 image pixels
    seen = {}

    def sampler(guider, sigmas, extra_args, callback, noise_, latent_image, denoise_mask, disable_pbar):
        seen["device"] = noise_.device
        out = hooks.calc_cond_batch(lambda m, c, x, t, o: [x * 2 for _ in c], None, [[{}]], noise_,
                                    sigmas[:1].expand(noise_.shape[0]), {})
        seen["calls"] = out
        return out[0]

    with caplog.at_level(logging.INFO, logger="fused_dit"):
        out = hooks.sampler_sample(sampler, None, torch.tensor([1.0, 0.5, 0.0]), {}, None, noise,
                                   torch.zeros_like(noise))
    assert hooks.run is None                                         # the run's plan does not outlive it
    assert seen["device"].type == "cpu"
    assert torch.allclose(out, noise * 2)
    lines = [r.getMessage() for r in caplog.records if "Tiled Sampling" in r.getMessage()]
    assert len(lines) == 1 and "tiles of 256 px, overlap 64 px" in lines[0] and "canvas on the host" in lines[0]


def test_comfyui_sizes_its_memory_for_a_batch_of_tiles_not_the_canvas():
    """PREPARE_SAMPLING: ComfyUI's estimate (and so how much of the weights it keeps in VRAM) sees one batch of
    tiles; the run then uses the same plan."""
    hooks = wrappers.TiledSampling(models.MODELS["flux-dev"], wrappers.Request(1024, 128, 3), torch.device("cpu"))

    class Model:
        def model_size(self):
            return 10 ** 9

        def loaded_size(self):
            return 0

    seen = []
    hooks.prepare_sampling(lambda m, shape, conds, *a, **k: seen.append(shape), Model(), (1, 16, 1024, 2048), [],
                           model_options={})
    assert seen == [[3, 16, 128, 128]]
    assert hooks.settings_for((1, 16, 1024, 2048)) is hooks.prepared[1]
    small = []
    hooks.prepare_sampling(lambda m, shape, conds, *a, **k: small.append(shape), Model(), (1, 16, 64, 64), [])
    assert small == [(1, 16, 64, 64)]                                  # one tile: ComfyUI's own estimate


def test_one_table_serves_the_node_and_applier_budget():
    """One memory model and one list of models: applier budget reads the pack's table (fused_dit/models.json) for
    its models, so the node's numbers for each model are the budget's; its tile is one of that model's tile sizes,
    its overlap the budget's tiling overlap; every entry names the release's files its numbers come from."""
    from applier.budget.data import MODELS_TABLE, load_budget_data
    assert MODELS_TABLE.resolve() == models.TABLE.resolve()
    assert not (REPO / "applier" / "data" / "models.toml").exists()
    data = load_budget_data()
    assert list(data.models) == list(models.TABLE_ENTRIES)
    efficiency = tomllib.loads((REPO / "applier" / "data" / "efficiency.toml").read_text(encoding="utf-8"))
    for key, shape in models.MODELS.items():
        model = data.models[key]
        assert (shape.hidden, shape.activation_widths, shape.text_tokens, shape.patch, shape.vae_factor) == (
            model.hidden, model.activation_widths, model.text_tokens, model.patch, model.vae.factor)
        assert shape.tile_px in model.tile_px and shape.latent_channels == model.vae.channels
        assert shape.overlap_px == efficiency["tiling"]["overlap_px"]
        assert shape.text_in_stream == (model.groups[0].stream == "all")
        entry = models.TABLE_ENTRIES[key]
        assert entry["comfyui"]["source"].startswith("ComfyUI 0.33.0 comfy/"), key
        assert entry["tiling"]["max_batch_source"], key
    untiled = {key: entry for key, entry in models.TABLE_ENTRIES.items()
               if key not in models.MODELS and entry.get("like") not in models.MODELS}    # like: that model, used so
    assert all(entry.get("untiled") for entry in untiled.values()), untiled.keys()


def test_the_table_agrees_with_the_real_0_33_0_classes_and_detection():
    """benchmarks/results/overlay-eras.json `model_table` (python -m benchmarks validate model-table on the real
    0.33.0 tree): every model the node tiles, built at full size by the release's own class and put through its model
    detection, is what the table says (supported_models class, image_model, width, latent, patch), and a parameter
    count the table cites from there is the counted one."""
    import json
    import re
    report = json.loads((REPO / "benchmarks" / "results" / "overlay-eras.json").read_text())["model_table"]
    rows = report["models"]
    assert report["comfyui"] == "0.33.0"
    assert {row["model"] for row in rows if row["agrees"]} == set(models.MODELS)
    for key, entry in models.TABLE_ENTRIES.items():
        cited = re.match(r"counted: overlay-eras.json model_table.models\[(\d+)\]", entry.get("parameters_source", ""))
        if cited:
            row = rows[int(cited.group(1))]
            assert (row["model"], row["found"]["parameters"]) == (key, entry["parameters"])


def test_the_node_module_and_the_planner_import_no_torch():
    import subprocess
    code = ("import sys; sys.path.insert(0, 'overlays'); import comfyui_fused_dit.tiled_sampling, "
            "fused_dit.tiling.plan, fused_dit.tiling.models; assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def test_the_runs_bar_counts_tiles_times_steps():
    """One bar over the run: a model call's tiles count from its step (the sigma nearest its timestep) on."""
    class Bar:
        values: list = []

        def update_absolute(self, value):
            self.values.append(value)

    layout = plan.plan(40, 40, 16, 4)
    run = wrappers.Run(plan.Settings(128, 32, 2, layout, 1, ()), torch.tensor([1.0, 0.5, 0.0]), False,
                       torch.device("cpu"), bar=Bar())
    assert run.step_of(torch.tensor([0.5, 0.5])) == 1 and run.step_of(torch.tensor([1.0])) == 0
    run.advance(2, layout.count, 0)
    run.advance(layout.count, layout.count, 1)
    assert run.bar.values == [2, 2 * layout.count]


# ------------------------------------------------------------------------------ seamless with the node's defaults
def _through_the_node(x: torch.Tensor, model_fn, key: str = "flux-dev") -> torch.Tensor:
    """`model_fn` on the canvas `x` as the Tiled Sampling node runs it with its defaults on the model `key` (a patch
    of the node as a user drops it in: no input set), through its CALC_COND_BATCH wrapper."""
    node = node_pack.NODE_CLASS_MAPPINGS["TiledSampling"]()
    (patched,) = node.patch(BUILT[key].patcher())
    (wrapper,) = patched.wrappers["calc_cond_batch"][wrappers.KEY]
    (out,) = wrapper(lambda m, conds, x_in, t, o: [model_fn(x_in) for _ in conds], None, [[{}]], x,
                     torch.full((x.shape[0],), 0.5), {})
    return out


def _ulps(got: torch.Tensor, want: torch.Tensor) -> float:
    """The largest difference in units of the last place of fp32 at the reference's magnitude."""
    ulp = torch.finfo(torch.float32).eps * want.abs().clamp_min(torch.finfo(torch.float32).tiny)
    return float(((got - want).abs() / ulp).max())


def _canvas(key: str, tiles: float, seed: int = 0) -> torch.Tensor:
    """A latent of model `key` (5-D with frames for a video model) about `tiles` of its planned tiles a side."""
    built, shape = BUILT[key], models.MODELS[key]
    side = shape.tile_px // shape.vae_factor
    height, width = int(side * tiles), int(side * tiles) - 2 * shape.patch
    frames = (built.frames,) if built.frames else ()
    return torch.randn(1, built.channels, *frames, height, width, generator=torch.Generator().manual_seed(seed))


def _conv(key: str, kernel: int):
    """A fixed kernel x kernel convolution over the model's latent channels (per frame for a video model)."""
    channels = BUILT[key].channels
    conv = torch.nn.Conv2d(channels, channels, kernel, padding=kernel // 2, bias=False)
    if not BUILT[key].frames:
        return conv

    def per_frame(x: torch.Tensor) -> torch.Tensor:          # (b, c, f, h, w): the frames as a batch of images
        b, c, f, h, w = x.shape
        out = conv(x.permute(0, 2, 1, 3, 4).reshape(b * f, c, h, w))
        return out.reshape(b, f, c, h, w).permute(0, 2, 1, 3, 4)
    return per_frame


@pytest.mark.parametrize("kernel", [3, 5])
def test_a_local_convolution_tiles_to_the_untiled_result_with_the_nodes_defaults(kernel):
    """A fixed 3x3 or 5x5 convolution as the model (zero padding at every tile's edge): the node's planned margin
    gives the edge pixels no weight, so the tiled canvas is the untiled one to fp32 rounding."""
    torch.manual_seed(kernel)
    conv = torch.nn.Conv2d(16, 16, kernel, padding=kernel // 2, bias=False)
    x = torch.randn(1, 16, 300, 260)                    # 2400 x 2080 px: 3 x 3 tiles of 1024 px
    with torch.no_grad():
        whole = conv(x)
        tiled = _through_the_node(x, conv)
    assert _ulps(tiled, whole.double().float()) <= 8, _ulps(tiled, whole)


@pytest.mark.parametrize("key", list(BUILT))
def test_each_model_tiles_a_local_convolution_exactly_with_the_nodes_defaults(key):
    """Every model the node tiles, at its own latent channels, factor, patch and tile (a video model with every
    frame): a 3x3 convolution (a reach of one latent pixel, within the planned margin of each model's grid) gives
    the untiled result to fp32 rounding."""
    torch.manual_seed(3)
    conv = _conv(key, 3)
    x = _canvas(key, 2.5)
    with torch.no_grad():
        whole = conv(x)
        tiled = _through_the_node(x, conv, key)
    assert _ulps(tiled, whole.double().float()) <= 8, (key, _ulps(tiled, whole))


@pytest.mark.parametrize("key", list(BUILT))
def test_identity_and_one_tile_with_the_nodes_defaults(key):
    """Identity within 2 ulp over several tiles; a canvas of one planned tile calls the model once, bit for bit."""
    x = _canvas(key, 2.5)
    assert _ulps(_through_the_node(x, lambda t: t.clone(), key), x) <= 2
    one = _canvas(key, 1, seed=1)[..., :, :one_side(key)]
    assert torch.equal(_through_the_node(one, lambda t: t * 3, key), one * 3)


def one_side(key: str) -> int:
    shape = models.MODELS[key]
    return shape.tile_px // shape.vae_factor
