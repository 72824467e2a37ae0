"""Per Linear call: whether FP8 can beat ComfyUI's bf16 Linear for the rows it gets, from a measured table.

An FP8 Linear pays, beside its GEMM, the activation's quantisation and, where the weight is quantised for this
call (DynamicVRAM's per-call codes), the weight's: reading 2 bytes and writing 1 per parameter before the GEMM
reads it again. Against a bf16 GEMM that reads each parameter once, that only pays off when the GEMM has enough
rows (M = x.numel() // K) to be bound by its arithmetic rather than by its weight; below that, and at any size
where the host's launches dominate, the stock forward is faster. Qwen-Image's text stream (few rows) and
Flux-dev at 1024 under DynamicVRAM were measured slower with FP8 for that reason.

The table (`fp8_linear_shapes.json` beside this package's modules, data only) gives, per mechanism, the fewest rows
from which FP8 was measured at least as fast as bf16, per band of K:
- `per_call`: the weight quantised for this call (families.PER_CALL_CODES);
- `cached`: codes kept between calls (families.CACHED_CODES, RESIDENT_CODES) while the bf16 weight is there too,
  so declining costs nothing but the FP8 gain.
Mechanisms that hold no bf16 weight on the GPU (codes in the weights' place, weights in host memory) never decline
by shape: their stock forward would be slower still. `python -m benchmarks fp8-linear-shapes --write-table` writes
the table from its measurements, with the results key it came from; the decline line cites that key
(families.Evidence) and never a figure. A band whose `rows` is null: FP8 never won there, every call declines.
An unreadable table declines nothing (the FP8 path as before), said once.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

from .. import dispatch
from ..families import Evidence
from ..ops.fp8_linear import OP

TABLE_FILE = Path(__file__).resolve().parent.parent / "fp8_linear_shapes.json"
PER_CALL, CACHED = "per_call", "cached"
MECHANISMS = (PER_CALL, CACHED)
STOCK = "stock forward (shape)"

# the table in use: {"path": Path} (tests and the benchmark point it elsewhere with use_table)
_current: dict = {"path": TABLE_FILE}


def use_table(path: Path | None = None) -> None:
    """Read the table from `path` from now on (None: the shipped one)."""
    _current["path"] = TABLE_FILE if path is None else Path(path)
    _table.cache_clear()
    rows_needed.cache_clear()


@functools.lru_cache(maxsize=4)
def _table(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        evidence = Evidence(data["evidence"]["file"], data["evidence"]["key"])
        bands = {mechanism: tuple(sorted((int(band["max_k"]), None if band["rows"] is None else int(band["rows"]))
                                         for band in data["min_rows"][mechanism]))
                 for mechanism in MECHANISMS}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        dispatch.say_once(OP, "FP8 at every shape", f"no readable FP8 shape table ({type(exc).__name__}: {exc})")
        return None
    return {"evidence": evidence, "bands": bands, "measured": bool(data.get("measured"))}


def table() -> dict | None:
    """The table in use: {"evidence": Evidence, "bands": {mechanism: ((max_k, rows or None), ...)}, "measured"}."""
    return _table(_current["path"])


@functools.lru_cache(maxsize=1024)
def rows_needed(mechanism: str, k: int) -> tuple[int | None, int | None]:
    """(the fewest rows from which FP8 runs for this mechanism and K, or None: never; the band's max_k, or None
    without a band). K above every band takes the last band's."""
    current = table()
    bands = () if current is None else current["bands"].get(mechanism, ())
    if not bands:
        return 0, None
    for max_k, rows in bands:
        if k <= max_k:
            return rows, max_k
    return bands[-1][1], bands[-1][0]


def decline_reason(mechanism: str, rows: int, k: int) -> str | None:
    """Why FP8 must not run for a call of `rows` rows and K `k` under `mechanism` (None: it may). The reason names
    the mechanism and K's band, not the rows, so it is said once per band."""
    needed, max_k = rows_needed(mechanism, k)
    if needed is not None and rows >= needed:
        return None
    current = table()
    band = f"K up to {max_k}" if k <= max_k else f"K above the table's bands (the last, up to {max_k}, taken)"
    what = ("the weight quantised for each call" if mechanism == PER_CALL else "FP8 codes kept between calls")
    verdict = "never beat" if needed is None else "did not beat, with this few rows,"
    pending = "" if current["measured"] else " (a conservative table from whole generations, awaiting per-shape " \
                                              "measurement)"
    return (f"FP8 with {what} {verdict} ComfyUI's bf16 Linear at {band}{pending}: this Linear runs stock for such "
            f"calls; {current['evidence'].cite()}")
