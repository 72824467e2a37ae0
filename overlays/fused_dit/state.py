"""The pack's process-wide state, in one place: the once-only log, the counters that date caches, and the variants.

Everything the pack remembers across models and calls lives in `STATE`, one `PackState`:
- `said`: what the once-only log (`say_once`) has written. Every "said once" line of the pack, from the registry's
  choice per family to a backend's reason for one op, goes through it: one memory, one logger (`fused_dit`).
- `verdict_epoch`: bumped whenever a fingerprint verdict could change (verified sets added or removed, caches
  cleared); install plans and verdict caches are keyed by it.
- `enable_epoch`: bumped by every `enable`; it stands in for inference tensors' edit counters (fp8_modules).
- `variants`: the verified variants (variants.json as shipped, plus any set added at run time by `add_verified`),
  loaded on first use; `variants_problem` says why the shipped file could not be read (then no variant runs).
- the caches whose entries depend on those: fingerprints of live objects, verdicts, the FP8 backend choice per
  device, the FP8 modules by slot number, and why the direct kernel launcher was given up.

Memoisation that depends on nothing here stays beside the code it speeds up (launch's compiled kernels, the cast
seams per class, seams' replacement functions). Tests reset what they touch through the functions below.
"""
from __future__ import annotations

import dataclasses
import logging
import weakref
from dataclasses import dataclass, field
from types import MappingProxyType

from . import variants

LOG = logging.getLogger("fused_dit")


@dataclass
class PackState:
    said: set = field(default_factory=set)                  # (message, args) the once-only log wrote
    verdict_epoch: int = 0
    enable_epoch: int = 0
    next_fp8_slot: int = 0
    variants: dict | None = None                            # name -> variants.Variant, None until loaded
    variants_problem: str | None = None
    fingerprints: dict = field(default_factory=dict)        # id(obj) -> (obj, sha256 or None, why none)
    verdicts: dict = field(default_factory=dict)            # (variant, objects, releases) -> variants.Match
    linear_verdicts: dict = field(default_factory=dict)     # Linear op class -> variants.Match
    fp8_choices: dict = field(default_factory=dict)         # (op, device, environment) -> dispatch.Choice
    fp8_modules_by_slot: weakref.WeakValueDictionary = field(default_factory=weakref.WeakValueDictionary)
    launch_given_up: list = field(default_factory=list)     # why launch.py stopped calling launchers directly
    fp8_prepared_streams: set = field(default_factory=set)  # (device, stream, dtype) fp8_linear.prepare_stream did


STATE = PackState()


# ------------------------------------------------------------------------------------------------ the once-only log
def say_once(message: str, *args, level: int = logging.INFO) -> bool:
    """Log `message % args` the first time this (message, args) comes up in this process; True when it was said."""
    key = (message, args)
    if key in STATE.said:
        return False
    STATE.said.add(key)
    LOG.log(level, message, *args)
    return True


def forget_said() -> None:
    """Let every once-only line be said again (tests, and checkers that collect one run's lines)."""
    STATE.said.clear()


class SaidLines:
    """The argument tuples said once under one message: iterable, true when any, `clear()` forgets just those."""

    def __init__(self, message: str):
        self.message = message

    def _keys(self) -> list:
        return [key for key in STATE.said if key[0] == self.message]

    def __iter__(self):
        return iter([key[1] for key in self._keys()])

    def __len__(self) -> int:
        return len(self._keys())

    def __bool__(self) -> bool:
        return bool(self._keys())

    def clear(self) -> None:
        STATE.said.difference_update(self._keys())


# ------------------------------------------------------------------------------------------------ verified variants
def all_variants() -> dict:
    """The variants (loaded once), with any fingerprint sets added by add_verified. An unreadable variants.json (an
    edited install) gives none: every family stays stock, never an error in a prompt."""
    if STATE.variants is None:
        try:
            STATE.variants = variants.load()
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            STATE.variants_problem = f"{variants.DATA.name} unreadable ({type(exc).__name__}: {exc})"
            STATE.variants = {}
    return STATE.variants


def unknown_variant(name: str) -> variants.Match:
    """The verdict for a variant the data does not hold."""
    return variants.Match(name, None, STATE.variants_problem or f"{variants.DATA.name} has no variant {name}")


def add_verified(variant: str, label: str, fingerprints: dict) -> None:
    """Accept one more set of fingerprints for a variant under `label` (a fixture era in tests, as a maintainer
    records a release); the Variant is replaced, never edited."""
    spec = all_variants()[variant]
    extra = set(fingerprints) - set(spec.depends_on)
    if extra:
        raise ValueError(f"{variant} does not depend on {sorted(extra)}")
    verified = MappingProxyType({**spec.verified_on, label: MappingProxyType(dict(fingerprints))})
    STATE.variants[variant] = dataclasses.replace(spec, verified_on=verified)
    clear_verdicts()


def remove_verified(variant: str, label: str) -> None:
    spec = all_variants()[variant]
    verified = MappingProxyType({name: prints for name, prints in spec.verified_on.items() if name != label})
    STATE.variants[variant] = dataclasses.replace(spec, verified_on=verified)
    clear_verdicts()


def reload_variants() -> None:
    """Read variants.json again on next use, dropping sets added at run time (tests of an edited install)."""
    STATE.variants, STATE.variants_problem = None, None
    clear_verdicts()


def clear_verdicts() -> None:
    """Forget fingerprint verdicts; install plans made before are stale (they key on verdict_epoch)."""
    STATE.verdict_epoch += 1
    STATE.verdicts.clear()
    STATE.linear_verdicts.clear()
