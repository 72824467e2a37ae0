"""A patch of the catalog as data: Patch, its Variants (each a version range and a diff), the text it requires of
a target file, and the bounded read of the catalog's files; CatalogError for anything malformed.

patch_toml.py reads these records from `patches/<component>/<name>/patch.toml`; loader.py finds every patch.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from applier.diffengine.parse import MAX_PATCH_BYTES
from applier.errors import RefusedError
from applier.resources import PATCHES_DIR
from applier.store.fsutil import FileTooLarge, NotRegularFile, read_regular

# Where the catalog's format is described: the README inside this install's catalog (a wheel carries it too)
FORMAT_DOC = (str(PATCHES_DIR / "README.md") if (PATCHES_DIR / "README.md").is_file()
              else "the catalog format in README.md of applier's patches/ folder")
COMPONENTS = ("comfyui", "torch")
ONLY_REGULAR_HINT = "a catalog holds folders and regular files only; put the file back as one (or remove the entry)"


class CatalogError(RefusedError):
    """The catalog itself is missing or malformed: refused before anything is read from the target."""


@dataclass(frozen=True)
class TextRequirement:
    """A line the target file must hold for the patch to make sense (pil-pixel-limit reads MAX_RESOLUTION).

    Checked at plan time against the bytes the file will hold once the patches planned before it are written."""
    file: str                    # relative to the component root, like the paths in the diffs
    pattern: str                 # a Python regex, searched line by line (re.MULTILINE)
    why: str = ""

    def met_by(self, data: bytes | None) -> bool:
        if data is None:
            return False
        return re.search(self.pattern, data.decode("utf-8", "replace"), re.MULTILINE) is not None

    def describe(self) -> str:
        return f"{self.file} has no line matching {self.pattern!r}" + (f" ({self.why})" if self.why else "")


@dataclass(frozen=True)
class Variant:
    name: str
    versions: SpecifierSet
    diff_path: Path                          # the variant's own diff (what differs between eras)
    tested: tuple[str, ...] = ()
    shared: tuple[Path, ...] = ()            # the patch's shared diffs, read before diff_path (patch.toml `shared`)

    @property
    def diff_paths(self) -> tuple[Path, ...]:
        return (*self.shared, self.diff_path)

    def covers(self, version: str) -> bool:
        return self.versions.contains(public_version(version), prereleases=True)

    def is_below(self, version: str) -> bool:
        """True when the variant's range ends before `version` (an upper bound excludes it): a newer release."""
        v = public_version(version)
        for spec in self.versions:
            op, bound = spec.operator, spec.version
            if op in ("<", "<=", "==", "===") and not bound.endswith(".*"):
                try:
                    limit = Version(bound)
                except InvalidVersion:
                    continue
                if v > limit or (op == "<" and v == limit):
                    return True
        return False

    def read_diff(self) -> bytes:
        """The full diff of this variant: the shared diffs, then its own (byte-identical to one combined file).
        CatalogError when one is gone, is not a regular file (never opened blocking) or is over the size limit."""
        return b"".join(read_catalog_file(path, "diff", MAX_PATCH_BYTES) for path in self.diff_paths)


@dataclass(frozen=True)
class Patch:
    id: str                      # "<component>/<name>"
    component: str
    name: str
    folder: Path
    title: str
    summary: str
    reach: str
    risks: str
    measured: str
    effect_probe: str | None
    default: bool
    variants: tuple[Variant, ...] = field(default_factory=tuple)
    requires: tuple[str, ...] = ()                      # ids of patches that must be applied with or before it
    requires_text: tuple[TextRequirement, ...] = ()
    # The patches named in `requires`, resolved by load_catalog (for checking that they are applied in the files).
    required: tuple["Patch", ...] = field(default=(), compare=False, repr=False)

    def variant(self, name: str) -> Variant:
        for variant in self.variants:
            if variant.name == name:
                return variant
        raise RefusedError(f"{self.id} has no variant {name!r}",
                           hint=f"variants: {', '.join(v.name for v in self.variants)}")

    def variants_for(self, version: str) -> list[Variant]:
        return [v for v in self.variants if v.covers(version)]

    def is_past_every_variant(self, version: str) -> bool:
        """The version is newer than every variant's range (a release the catalog has not caught up with)."""
        return all(v.is_below(version) for v in self.variants)

    def is_past_some_variant(self, version: str) -> bool:
        """The version is newer than some variant's range: past the catalog, or in a gap between two eras'
        ranges (releases whose files nobody has checked yet). Older than every range is neither."""
        return any(v.is_below(version) for v in self.variants)


def public_version(version: str) -> Version:
    """'2.13.0+cu130' -> Version('2.13.0'): local labels never decide which variant fits."""
    try:
        return Version(Version(version).public)
    except InvalidVersion as exc:
        raise RefusedError(f"cannot read version {version!r}") from exc


def read_catalog_file(path: Path, what: str, limit: int) -> bytes:
    """The bytes of a file of the catalog (a patch.toml, a diff); CatalogError naming it when it is gone, is a FIFO,
    a device or a folder (refused unopened, never waited on), is over `limit` or cannot be read."""
    try:
        return read_regular(path, limit=limit)
    except FileNotFoundError as exc:
        raise CatalogError(f"{path}: the {what} is missing (or a link to nothing)") from exc
    except NotRegularFile as exc:      # "refusing to read PATH: it is a FIFO (named pipe), not a regular file"
        raise CatalogError(f"{path}: {exc.message.rsplit(': ', 1)[-1]}", hint=ONLY_REGULAR_HINT) from exc
    except FileTooLarge as exc:
        raise CatalogError(f"{path}: the {what} is larger than applier's limit of {limit} bytes for it",
                           hint="split it into smaller patches") from exc
    except OSError as exc:
        raise CatalogError(f"{path}: the {what} cannot be read: {exc.strerror or exc}") from exc


def stat_or_none(path: Path, *, follow_links: bool = True) -> os.stat_result | None:
    """os.stat (or lstat) of a catalog entry, None when nothing is there; any other OSError (a folder on the way
    that cannot be searched) as it comes, for the caller to name: nothing is silently left out."""
    try:
        return os.stat(path) if follow_links else os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
