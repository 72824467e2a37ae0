"""Authoring: a new variant's diff from a pristine upstream file and a hand-edited copy of it."""
from __future__ import annotations

import re

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from applier import diffengine
from applier.catalog.patch import Patch
from applier.catalog.patch_toml import load_patch
from applier.errors import RefusedError
from applier.store.fsutil import atomic_write


def add_variant(patch: Patch, upstream: bytes, edited: bytes, relpath: str, versions: str, name: str):
    """Write `<folder>/<component>-<name>.diff`, check it round-trips with the engine, append its [[variant]]."""
    try:
        SpecifierSet(versions)
    except InvalidSpecifier as exc:
        raise RefusedError(f"bad version specifier {versions!r}: {exc}") from exc
    if not re.fullmatch(r"[A-Za-z0-9._+-]+", name):
        raise RefusedError(f"variant name {name!r}: use letters, digits, '.', '_', '+', '-'")
    if any(v.name == name for v in patch.variants):
        raise RefusedError(f"{patch.id} already has a variant {name!r}")
    if upstream == edited:
        raise RefusedError("the edited file is identical to the upstream file: nothing to diff")
    diff = diffengine.unified_diff(upstream, edited, relpath)
    (fp,) = diffengine.parse_patch(diff)
    forward = diffengine.plan_file(fp, upstream)
    backward = diffengine.plan_file(diffengine.reverse_file_patch(fp), edited)
    if forward.new != edited or backward.new != upstream:
        raise RefusedError("the generated diff does not round-trip byte for byte (a bug: please report)")
    diff_path = patch.folder / f"{patch.component}-{name}.diff"
    if diff_path.exists():
        raise RefusedError(f"{diff_path} exists already")
    atomic_write(diff_path, diff, mode=0o644)
    meta = patch.folder / "patch.toml"
    text = meta.read_text(encoding="utf-8")
    sep = "" if text.endswith("\n") else "\n"
    entry = (f'{sep}\n[[variant]]\nname = "{name}"\nversions = "{versions}"\ndiff = "{diff_path.name}"\n'
             f"tested = []\n")
    atomic_write(meta, (text + entry).encode("utf-8"))
    load_patch(patch.folder, patch.component)  # the catalog still loads
    return diff_path
