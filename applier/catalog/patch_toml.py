"""patch.toml read into a Patch: every key checked for its type, every file it names checked to be a regular file
inside the patch's folder; anything malformed is a CatalogError naming the file and the key (exit 3), before
anything is read from the target.
"""
from __future__ import annotations

import re
import stat
import sys
from pathlib import Path, PurePosixPath

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from applier.catalog.patch import (COMPONENTS, FORMAT_DOC, ONLY_REGULAR_HINT, CatalogError, Patch,
                                   TextRequirement, Variant, read_catalog_file, stat_or_none)
from applier.diffengine.parse import MAX_PATCH_BYTES
from applier.store.fsutil import kind_of

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TEXT_KEYS = ("title", "summary", "reach", "risks", "measured")
TOP_LEVEL_KEYS = (*TEXT_KEYS, "effect_probe", "default", "shared", "requires", "requires_text", "variant")
VARIANT_KEYS = ("name", "versions", "diff", "tested")
REQUIRES_TEXT_KEYS = ("file", "pattern", "why")
MAX_META_BYTES = 1024 * 1024         # a patch.toml is a few kB


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
        seen = stat_or_none(path)
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
