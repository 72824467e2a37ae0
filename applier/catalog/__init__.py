"""The patch catalog: `patches/<component>/<name>/patch.toml` plus its diffs (see patches/README.md).

patch.toml is data from a folder the user may point elsewhere (`--patches`): every key is checked for its type, and
anything malformed (bytes that are not UTF-8, TOML errors, a key of the wrong type, a diff file outside the patch's
folder) is a CatalogError naming the file and the key, exit 3, before anything is read from the target.

The catalog layer (this package) reads, never writes: the planner (variant choice, file plans), the overlay pack's
metadata (packmeta), the allow-list a target's state is checked against (allowlist), catalog check and authoring.
"""
from __future__ import annotations

import os
import re
import stat
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from applier.diffengine.parse import MAX_PATCH_BYTES
from applier.errors import RefusedError
from applier.resources import PATCHES_DIR
from applier.store.fsutil import FileTooLarge, NotRegularFile, kind_of, read_regular

# Where the catalog's format is described: the README inside this install's catalog (a wheel carries it too)
FORMAT_DOC = (str(PATCHES_DIR / "README.md") if (PATCHES_DIR / "README.md").is_file()
              else "the catalog format in README.md of applier's patches/ folder")

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

COMPONENTS = ("comfyui", "torch")

TEXT_KEYS = ("title", "summary", "reach", "risks", "measured")
TOP_LEVEL_KEYS = (*TEXT_KEYS, "effect_probe", "default", "shared", "requires", "requires_text", "variant")
VARIANT_KEYS = ("name", "versions", "diff", "tested")
REQUIRES_TEXT_KEYS = ("file", "pattern", "why")
MAX_META_BYTES = 1024 * 1024         # a patch.toml is a few kB
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


# ------------------------------------------------------------------------------------------- reading patch.toml

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


def _read_meta(meta_path: Path) -> dict:
    raw = read_catalog_file(meta_path, "patch.toml", MAX_META_BYTES)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CatalogError(f"{meta_path}: not UTF-8 (byte {raw[exc.start]:#04x} at offset {exc.start})") from exc
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError(f"{meta_path}: not valid TOML: {exc}") from exc


def _expect(meta_path: Path, where: str, key: str, value, kind: type, what: str):
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise CatalogError(f"{meta_path}: {where}{key!r} must be {what}, not {type(value).__name__} {value!r:.60}")
    return value


def _string_list(meta_path: Path, where: str, key: str, value) -> tuple[str, ...]:
    _expect(meta_path, where, key, value, list, "a list of strings")
    for item in value:
        _expect(meta_path, where, f"{key}[]", item, str, "a string")
    return tuple(value)


def _file_in_folder(meta_path: Path, where: str, key: str, name: str) -> Path:
    """A file named in patch.toml: relative, no '..', inside the patch's folder, and present."""
    folder = meta_path.parent
    parts = PurePosixPath(name.replace("\\", "/")).parts
    if not name or name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":") or ".." in parts \
            or "\x00" in name:
        raise CatalogError(f"{meta_path}: {where}{key!r} = {name!r} must name a file inside {folder}")
    path = folder.joinpath(*parts)
    try:
        inside = path.resolve().is_relative_to(folder.resolve())
        seen = _stat_or_none(path)
    except (OSError, ValueError) as exc:
        raise CatalogError(f"{meta_path}: {where}{key!r} = {name!r} cannot be read: {exc}") from exc
    if not inside:
        raise CatalogError(f"{meta_path}: {where}{key!r} = {name!r} leads outside {folder}")
    if seen is None:
        raise CatalogError(f"{meta_path}: {where}{key!r}: diff {name} is missing")
    if not stat.S_ISREG(seen.st_mode):
        raise CatalogError(f"{meta_path}: {where}{key!r}: diff {name} is {kind_of(seen.st_mode)}, not a regular file",
                           hint=ONLY_REGULAR_HINT)
    if seen.st_size > MAX_PATCH_BYTES:
        raise CatalogError(f"{meta_path}: {where}{key!r}: diff {name} holds {seen.st_size} bytes, over applier's "
                           f"limit of {MAX_PATCH_BYTES} for a variant's diff", hint="split it into smaller patches")
    return path


def _stat_or_none(path: Path, *, follow_links: bool = True) -> os.stat_result | None:
    """os.stat (or lstat) of a catalog entry, None when nothing is there; any other OSError (a folder on the way
    that cannot be searched) as it comes, for the caller to name: nothing is silently left out."""
    try:
        return os.stat(path) if follow_links else os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _unknown_keys(meta_path: Path, where: str, table: dict, allowed: tuple[str, ...]) -> None:
    unknown = sorted(set(table) - set(allowed))
    if unknown:
        raise CatalogError(f"{meta_path}: {where}unknown key {unknown[0]!r}",
                           hint=f"known keys: {', '.join(allowed)} ({FORMAT_DOC})")


def _check_table(meta_path: Path, where: str, raw, allowed, required: tuple[str, ...]) -> None:
    """One entry of an array of tables ([[variant]], [[requires_text]]): a table, with only `allowed` keys and every
    `required` one."""
    if not isinstance(raw, dict):
        raise CatalogError(f"{meta_path}: {where}must be a table, not {type(raw).__name__}")
    _unknown_keys(meta_path, where, raw, allowed)
    for key in required:
        if key not in raw:
            raise CatalogError(f"{meta_path}: {where}lacks {key!r}")


def _variants(meta_path: Path, meta: dict, shared: tuple[Path, ...]) -> tuple[Variant, ...]:
    raw_variants = meta.get("variant")
    if raw_variants is None:
        raise CatalogError(f"{meta_path}: no [[variant]]")
    if not isinstance(raw_variants, list):
        raise CatalogError(f"{meta_path}: 'variant' must be an array of tables ([[variant]]), "
                           f"not {type(raw_variants).__name__}")
    variants = []
    for index, raw in enumerate(raw_variants, start=1):
        where = f"[[variant]] #{index}: "
        _check_table(meta_path, where, raw, VARIANT_KEYS, ("name", "versions", "diff"))
        name = _expect(meta_path, where, "name", raw["name"], str, "a string")
        where = f"variant {name!r}: "
        if not name.strip():
            raise CatalogError(f"{meta_path}: [[variant]] #{index}: 'name' is empty")
        spec = _expect(meta_path, where, "versions", raw["versions"], str, "a version specifier string")
        try:
            versions = SpecifierSet(spec)
        except InvalidSpecifier as exc:
            raise CatalogError(f"{meta_path}: variant {name!r}: bad specifier: {exc}") from exc
        diff = _expect(meta_path, where, "diff", raw["diff"], str, "a file name (string)")
        diff_path = _file_in_folder(meta_path, where, "diff", diff)
        tested = _string_list(meta_path, where, "tested", raw.get("tested", []))
        for label in tested:
            if not label.strip():
                raise CatalogError(f"{meta_path}: {where}'tested' holds an empty version")
        variants.append(Variant(name, versions, diff_path, tested, shared))
    if not variants:
        raise CatalogError(f"{meta_path}: no [[variant]]")
    if len({v.name for v in variants}) != len(variants):
        raise CatalogError(f"{meta_path}: variant names repeat")
    return tuple(variants)


def _requires_text(meta_path: Path, value) -> tuple[TextRequirement, ...]:
    _expect(meta_path, "", "requires_text", value, list, "an array of tables ([[requires_text]])")
    found = []
    for index, raw in enumerate(value, start=1):
        where = f"[[requires_text]] #{index}: "
        _check_table(meta_path, where, raw, REQUIRES_TEXT_KEYS, ("file", "pattern"))
        file = _expect(meta_path, where, "file", raw["file"], str, "a path (string)")
        parts = PurePosixPath(file.replace("\\", "/")).parts
        if not file or file.startswith(("/", "\\")) or ".." in parts:
            raise CatalogError(f"{meta_path}: {where}'file' = {file!r} must be relative to the component root")
        pattern = _expect(meta_path, where, "pattern", raw["pattern"], str, "a regular expression (string)")
        try:
            re.compile(pattern, re.MULTILINE)
        except re.error as exc:
            raise CatalogError(f"{meta_path}: {where}'pattern' is not a regular expression: {exc}") from exc
        why = _expect(meta_path, where, "why", raw.get("why", ""), str, "a string")
        found.append(TextRequirement(file, pattern, why.strip()))
    return tuple(found)


def load_patch(folder: Path, component: str) -> Patch:
    meta_path = folder / "patch.toml"
    meta = _read_meta(meta_path)
    _unknown_keys(meta_path, "", meta, TOP_LEVEL_KEYS)
    patch_id = f"{component}/{folder.name}"
    text = {key: _expect(meta_path, "", key, meta.get(key, ""), str, "a string").strip() for key in TEXT_KEYS}
    effect_probe = meta.get("effect_probe")
    if effect_probe is not None:
        _expect(meta_path, "", "effect_probe", effect_probe, str, "a probe name (string)")
    default = _expect(meta_path, "", "default", meta.get("default", True), bool, "true or false")
    shared = tuple(_file_in_folder(meta_path, "", "shared", name)
                   for name in _string_list(meta_path, "", "shared", meta.get("shared", [])))
    requires = _string_list(meta_path, "", "requires", meta.get("requires", []))
    for required in requires:
        if required.count("/") != 1 or required.split("/")[0] not in COMPONENTS:
            raise CatalogError(f"{meta_path}: 'requires' names {required!r}, not a patch id (<component>/<name>)")
    requires_text = _requires_text(meta_path, meta.get("requires_text", []))
    variants = _variants(meta_path, meta, shared)
    if any(v.diff_path in shared for v in variants):
        raise CatalogError(f"{meta_path}: a variant's 'diff' is also listed in 'shared'")
    return Patch(
        id=patch_id,
        component=component,
        name=folder.name,
        folder=folder,
        title=text["title"] or patch_id,
        summary=text["summary"],
        reach=text["reach"],
        risks=text["risks"],
        measured=text["measured"],
        effect_probe=effect_probe,
        default=default,
        variants=variants,
        requires=requires,
        requires_text=requires_text,
    )


def _patch_folders(comp_dir: Path) -> list[Path]:
    """The folders of one component that hold a patch.toml (of any kind: load_patch refuses one that is not a
    regular file), sorted. A folder without patch.toml is not a patch; an entry that cannot be looked at, or a
    component that is not a folder, is a CatalogError, never a patch silently left out."""
    looking_at = comp_dir
    try:
        seen = _stat_or_none(comp_dir)
        if seen is None:
            return []
        if not stat.S_ISDIR(seen.st_mode):
            kind = "a file" if stat.S_ISREG(seen.st_mode) else kind_of(seen.st_mode)
            raise CatalogError(f"catalog folder {comp_dir} is {kind}, not a folder of patches",
                               hint=f"expected {comp_dir}/<name>/patch.toml ({FORMAT_DOC})")
        folders = []
        for name in sorted(os.listdir(comp_dir)):
            looking_at = folder = comp_dir / name
            entry = _stat_or_none(folder)
            if entry is None and os.path.islink(folder):
                raise CatalogError(f"{folder} is a link to nothing", hint="remove it, or point it at a patch folder")
            if entry is None or not stat.S_ISDIR(entry.st_mode):
                continue            # a README, a stray file: not a patch (and never opened)
            looking_at = folder / "patch.toml"
            if _stat_or_none(looking_at, follow_links=False) is not None:    # any kind: load_patch says
                folders.append(folder)
    except OSError as exc:
        raise CatalogError(f"{looking_at} cannot be read: {exc.strerror or exc}",
                           hint="give the user running applier access to the whole catalog folder") from exc
    return folders


def load_catalog(root: Path | None = None) -> list[Patch]:
    """Every patch under root (default: the packaged patches/), sorted by id. A folder with no patch at all is an
    error (a mistyped `--patches` must not look like an empty catalog)."""
    root = Path(root) if root is not None else PATCHES_DIR
    if not root.is_dir():
        raise CatalogError(f"catalog folder {root} does not exist",
                           hint=f"--patches takes a folder laid out like the packaged catalog ({FORMAT_DOC})")
    patches = []
    for component in COMPONENTS:
        patches += [load_patch(folder, component) for folder in _patch_folders(root / component)]
    if not patches:
        raise CatalogError(f"catalog folder {root} holds no patch",
                           hint=f"expected {root}/<{'|'.join(COMPONENTS)}>/<name>/patch.toml ({FORMAT_DOC})")
    by_id = {p.id: p for p in patches}
    for patch in patches:
        for required in patch.requires:
            if required not in by_id or required == patch.id:
                raise CatalogError(f"{patch.folder / 'patch.toml'}: 'requires' names {required!r}, "
                                   "which is not another patch of the catalog")
    return [replace(p, required=tuple(by_id[r] for r in p.requires)) if p.requires else p for p in patches]


def select_patches(catalog: list[Patch], only: tuple[str, ...] = (), skip: tuple[str, ...] = ()) -> list[Patch]:
    """The patches a command acts on: --only (exact ids or a component name), minus --skip."""
    by_id = {p.id: p for p in catalog}
    for wanted in (*only, *skip):
        if wanted not in by_id and wanted not in COMPONENTS:
            raise RefusedError(f"no patch {wanted!r} in the catalog",
                               hint=f"known: {', '.join(sorted(by_id))}")

    def matches(patch: Patch, names: tuple[str, ...]) -> bool:
        return patch.id in names or patch.component in names

    chosen = [p for p in catalog if matches(p, only)] if only else [p for p in catalog if p.default]
    return [p for p in chosen if not matches(p, skip)]
