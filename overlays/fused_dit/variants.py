"""The overlay's variants, the ComfyUI releases each was verified on, and whether given code matches one (no torch).

A variant is one way the overlay reaches into ComfyUI: a block forward written for one era (`block_forward`) or an
op replaced where ComfyUI calls it (`op_seam`). `variants.json` (data only: names, ComfyUI versions, sha256s) lists
for each the upstream code it depends on, as dependency keys, and for each release it was verified on the
fingerprints (`fingerprint.py`) of that code there. A dependency key names the code from where the model's blocks
come from: `{blocks}:DoubleStreamBlock.forward` is that method in the file that defines the model's block classes,
`comfy/ops.py:disable_weight_init.Linear.forward` one in a fixed file. At run time the integration layer finds the
same code through the loaded objects (integration/eras.py); `applier overlay check` finds it in the files.

Code matches a variant when every dependency it could find has the fingerprint one verified release recorded; the
match names that release. Anything else is no match, with the first differing dependencies as the reason: the
family then stays stock. A variant can also be verified but off by default (`default_on: false`, with the measured
reason in `off_because`): it runs only when named in the environment variable FUSED_DIT_SEAMS.

This module is pure (no torch, no state): `applier overlay check` loads it by path. The variants the running pack
uses, with the fingerprint sets tests and maintainers add at run time, are held in `state.py`; a Variant is never
edited, only replaced.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

DATA = Path(__file__).with_name("variants.json")
SWITCH_ON = "FUSED_DIT_SEAMS"             # comma-separated variants to run although they are off by default
BLOCK_FORWARD = "block_forward"
OP_SEAM = "op_seam"


@dataclass(frozen=True)
class Variant:
    name: str
    kind: str                                 # BLOCK_FORWARD | OP_SEAM
    families: tuple[str, ...]                 # the node's op families it serves
    depends_on: tuple[str, ...]               # dependency keys
    verified_on: dict = field(hash=False)     # ComfyUI version (or fixture name) -> {dependency key: sha256}, read-only
    about: str = ""
    default_on: bool = True                   # False: runs only when named in FUSED_DIT_SEAMS (off_because says why)
    off_because: str = ""

    def switched_off(self, environ=None) -> str | None:
        """Why this variant does not run even where its code matches (off by default and not asked for), or None."""
        asked = (environ if environ is not None else os.environ).get(SWITCH_ON, "")
        if self.default_on or self.name in {name.strip() for name in asked.split(",")}:
            return None
        return f"off by default: {self.off_because}"

    @property
    def verified_versions(self) -> list[str]:
        return list(self.verified_on)


@dataclass(frozen=True)
class Match:
    """The verdict on one variant for one body of code."""
    variant: str
    verified_on: str | None                   # the release whose fingerprints matched; None: no match
    reason: str                               # why it matched or why not, one line

    @property
    def matched(self) -> bool:
        return self.verified_on is not None


def load(path: Path | None = None) -> dict[str, Variant]:
    raw = json.loads(Path(path or DATA).read_text(encoding="utf-8"))
    return {name: Variant(name=name, kind=spec["kind"], families=tuple(spec["families"]),
                          depends_on=tuple(spec["depends_on"]),
                          verified_on=MappingProxyType({v: MappingProxyType(dict(prints))
                                                        for v, prints in spec["verified_on"].items()}),
                          about=spec.get("about", ""), default_on=spec.get("default_on", True),
                          off_because=spec.get("off_because", ""))
            for name, spec in raw["variants"].items()}


def match(spec: Variant, found: dict[str, str | None], missing_reason: dict[str, str] | None = None,
          prefer: str | None = None) -> Match:
    """Whether the fingerprints `found` (dependency key -> sha256, or None where it has none) match one release.

    Keys absent from `found` are not used by this model (e.g. a model without single-stream blocks) and are not
    compared; `missing_reason` says why a key with None has no fingerprint. Where several releases match (the same
    code shipped in several), `prefer` (the release the code comes from, when known) is named.
    """
    missing_reason = missing_reason or {}
    used = [key for key in spec.depends_on if key in found]
    if not used:
        return Match(spec.name, None, "none of the code it depends on is in this model")
    ranked = sorted(spec.verified_on.items(), key=lambda item: item[0] != prefer)
    best: tuple[int, str, list[str]] | None = None
    for version, prints in ranked:
        differing = [key for key in used if found[key] is None or prints.get(key) != found[key]]
        if not differing:
            return Match(spec.name, version, f"code matches ComfyUI {version} as verified")
        if best is None or len(differing) < best[0]:
            best = (len(differing), version, differing)
    if best is None:
        return Match(spec.name, None, "no verified release recorded")
    _, version, differing = best
    listed = ", ".join(differing[:3]) + (f" and {len(differing) - 3} more" if len(differing) > 3 else "")
    unresolved = next((key for key in differing if found[key] is None), None)
    why = f" ({unresolved}: {missing_reason.get(unresolved, 'no source to fingerprint')})" if unresolved else ""
    verified = ", ".join(spec.verified_on)
    return Match(spec.name, None, f"code differs from every release it was verified on ({verified}); closest "
                                  f"{version}, differing: {listed}{why}")
