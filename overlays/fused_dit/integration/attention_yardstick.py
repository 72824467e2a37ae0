"""The `fp8` attention mode's yardstick (issue 38): SageAttention 2's measured error, per band of shapes.

A lossy kernel may be chosen automatically only where its error is at most SageAttention 2's at that shape and on
those inputs: the accuracy users of ComfyUI's `--use-sage-attention` already accept. Where SageAttention 2 runs in
the user's environment the mode measures it on the call itself (integration/attention_fp8.py); elsewhere it reads
this table (`attention_yardstick.json` beside this package's modules, data only), which
`python -m benchmarks attention-kernels --from RUN --write-table` derives from a device run with SageAttention 2 in
it. Per band (a head dim and a range of key lengths around one measured shape):
- `sage2_error`: SageAttention 2's relative error against fp32 attention on each input kind the benchmark draws
  (Gaussian, DiT-like);
- `within`: the pack's lossy kernels whose error there was at most SageAttention 2's on every kind.
A lossy kernel runs in a band only where the band lists it and its error on the call's own inputs (against the exact
output) is at most `limit()`, the largest of SageAttention 2's recorded errors: the benchmark's inputs stand in for
the model's, the call's own error guards against inputs worse than both. A shape in no band, or no readable table,
keeps the mode's earlier rule (integration/attention_fp8.py). Each message cites the band's results key
(families.Evidence), never a figure.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from .. import state
from ..families import Evidence

TABLE_FILE = Path(__file__).resolve().parent.parent / "attention_yardstick.json"
UNREADABLE_LINE = "Fused DiT Ops: attention fp8: no readable yardstick table (%s); the earlier rule holds everywhere"

# the table in use: {"path": Path} (tests and the benchmark point it elsewhere with use_table)
_current: dict = {"path": TABLE_FILE}


@dataclass(frozen=True)
class Band:
    """One band of the table: SageAttention 2's errors at one measured shape, and the key lengths it covers."""
    shape: str
    head_dim: int
    min_tokens: int
    max_tokens: int
    sage2_error: tuple[tuple[str, float], ...]      # (input kind, relative error), as measured
    within: tuple[str, ...]                         # the benchmark's rows (fp8, cudnn_fp8) at most that error
    evidence: Evidence

    def limit(self) -> float:
        """The largest error SageAttention 2 showed in this band (the call's own error must be at most this)."""
        return max(error for _, error in self.sage2_error)

    def admits(self, row: str) -> bool:
        return row in self.within

    def covers(self, head_dim: int, tokens: int) -> bool:
        return head_dim == self.head_dim and self.min_tokens <= tokens <= self.max_tokens


def use_table(path: Path | None = None) -> None:
    """Read the table from `path` from now on (None: the shipped one)."""
    _current["path"] = TABLE_FILE if path is None else Path(path)
    _table.cache_clear()


@functools.lru_cache(maxsize=4)
def _table(path: Path) -> tuple[Band, ...] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        file = (data.get("evidence") or {}).get("file")
        bands = tuple(Band(str(b["shape"]), int(b["head_dim"]), int(b["min_tokens"]), int(b["max_tokens"]),
                           tuple((str(kind), float(error)) for kind, error in sorted(b["sage2_error"].items())),
                           tuple(str(row) for row in b["within"]), Evidence(str(file), str(b["evidence"])))
                      for b in data["bands"])
        if bands and not file:
            raise ValueError("bands without the results file they came from")
        if any(not band.sage2_error for band in bands):
            raise ValueError("a band without SageAttention 2's error")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        state.say_once(UNREADABLE_LINE, f"{type(exc).__name__}: {exc}")
        return None
    return bands


def bands() -> tuple[Band, ...]:
    """The bands of the table in use (none where it has none or cannot be read)."""
    return _table(_current["path"]) or ()


def band_for(head_dim: int, tokens: int) -> Band | None:
    """The band covering attention with this head dim over this many keys, or None."""
    return next((band for band in bands() if band.covers(head_dim, tokens)), None)
