"""Where the applier's non-code resources live (catalog, overlays, verify suite) and how to load the verify suite.

Two places, decided once at import:

- a checkout (the repository, an editable install, `python -m applier` from the source tree): the folders
  `patches/`, `verify/` and `overlays/` beside the `applier/` package, as they are in the repository;
- an installed wheel (`pip install .`, `pipx install .`): their copies inside the package, `applier/_data/<folder>`,
  put there by the build (setup.cfg maps the packages `applier._data.patches` etc. to the repository folders).

The bundled copies win when they are there (nothing creates `applier/_data/` in a checkout). Otherwise the folders
beside the package are used only when they look like a source tree (the three folders and the build metadata), so
a stray `patches/` or `verify/` package in site-packages is never mistaken for applier's.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import applier
from applier.errors import RefusedError

RESOURCE_FOLDERS = ("patches", "verify", "overlays")

PACKAGE_DIR = Path(applier.__file__).resolve().parent
# The repository root when running from a checkout (its docs/ and tests/ are there); only meaningful then.
REPO_ROOT = PACKAGE_DIR.parent


def has_resources(folder: Path) -> bool:
    return all((folder / name).is_dir() for name in RESOURCE_FOLDERS)


def is_checkout(root: Path) -> bool:
    """True when root is a source tree of applier: its build metadata and the three resource folders."""
    return has_resources(root) and any((root / name).is_file() for name in ("setup.cfg", "pyproject.toml"))


def find_resource_root(package_dir: Path = PACKAGE_DIR) -> tuple[Path, str]:
    """(folder that holds patches/, verify/ and overlays/, "installed" or "checkout").

    An install with neither (a broken build) gets the bundled paths: every command that needs them then refuses
    with the missing path in its message (the catalog loader's exit 3).
    """
    bundled = package_dir / "_data"
    if has_resources(bundled):
        return bundled, "installed"
    if is_checkout(package_dir.parent):
        return package_dir.parent, "checkout"
    return bundled, "installed"


RESOURCE_ROOT, RESOURCE_ORIGIN = find_resource_root()
PATCHES_DIR = RESOURCE_ROOT / "patches"
OVERLAYS_DIR = RESOURCE_ROOT / "overlays"
VERIFY_DIR = RESOURCE_ROOT / "verify"

VERIFY_MODULE_NAME = "applier_verify"


def load_verify() -> ModuleType:
    """The verify suite (verify/__init__.py) as the package `applier_verify`, loaded once per process.

    verify/ is a folder of the repository rather than a subpackage of applier because its probes are scripts that
    run in the target's interpreter; the applier side of it is imported under a name of its own so that it can
    never collide with a `verify` module of the user's environment (nor with `applier._data.verify`, the same
    files in an installed wheel).
    """
    loaded = sys.modules.get(VERIFY_MODULE_NAME)
    if loaded is not None:
        return loaded
    init = VERIFY_DIR / "__init__.py"
    if not init.is_file():
        raise RefusedError(f"the verify suite is missing: {init} does not exist",
                           hint="reinstall applier (a wheel carries it as applier/_data/verify)")
    return load_module(VERIFY_MODULE_NAME, init, package_dir=VERIFY_DIR)


def load_module(name: str, path: Path, *, package_dir: Path | None = None) -> ModuleType:
    """The file at path executed as module `name` (a package when package_dir is given), registered in
    sys.modules before it runs (so that relative imports find their parent) and removed again if it fails."""
    locations = [str(package_dir)] if package_dir is not None else None
    spec = importlib.util.spec_from_file_location(name, path, submodule_search_locations=locations)
    if spec is None or spec.loader is None:  # pragma: no cover - spec_from_file_location of an existing .py
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


PACK_PACKAGE = "fused_dit"


def load_pack_module(name: str, overlays_dir: Path | None = None) -> ModuleType:
    """One torch-free module of the overlay pack by path, under a name of applier's own: `fingerprint`, or a module
    of a torch-free subpackage, `tiling.plan` (the subpackage is loaded as a package first, so that its relative
    imports resolve inside it)."""
    folder = (overlays_dir or OVERLAYS_DIR) / PACK_PACKAGE
    parts = name.split(".")
    qualified = "applier_overlay_" + "_".join(parts[:-1]) + ("." if len(parts) > 1 else "") + parts[-1]
    path = folder.joinpath(*parts).with_suffix(".py")
    loaded = sys.modules.get(qualified)
    if loaded is not None and getattr(loaded, "__file__", None) == str(path):
        return loaded
    if not path.is_file():
        raise RefusedError(f"the overlay pack is missing {path}", hint="reinstall applier")
    if len(parts) > 1:
        package = "applier_overlay_" + "_".join(parts[:-1])
        init = folder.joinpath(*parts[:-1], "__init__.py")
        if package not in sys.modules or getattr(sys.modules[package], "__file__", None) != str(init):
            load_module(package, init, package_dir=init.parent)
    return load_module(qualified, path)
