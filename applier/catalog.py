"""The patch catalog: `patches/<component>/<name>/patch.toml` plus one diff per variant (see patches/README.md)."""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from applier.errors import RefusedError
from applier.resources import PATCHES_DIR

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

COMPONENTS = ("comfyui", "torch")


class CatalogError(RefusedError):
    """The catalog itself is missing or malformed: refused before anything is read from the target."""


@dataclass(frozen=True)
class Variant:
    name: str
    versions: SpecifierSet
    diff_path: Path
    tested: tuple[str, ...] = ()

    def covers(self, version: str) -> bool:
        return self.versions.contains(public_version(version), prereleases=True)

    def read_diff(self) -> bytes:
        return self.diff_path.read_bytes()


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

    def variant(self, name: str) -> Variant:
        for variant in self.variants:
            if variant.name == name:
                return variant
        raise RefusedError(f"{self.id} has no variant {name!r}",
                           hint=f"variants: {', '.join(v.name for v in self.variants)}")

    def variants_for(self, version: str) -> list[Variant]:
        return [v for v in self.variants if v.covers(version)]


def public_version(version: str) -> Version:
    """'2.13.0+cu130' -> Version('2.13.0'): local labels never decide which variant fits."""
    try:
        return Version(Version(version).public)
    except InvalidVersion as exc:
        raise RefusedError(f"cannot read version {version!r}") from exc


def load_patch(folder: Path, component: str) -> Patch:
    meta_path = folder / "patch.toml"
    try:
        meta = tomllib.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise CatalogError(f"{meta_path}: {exc}") from exc
    patch_id = f"{component}/{folder.name}"
    variants = []
    for raw in meta.get("variant", []):
        try:
            name, spec, diff = raw["name"], raw["versions"], raw["diff"]
            versions = SpecifierSet(spec)
        except KeyError as exc:
            raise CatalogError(f"{meta_path}: a [[variant]] lacks {exc.args[0]!r}") from exc
        except InvalidSpecifier as exc:
            raise CatalogError(f"{meta_path}: variant {raw.get('name')!r}: bad specifier: {exc}") from exc
        diff_path = folder / diff
        if not diff_path.is_file():
            raise CatalogError(f"{meta_path}: variant {name!r}: diff {diff} is missing")
        variants.append(Variant(name, versions, diff_path, tuple(raw.get("tested", ()))))
    if not variants:
        raise CatalogError(f"{meta_path}: no [[variant]]")
    if len({v.name for v in variants}) != len(variants):
        raise CatalogError(f"{meta_path}: variant names repeat")
    return Patch(
        id=patch_id,
        component=component,
        name=folder.name,
        folder=folder,
        title=meta.get("title", patch_id),
        summary=meta.get("summary", "").strip(),
        reach=meta.get("reach", "").strip(),
        risks=meta.get("risks", "").strip(),
        measured=meta.get("measured", "").strip(),
        effect_probe=meta.get("effect_probe"),
        default=bool(meta.get("default", True)),
        variants=tuple(variants),
    )


def load_catalog(root: Path | None = None) -> list[Patch]:
    """Every patch under root (default: the packaged patches/), sorted by id."""
    root = Path(root) if root is not None else PATCHES_DIR
    if not root.is_dir():
        raise CatalogError(f"catalog folder {root} does not exist",
                           hint="applier runs from a checkout (pip install -e .), which holds patches/")
    patches = []
    for component in COMPONENTS:
        comp_dir = root / component
        if not comp_dir.is_dir():
            continue
        for folder in sorted(p for p in comp_dir.iterdir() if (p / "patch.toml").is_file()):
            patches.append(load_patch(folder, component))
    return patches


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
