"""The tiled VAE that runs once (fused_dit.tiling.vae, the TiledVAEDecode / TiledVAEEncode nodes) and the PNG
written on every core (fused_dit.tiling.png, the SaveImagePNG node): a convolution-only VAE gives the untiled result
to fp32 rounding with the nodes' defaults, equal tiles go through the VAE together, and the PNG reads back with the
same pixels in Pillow at sizes that cross its block boundaries."""
from __future__ import annotations

import io
import sys
import types
import zlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from PIL import Image

import comfyui_fused_dit as node_pack
from fused_dit import state
from fused_dit.tiling import png, vae as tiled_vae

NODE_DEFAULTS = {name: spec[1]["default"] for name, spec in node_pack.tiled_vae.TILE_INPUTS.items()}


class ConvDecoder(torch.nn.Module):
    """A VAE's shape without its attention: convolutions and 2x upsamplings (x8), reach under 32 image pixels."""

    def __init__(self, latent=4):
        super().__init__()
        torch.manual_seed(0)
        self.convs = torch.nn.ModuleList([torch.nn.Conv2d(latent, 8, 3, padding=1), torch.nn.Conv2d(8, 8, 3, padding=1),
                                          torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.Conv2d(8, 3, 3, padding=1)])
        self.down = torch.nn.ModuleList([torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 8, 3, padding=1),
                                         torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.Conv2d(8, latent, 3, padding=1)])
        self.calls = []

    def decode(self, z):
        self.calls.append(tuple(z.shape))
        x = self.convs[0](z)
        for conv in self.convs[1:]:
            x = conv(torch.nn.functional.interpolate(x, scale_factor=2, mode="nearest"))
        return x

    def encode(self, x):
        self.calls.append(tuple(x.shape))
        for conv in self.down[:-1]:
            x = torch.nn.functional.avg_pool2d(conv(x), 2)
        return self.down[-1](x)


class FakeVAE:
    """comfy.sd.VAE's attributes and methods that the one pass uses (a 2-D VAE of factor 8)."""

    def __init__(self, latent_dim=2):
        self.first_stage_model = ConvDecoder()
        self.latent_dim, self.device, self.output_device = latent_dim, torch.device("cpu"), torch.device("cpu")
        self.vae_dtype = torch.float32
        self.process_input = lambda image: image * 2.0 - 1.0
        self.process_output = lambda image: image.add_(1.0).div_(2.0).clamp_(0.0, 1.0)
        self.memory_used_decode = lambda shape, dtype: shape[2] * shape[3] * 64 * 100
        self.memory_used_encode = lambda shape, dtype: shape[2] * shape[3] * 100
        self.stock = []

    def spacial_compression_decode(self):
        return 8

    def spacial_compression_encode(self):
        return 8

    def vae_output_dtype(self):
        return torch.float32

    def vae_encode_crop_pixels(self, pixels):
        return pixels[:, :pixels.shape[1] // 8 * 8, :pixels.shape[2] // 8 * 8]

    def decode_tiled(self, latent, **kwargs):
        self.stock.append(kwargs)
        return torch.zeros(1, 8, 8, 3)

    def untiled_decode(self, latent):
        with torch.inference_mode():
            return self.process_output(self.first_stage_model.decode(latent)).movedim(1, -1)

    def untiled_encode(self, pixels):
        with torch.inference_mode():
            return self.first_stage_model.encode(self.process_input(pixels.movedim(-1, 1)))


def _ulps(got, want):
    scale = want.abs().clamp_min(1e-3)          # pixels in 0..1 and latents near 1: rounding relative to that
    return float(((got - want).abs() / (torch.finfo(torch.float32).eps * scale)).max())


def test_a_convolution_only_decoder_gives_the_untiled_image_with_the_nodes_defaults():
    vae = FakeVAE()
    latent = torch.randn(1, 4, 300, 260)                     # 2400 x 2080 px: 3 x 3 tiles of 1024 px
    whole = vae.untiled_decode(latent)
    vae.first_stage_model.calls.clear()
    tiled = tiled_vae.decode(vae, latent, tiled_vae.TileSettings(**_settings()))
    assert tiled.shape == whole.shape == (1, 2400, 2080, 3)
    assert _ulps(tiled, whole) <= 8
    calls = vae.first_stage_model.calls
    assert len({c[1:] for c in calls}) == 1                      # every tile the same shape
    assert sum(c[0] for c in calls) == 9 and len(calls) < 9       # one pass, batched
    without_margin = tiled_vae.decode(vae, latent, tiled_vae.TileSettings(**_settings(overlap_px=8)))
    assert _ulps(without_margin, whole) > 8                       # the overlap's margin is what makes it exact


def _settings(**override):
    values = {"tile_px": NODE_DEFAULTS["tile_px"], "overlap_px": NODE_DEFAULTS["overlap_px"],
              "batch": NODE_DEFAULTS["tile_batch"]}
    return {**values, **override}


def test_a_convolution_only_encoder_gives_the_untiled_latent_with_the_nodes_defaults():
    vae = FakeVAE()
    pixels = torch.rand(1, 2400, 2084, 3)                     # cropped to 2080 as ComfyUI crops
    whole = vae.untiled_encode(vae.vae_encode_crop_pixels(pixels))
    tiled = tiled_vae.encode(vae, pixels, tiled_vae.TileSettings(**_settings()))
    assert tiled.shape == whole.shape == (1, 4, 300, 260)
    assert _ulps(tiled, whole) <= 8


def test_one_tile_is_the_vaes_own_call_and_progress_and_cancel_are_comfyuis():
    vae = FakeVAE()
    latent = torch.randn(2, 4, 64, 40)
    seen = []
    host = tiled_vae.Host(progress=lambda total: (lambda done: seen.append((done, total))))
    assert torch.equal(tiled_vae.decode(vae, latent, host=host), vae.untiled_decode(latent))
    assert seen == [(1, 1)]

    class Cancelled(Exception):
        pass

    def cancel():
        raise Cancelled

    with pytest.raises(Cancelled):
        tiled_vae.decode(vae, torch.randn(1, 4, 300, 260), host=tiled_vae.Host(check_cancel=cancel))


def test_the_batch_follows_comfyuis_estimate_of_a_tile_and_the_free_memory():
    vae = FakeVAE()
    latent = torch.randn(1, 4, 300, 260)
    per_tile = vae.memory_used_decode((1, 4, 128, 128), None)
    loaded = []
    host = tiled_vae.Host(load=loaded.append, free_memory=lambda: 2 * per_tile + 1)
    tiled_vae.decode(vae, latent, host=host)
    assert loaded == [per_tile * tiled_vae.TileSettings().max_batch]      # ComfyUI frees room for a full batch
    assert [c[0] for c in vae.first_stage_model.calls] == [2, 2, 2, 2, 1]


def test_the_nodes_batch_leaves_comfyuis_reserved_memory_free(monkeypatch):
    """--reserve-vram (ComfyUI's room for other programs, a desktop on a 24 GiB card) is not the batch's: the node's
    free memory is ComfyUI's figure less that reserve, so a reserve of all but one tile's estimate runs one tile at a
    time."""
    vae = FakeVAE()
    per_tile = vae.memory_used_decode((1, 4, 128, 128), None)
    vae.patcher = types.SimpleNamespace(get_free_memory=lambda device: 10 * per_tile)
    mm = types.ModuleType("comfy.model_management")
    mm.load_models_gpu = lambda *args, **kwargs: None
    mm.throw_exception_if_processing_interrupted = lambda: None
    utils = types.ModuleType("comfy.utils")
    utils.ProgressBar = lambda total: types.SimpleNamespace(update_absolute=lambda done: None)
    comfy = types.ModuleType("comfy")
    comfy.model_management, comfy.utils = mm, utils
    for name, module in (("comfy", comfy), ("comfy.model_management", mm), ("comfy.utils", utils)):
        monkeypatch.setitem(sys.modules, name, module)
    host = node_pack.tiled_vae._host(vae)
    assert host.free_memory() == 10 * per_tile                       # a ComfyUI without the reserve's getter
    mm.extra_reserved_memory = lambda: 9 * per_tile
    assert host.free_memory() == per_tile
    tiled_vae.decode(vae, torch.randn(1, 4, 300, 260), host=host)
    assert {c[0] for c in vae.first_stage_model.calls} == {1}


def test_a_video_vae_runs_comfyuis_own_tiled_decode_said_once(caplog, monkeypatch):
    state.forget_said()
    vae = FakeVAE(latent_dim=3)
    with caplog.at_level("INFO", logger="fused_dit"):
        node_pack.TiledVAEDecode().decode({"samples": torch.zeros(1, 4, 8, 8)}, vae, 1024, 128, 0)
        node_pack.TiledVAEDecode().decode({"samples": torch.zeros(1, 4, 8, 8)}, vae, 1024, 128, 0)
    assert vae.stock == [{"tile_x": 128, "tile_y": 128, "overlap": 16}] * 2
    assert sum("Tiled VAE" in r.getMessage() for r in caplog.records) == 1


# ---------------------------------------------------------------------------------------------------- the PNG
@settings(max_examples=40, deadline=None)
@given(st.integers(1, 70), st.integers(1, 70), st.sampled_from([1, 2, 3, 4]), st.integers(1, 4000),
       st.integers(0, 2 ** 32 - 1))
def test_the_png_reads_back_with_the_same_pixels_across_block_boundaries(height, width, channels, block, seed):
    pixels = np.random.default_rng(seed).integers(0, 256, size=(height, width, channels), dtype=np.uint8)
    pixels[: height // 2] //= 5                                   # some rows that compress, some that do not
    out = io.BytesIO()
    png.write(out, pixels, {"prompt": '{"1": {}}', "workflow": "\u00fc\u20ac"}, block_bytes=block)
    out.seek(0)
    image = Image.open(out)
    image.load()
    back = np.asarray(image).reshape(height, width, channels)
    assert np.array_equal(back, pixels)
    assert image.info["prompt"] == '{"1": {}}' and image.info["workflow"] == "\u00fc\u20ac"


def test_adler32_of_the_blocks_combines_to_the_whole():
    data = bytes(range(256)) * 300
    for cut in (0, 1, 65520, 65521, 70000, len(data)):
        assert png.adler32_combine(zlib.adler32(data[:cut]), zlib.adler32(data[cut:]), len(data) - cut) == \
            zlib.adler32(data)


def test_the_save_node_writes_save_images_pixels_names_and_metadata(tmp_path, monkeypatch):
    folder_paths = types.ModuleType("folder_paths")
    folder_paths.get_output_directory = lambda: str(tmp_path)
    folder_paths.get_save_image_path = lambda prefix, out, w, h: (str(tmp_path), prefix, 7, "", prefix)
    monkeypatch.setitem(sys.modules, "folder_paths", folder_paths)
    images = torch.rand(2, 37, 45, 3) * 1.2 - 0.1                 # values past 0..1 are clipped as SaveImage does
    answer = node_pack.SaveImagePNG().save_images(images, "route", prompt={"1": {"inputs": {}}},
                                                  extra_pnginfo={"workflow": {"nodes": []}})
    assert answer == {"ui": {"images": [{"filename": "route_00007_.png", "subfolder": "", "type": "output"},
                                        {"filename": "route_00008_.png", "subfolder": "", "type": "output"}]}}
    for index, name in enumerate(("route_00007_.png", "route_00008_.png")):
        with Image.open(tmp_path / name) as image:
            expected = np.clip(255. * images[index].numpy(), 0, 255).astype(np.uint8)     # SaveImage's pixels
            assert np.array_equal(np.asarray(image), expected)
            assert image.info["prompt"] == '{"1": {"inputs": {}}}' and image.info["workflow"] == '{"nodes": []}'
