"""What a target's state may name: the allow-list of touchable paths, computed from the catalog and the overlay
pack, and the target's StateStore built on it. Confinement (below) is given this list; it never looks it up."""
from __future__ import annotations

from applier.catalog.packmeta import pack_prefixes
from applier.catalog.patch import Patch
from applier.catalog.planner import load_file_patches
from applier.errors import ApplierError
from applier.store.confine import ROOTS, COMPONENT_ROOT, Confinement, OverlayPrefixes
from applier.store.install import open_install
from applier.store.state import StateStore
from applier.target import Target


def catalog_paths(catalog: list[Patch]) -> dict[str, set[str]]:
    """{root: every relative path a variant of a catalog patch names}."""
    out: dict[str, set[str]] = {root: set() for root in ROOTS}
    for patch in catalog:
        root = COMPONENT_ROOT.get(patch.component)
        if root is None:
            continue
        for variant in patch.variants:
            try:
                out[root].update(fp.path for fp in load_file_patches(patch, variant))
            except (ApplierError, OSError):
                continue  # a variant that does not parse names nothing; planning reports it
    return out


def confinement_for(target: Target, catalog: list[Patch] | None = None,
                    overlay: OverlayPrefixes | None = None) -> Confinement:
    """The target's roots, the paths the catalog's patches can touch, and the overlay pack's folders (default: the
    packaged pack's)."""
    return Confinement({"comfyui": target.comfyui_root, "purelib": target.purelib,
                        "site-packages": target.site_packages}, target.state_dir,
                       catalog_paths(catalog or []), overlay if overlay is not None else pack_prefixes())


def store_for(target: Target, catalog: list[Patch] | None = None,
              overlay: OverlayPrefixes | None = None) -> StateStore:
    """The target's `.applier/`, every read of it validated against confinement_for(target, catalog, overlay)."""
    return StateStore(target.state_dir, confinement_for(target, catalog, overlay), install_root=target.root)


def install_for(target: Target, catalog: list[Patch] | None = None, overlay: OverlayPrefixes | None = None, *,
                run: bool = False, create: bool = True):
    """The target's install opened once (a context manager), confined by confinement_for(target, catalog, overlay);
    with `run`, locked, recovered and its state read (open_install)."""
    confinement = confinement_for(target, catalog, overlay)
    return open_install(target, confinement, run=run, create=create)
