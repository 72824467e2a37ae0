"""Shared test settings: which tests are slow, which modules need packages beyond the applier's own, Hypothesis.

Selection lives here, in one place, by path and fixture, so the test files stay plain:

- `slow` (left out by `make test-fast`): the Triton-interpreter tests (tests/overlays/, the kernel-parity probe)
  and the tests on real torch files (test_torch_patches.py, the `torch_env` fixture's copy of the installed torch).
- Without torch or Triton, the modules that need them are skipped with the reason instead of failing to collect.
  The applier itself needs only click, unidiff, packaging and filelock (and the tests pytest and hypothesis).

Hypothesis profiles: "ci" (the default), "dev" (quick), "thorough" (long runs); select one with
HYPOTHESIS_PROFILE=thorough. Its example database lives in .cache/hypothesis inside the repo, and git run in a
temporary folder inside the repo (`make test` puts them in .cache/tmp) stops its search for a repository there.
"""
from __future__ import annotations

import importlib.util
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent

# path under tests/ (a folder ends in "/") -> why its tests are slow
SLOW_PATHS = {
    "overlays/": "the Triton interpreter runs the kernels on the CPU",
    "test_verify_kernel_parity.py": "the kernel-parity probe runs the kernels under the Triton interpreter",
    "test_torch_patches.py": "real torch files, and probes that import torch",
}
# fixture -> why a test that uses it is slow
SLOW_FIXTURES = {"torch_env": "a venv holding copies of the installed torch's files"}
# path under tests/ -> the packages its modules import or need at collection
NEEDS = {
    "overlays/": ("torch", "triton"),
    "test_torch_patches.py": ("torch",),
}


def keep_git_out_of_this_checkout() -> None:
    """With the temporary folder inside this repository (the Makefile puts it in .cache/tmp), git run in a test's
    folder (`git apply`, the fixtures' checkouts) would take this checkout for that folder's repository; a ceiling
    at the temporary folder stops its search there, as it stops at / under /tmp."""
    temp = Path(tempfile.gettempdir()).resolve()
    if temp == REPO or REPO in temp.parents:
        ceilings = [c for c in os.environ.get("GIT_CEILING_DIRECTORIES", "").split(os.pathsep) if c]
        os.environ["GIT_CEILING_DIRECTORIES"] = os.pathsep.join([*ceilings, str(temp)])


keep_git_out_of_this_checkout()


def available(name: str) -> bool:
    """Whether `import name` would find the package, without importing it (torch takes seconds)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):       # ValueError: sys.modules[name] is None (an import blocked on purpose)
        return False


def relative(path: Path) -> str:
    return path.resolve().relative_to(TESTS).as_posix()


def matches(rel: str, key: str) -> bool:
    return rel.startswith(key) if key.endswith("/") else rel == key


def missing_for(path: Path) -> list[str]:
    rel = relative(path)
    needed = {name for key, names in NEEDS.items() if matches(rel, key) for name in names}
    return sorted(name for name in needed if not available(name))


class MissingPackagesModule(pytest.Module):
    """A test module whose packages are not installed: collected as one skip that names them."""

    missing: list[str] = []

    def collect(self):
        raise pytest.skip.Exception(f"{', '.join(self.missing)} not installed: tests/{relative(self.path)} needs "
                                    f"{'them' if len(self.missing) > 1 else 'it'} (pip install -e '.[kernels]')")


def pytest_pycollect_makemodule(module_path: Path, parent):
    if module_path.name.startswith("test_") and (missing := missing_for(module_path)):
        module = MissingPackagesModule.from_parent(parent, path=module_path)
        module.missing = missing
        return module
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        rel = relative(Path(item.path))
        reasons = [why for key, why in SLOW_PATHS.items() if matches(rel, key)]
        reasons += [why for name, why in SLOW_FIXTURES.items() if name in getattr(item, "fixturenames", ())]
        if reasons and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow(reason="; ".join(reasons)))


@pytest.fixture
def hang_guard():
    """A read that blocks (a FIFO opened for reading) fails the test after 20 s instead of hanging the suite."""
    import signal

    def hung(signum, frame):
        raise TimeoutError("blocked for 20 s: something read a FIFO or waited on a child without a timeout")
    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


DATABASE = DirectoryBasedExampleDatabase(str(REPO / ".cache" / "hypothesis"))
settings.register_profile("ci", deadline=None, max_examples=100, database=DATABASE,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, max_examples=25, database=DATABASE)
settings.register_profile("thorough", deadline=None, max_examples=3000, database=DATABASE,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
