"""The budget's tables read into the records of applier/budget/records.py: applier/data/{gpus,efficiency}.toml, and
the models from the overlay pack's model table (overlays/fused_dit/models.json), the one table the Tiled Sampling
node and Fused DiT Ops read too.

The files ship inside the package (setup.cfg package_data, the pack with applier's resources); a key missing or of
the wrong type is a RefusedError naming the file and the key (a broken install, never a traceback).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from applier.budget.records import (GIB, BlockGroup, BudgetData, Efficiency, Era, Gpu, Linear, Measured, Model,
                                    RouteStages, Vae, VaeLayers)
from applier.errors import RefusedError
from applier.resources import OVERLAYS_DIR, PACK_PACKAGE

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DATA_DIR = Path(__file__).resolve().parent.parent / "data"   # applier/data/
FILES = ("gpus.toml", "efficiency.toml")
MODELS_TABLE = OVERLAYS_DIR / PACK_PACKAGE / "models.json"     # the pack's one model table
TOKEN_SETS = ("all", "image", "text")


class BudgetDataError(RefusedError):
    """A budget table is missing or malformed."""


class _Reader:
    """Typed access to one table of one file, naming both in every error."""

    def __init__(self, table: dict, where: str):
        self.table, self.where = table, where

    def get(self, key: str, kind, default=...):
        if key not in self.table:
            if default is not ...:
                return default
            raise BudgetDataError(f"{self.where}: key {key!r} is missing",
                                  hint="reinstall applier (the budget's tables ship with it)")
        value = self.table[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if float in kinds and type(value) is int:
            value = float(value)
        if type(value) not in kinds:
            raise BudgetDataError(f"{self.where}: key {key!r} is {type(value).__name__}, expected "
                                  f"{' or '.join(k.__name__ for k in kinds)}")
        return value

    def sub(self, key: str) -> "_Reader":
        return _Reader(self.get(key, dict), f"{self.where}.{key}")


def _read(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BudgetDataError(f"the budget's table {path} is missing",
                              hint="reinstall applier (the budget's tables ship with it)") from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise BudgetDataError(f"{path}: not valid TOML ({exc})") from None


def _read_models(path: Path) -> dict:
    try:
        table = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BudgetDataError(f"the model table {path} is missing",
                              hint="reinstall applier (its node pack ships it)") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BudgetDataError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(table, dict) or not all(isinstance(row, dict) for row in table.values()):
        raise BudgetDataError(f"{path}: expected an object of model entries")
    return table


def _like(table: dict, key: str, row: dict, where: str) -> dict:
    """An entry that is another model used another way ("like": that model's key; Qwen-Image-Edit is Qwen-Image
    with reference images): that model's entry with this one's keys over it."""
    like = row.get("like")
    if like is None:
        return row
    base = table.get(like)
    if not isinstance(base, dict) or "like" in base:
        raise BudgetDataError(f"{where}[{key}]: like {like!r} is not an entry of its own")
    return {**base, **row}


def _gpu(key: str, row: _Reader) -> Gpu:
    major, _, minor = row.get("compute_capability", str).partition(".")
    fp8 = row.get("fp8_tflops", float, None)
    int8 = row.get("int8_tops", float, None)
    return Gpu(key, row.get("name", str), tuple(n.lower() for n in row.get("names", list)),
               (int(major), int(minor or 0)), row.get("memory_mib", int), row.get("memory_published", str),
               row.get("bandwidth_gbs", float), row.get("bf16_tflops", float), fp8, int8,
               row.get("host_link_gbs", float), row.get("source", str))


def _group(row: _Reader, defaults: dict) -> BlockGroup:
    linears = []
    for item in row.get("linears", list):
        if not (isinstance(item, list) and len(item) == 3 and type(item[0]) is int and type(item[1]) is int
                and item[2] in TOKEN_SETS):
            raise BudgetDataError(f"{row.where}: a linear must be [in, out, one of {', '.join(TOKEN_SETS)}], "
                                  f"got {item!r}")
        linears.append(Linear(item[0], item[1], item[2]))
    attention = []
    for item in row.get("attention", list):
        if not (isinstance(item, list) and len(item) == 2 and all(s in TOKEN_SETS for s in item)):
            raise BudgetDataError(f"{row.where}: an attention entry must be [query set, key set], got {item!r}")
        attention.append((item[0], item[1]))
    stream = row.get("stream", str)
    if stream not in ("all", "image"):
        raise BudgetDataError(f"{row.where}: stream must be 'all' or 'image', got {stream!r}")
    return BlockGroup(row.get("name", str), row.get("count", int), stream, row.get("width", int), tuple(linears),
                      tuple(attention), row.get("elementwise_passes", float),
                      row.get("heads", int, defaults["heads"]), row.get("head_dim", int, defaults["head_dim"]),
                      row.get("downsample", int, 1), row.get("weight_copies", int, 1), row.get("fp8", bool, True))


def _model(key: str, row: _Reader) -> Model:
    vae = row.sub("vae")
    groups = tuple(_group(_Reader(g, f"{row.where}.group[{i}]"),
                          {"heads": row.get("heads", int), "head_dim": row.get("head_dim", int)})
                   for i, g in enumerate(row.get("group", list)))
    if not groups:
        raise BudgetDataError(f"{row.where}: a model needs at least one [[{key}.group]]")
    fp8_path = row.get("fp8_path", str)
    if fp8_path not in ("blocks", "generic"):
        raise BudgetDataError(f"{row.where}: fp8_path must be 'blocks' or 'generic', got {fp8_path!r}")
    video = row.get("video", bool)
    stored = row.get("stored_weights", str, "bf16")
    if stored not in ("bf16", "fp8"):
        raise BudgetDataError(f"{row.where}: stored_weights must be 'bf16' or 'fp8', got {stored!r}")
    sources = {k: v for k, v in row.table.items() if k == "source" or k.endswith("_source")}
    return Model(key, row.get("name", str), tuple(a.lower() for a in row.get("aliases", list)),
                 row.get("parameters", int), row.get("hidden", int), row.get("patch", int),
                 row.get("text_tokens", int), row.get("activation_widths", float), row.get("steps", int),
                 row.get("cfg_forwards", int), row.get("frames", int) if video else 1,
                 tuple(row.get("tile_px", list)), row.get("overlay_blocks", bool), fp8_path, video,
                 Vae(vae.get("factor", int), vae.get("temporal_factor", int), vae.get("channels", int),
                     vae.get("decode_bytes_per_pixel", float), vae.get("decode_bytes_per_pixel_video", float, None),
                     vae.get("source", str)),
                 groups, sources, row.get("reference_images", int, 0), row.get("reference_px", int, 0),
                 row.get("like", str, key), stored == "fp8")


def _efficiency(row: _Reader) -> Efficiency:
    return Efficiency(row.get("value", float), row.get("from", str))


def _attention_efficiency(row: _Reader) -> Efficiency:
    """An attention backend: its value at `tokens`, and `by_tokens` points [{tokens, value, from}] where measured."""
    points = []
    for i, item in enumerate(row.get("by_tokens", list, [])):
        point = _Reader(item, f"{row.where}.by_tokens[{i}]")
        tokens, value = point.get("tokens", int), point.get("value", float)
        if tokens <= 0 or not 0 < value <= 1:
            raise BudgetDataError(f"{point.where}: tokens must be positive and value a fraction of peak")
        points.append((tokens, value, point.get("from", str)))
    tokens = row.get("tokens", int, None)
    if points and tokens is None:
        raise BudgetDataError(f"{row.where}: by_tokens needs the tokens `value` was measured at")
    return Efficiency(row.get("value", float), row.get("from", str), tokens, tuple(points))


def _route(row: _Reader, gpus: dict) -> RouteStages:
    """efficiency.toml [route]: the tiled route's stages around the refinement, measured on their own GPU."""
    gpu = row.get("measured_on", str)
    if gpu not in gpus:
        raise BudgetDataError(f"{row.where}: measured_on {gpu!r} is not a row of gpus.toml")
    vae, tiles, host = row.sub("vae"), row.sub("vae_tiles"), row.sub("host")
    mult = vae.get("ch_mult", list)
    if not mult or not all(type(m) is int and m > 0 for m in mult):
        raise BudgetDataError(f"{vae.where}: ch_mult must be positive integers, got {mult!r}")
    layers = VaeLayers(vae.get("ch", int), tuple(mult), vae.get("num_res_blocks", int), vae.get("z_channels", int),
                       vae.get("image_channels", int), vae.get("source", str))
    return RouteStages(gpu, tuple(vae.get("models", list)), layers, tiles.get("tile_px", int),
                       tiles.get("overlap_px", int), tiles.get("source", str), _efficiency(row.sub("encode")),
                       _efficiency(row.sub("decode")), host.get("cores", int), host.get("source", str),
                       _efficiency(row.sub("upscale")), _efficiency(row.sub("save")))


def _measured(table: dict, where: str, gpus: dict) -> Measured:
    top = _Reader(table, where)
    gpu = top.get("measured_on", str)
    if gpu not in gpus:
        raise BudgetDataError(f"{where}: measured_on {gpu!r} is not a row of gpus.toml")
    attention = top.sub("attention")
    backends = {name: _attention_efficiency(attention.sub(name)) for name in attention.table}
    projection = top.sub("projection").get("attention", str)
    if projection not in backends:
        raise BudgetDataError(f"{where}: projection.attention {projection!r} is not one of {', '.join(backends)}")
    eras = []
    for i, item in enumerate(top.get("era", list)):
        era = _Reader(item, f"{where}.era[{i}]")
        for backend in (era.get("stock_attention", str), era.get("stock_attention_windows", str)):
            if backend not in backends:
                raise BudgetDataError(f"{era.where}: attention backend {backend!r} is not measured")
        eras.append(Era(era.get("name", str), era.get("releases", str), era.get("stock_attention", str),
                        era.get("stock_attention_windows", str), era.get("attention_source", str),
                        _efficiency(era.sub("other")), _efficiency(era.sub("elementwise_factor")),
                        _efficiency(era.sub("host_gap_s"))))
    if not eras:
        raise BudgetDataError(f"{where}: no [[era]]")
    quantize, reserve, tiling = top.sub("fp8_quantize"), top.sub("reserve"), top.sub("tiling")
    vae_tiled, pillow = top.sub("vae_tiled"), top.sub("pillow")
    return Measured(gpu, _efficiency(top.sub("gemm_bf16")), _efficiency(top.sub("gemm_fp8")), _efficiency(quantize),
                    quantize.get("bytes_per_element", float), backends, projection, tuple(eras),
                    int(reserve.get("gib", float) * GIB), reserve.get("from", str), tiling.get("overlap_px", int),
                    tiling.get("source", str), vae_tiled.get("tile_px", int), vae_tiled.get("overlap_px", int),
                    vae_tiled.get("source", str), pillow.get("max_image_pixels", int), pillow.get("source", str),
                    _route(top.sub("route"), gpus) if "route" in table else None,
                    tuple(k for k, g in gpus.items() if g.compute_capability == gpus[gpu].compute_capability))


def load_budget_data(folder: Path = DATA_DIR, models_path: Path = MODELS_TABLE) -> BudgetData:
    """The tables of `folder` (default: the package's own) and the model table (default: the pack's) as
    BudgetData."""
    gpus_path, measured_path = (folder / name for name in FILES)
    gpus = {key: _gpu(key, _Reader(row, f"{gpus_path.name}[{key}]")) for key, row in _read(gpus_path).items()}
    table = _read_models(models_path)
    models = {key: _model(key, _Reader(_like(table, key, row, models_path.name), f"{models_path.name}[{key}]"))
              for key, row in table.items()}
    return BudgetData(gpus, models, _measured(_read(measured_path), measured_path.name, gpus))
