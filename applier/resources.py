"""Where the applier's non-code resources live (catalog, overlays, verify suite) and how to load the verify suite."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import applier

REPO_ROOT = Path(applier.__file__).resolve().parent.parent
PATCHES_DIR = REPO_ROOT / "patches"
OVERLAYS_DIR = REPO_ROOT / "overlays"
VERIFY_DIR = REPO_ROOT / "verify"

VERIFY_MODULE_NAME = "applier_verify"


def load_verify() -> ModuleType:
    """The verify suite (verify/__init__.py) as the package `applier_verify`, loaded once per process.

    verify/ is a folder of the repository rather than a subpackage of applier because its probes are scripts that
    run in the target's interpreter; the applier side of it is imported under a name of its own so that it can
    never collide with a `verify` module of the user's environment.
    """
    loaded = sys.modules.get(VERIFY_MODULE_NAME)
    if loaded is not None:
        return loaded
    init = VERIFY_DIR / "__init__.py"
    spec = importlib.util.spec_from_file_location(
        VERIFY_MODULE_NAME, init, submodule_search_locations=[str(VERIFY_DIR)])
    if spec is None or spec.loader is None:  # pragma: no cover - only when the folder is missing from an install
        raise ImportError(f"cannot load the verify suite from {VERIFY_DIR}")
    module = importlib.util.module_from_spec(spec)
    # Registered before executing so that the package's relative imports find their parent.
    sys.modules[VERIFY_MODULE_NAME] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(VERIFY_MODULE_NAME, None)
        raise
    return module
