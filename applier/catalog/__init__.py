"""The patch catalog: `patches/<component>/<name>/patch.toml` plus its diffs (see patches/README.md).

This package hands names on; the code lives in its modules:

    patch.py       Patch, Variant, TextRequirement, CatalogError: a patch as data, and the bounded read of its files
    patch_toml.py  patch.toml read into a Patch, every key checked (load_patch)
    loader.py      the whole catalog (load_catalog) and the patches a command acts on (select_patches)
    planner.py     variant choice and file plans; packmeta.py the overlay pack's metadata; allowlist.py what a
                   target's state may name; check.py catalog check; authoring.py catalog refresh

patch.toml is data from a folder the user may point elsewhere (`--patches`): anything malformed is a CatalogError
naming the file and the key, exit 3, before anything is read from the target. The catalog layer reads, never writes.
"""
from __future__ import annotations

from applier.catalog.loader import load_catalog, select_patches
from applier.catalog.patch import (COMPONENTS, FORMAT_DOC, CatalogError, Patch, TextRequirement, Variant,
                                   public_version, read_catalog_file)
from applier.catalog.patch_toml import load_patch

__all__ = ["COMPONENTS", "FORMAT_DOC", "CatalogError", "Patch", "TextRequirement", "Variant", "load_catalog",
           "load_patch", "public_version", "read_catalog_file", "select_patches"]
