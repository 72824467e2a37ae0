"""The verification suite behind `applier verify`: run the registered checks against a target.

Loaded by the applier as the package `applier_verify` (applier.resources.load_verify()). Entry points:

    run_verify(VerifyOptions(...)) -> list[CheckResult]
    overall_ok(results) -> bool            True iff no check FAILed and not every check SKIPped (nothing verified)
    results_to_json(results, target) -> dict   the `applier verify --json` document (docs/verify-schema.json)
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from applier.catalog import Patch
from applier.errors import ApplierError, RefusedError
from applier.store.fsutil import read_regular
from applier.subproc import text_for_child
from applier.target import Target

from .registry import (REGISTRY, Check, CheckInstance, CheckResult, Outcome, check, nothing_verified, overall_ok,
                       selected, summarize)
from .runner import KEEP_PYTHONPATH_HINT, PYTHON_HINT, ProbeResult, run_probe

__all__ = ["VerifyOptions", "VerifyContext", "CheckProgress", "run_verify", "plan_checks", "results_to_json",
           "overall_ok", "nothing_verified", "summarize", "CheckResult", "Outcome", "check", "REGISTRY", "run_probe",
           "ProbeResult", "KEEP_PYTHONPATH_HINT"]

REPORT_FORMAT = 1
DEFAULT_PROBE_TIMEOUT_S = 180.0
# Triton's interpreter runs kernels in numpy, seconds per small launch: parity on CPU needs far longer.
DEFAULT_KERNEL_TIMEOUT_S = 900.0


@dataclass
class VerifyOptions:
    target: Target
    catalog: list[Patch]
    state: Any = None                    # applier.store.applied.State; None reads as "nothing applied"
    device: str = "auto"                 # "auto" | "cuda" | "cpu", passed to every probe
    kernels: bool = False                # also run kernel parity (slow without a GPU)
    real_import: bool = False            # import the target's ComfyUI in its interpreter (seconds, needs torch)
    only: tuple[str, ...] = ()           # check names, families ("effect") or patch ids; empty: every check
    timeout: float = DEFAULT_PROBE_TIMEOUT_S            # per probe
    progress: Callable[[CheckProgress], None] | None = None    # told as each check starts and as it ends
    kernel_timeout: float = DEFAULT_KERNEL_TIMEOUT_S
    size: tuple[int, int] | None = None   # --size WxH: the canvas the reach check walks the tree for
    keep_pythonpath: bool = False        # pass PYTHONPATH on to the probes (they run isolated, without it, by default)


@dataclass(frozen=True)
class CheckProgress:
    """A check starting (result None) or ended, the index-th of total, for a progress line."""
    name: str
    index: int
    total: int
    slow: bool
    result: CheckResult | None = None


@dataclass
class VerifyContext:
    """What every check reads: the options plus lazily computed, shared facts (status, probe verdicts)."""
    options: VerifyOptions
    _probe_cache: dict[str, ProbeResult] = field(default_factory=dict)
    _statuses: list | None = None
    _max_resolution_patch: tuple[Patch | None, int | None] | None = None

    @property
    def target(self) -> Target:
        return self.options.target

    @property
    def catalog(self) -> list[Patch]:
        return self.options.catalog

    @property
    def applied(self) -> dict:
        """patch id -> AppliedPatch, from the state."""
        state = self.options.state
        return dict(getattr(state, "applied", None) or {})

    def no_interpreter(self) -> str | None:
        """Why probes cannot run in the target's interpreter (a SKIP reason naming --python), None when they can."""
        target = self.target
        if target.python is None:
            return f"no Python interpreter found for the target (venv/, .venv/, python_embeded/); {PYTHON_HINT}"
        problem = getattr(target, "python_problem", None)
        if problem:
            return f"the target's interpreter {target.python} is not usable ({problem}); {PYTHON_HINT}"
        return None

    def patch(self, patch_id: str) -> Patch | None:
        return next((p for p in self.catalog if p.id == patch_id), None)

    def statuses(self) -> list:
        """applier.status.compute_status for the whole catalog, computed once."""
        if self._statuses is None:
            from applier.status import compute_status   # imported late: only integrity needs it
            from applier.store.applied import State
            state = self.options.state if self.options.state is not None else State()
            self._statuses = list(compute_status(self.target, self.catalog, state))
        return self._statuses

    def max_resolution_patch(self) -> tuple[Patch | None, int | None]:
        """The catalog patch whose diff sets MAX_RESOLUTION, and the value it sets (from the applied variant's diff
        when applied); (None, None) when the catalog has none."""
        if self._max_resolution_patch is None:
            self._max_resolution_patch = (None, None)
            for patch in self.catalog:
                value = self._max_resolution_value(patch) if patch.component == "comfyui" else None
                if value is not None:
                    self._max_resolution_patch = (patch, value)
                    break
        return self._max_resolution_patch

    def _max_resolution_value(self, patch: Patch) -> int | None:
        applied = self.applied.get(patch.id)
        # The applied variant's diff says what is in the tree; variants could in principle set different values.
        variants = sorted(patch.variants, key=lambda v: applied is None or v.name != applied.variant)
        return next((value for value in map(max_resolution_set_by, (v.diff_path for v in variants))
                     if value is not None), None)

    def probe_args(self, patch: Patch | None = None) -> dict:
        """The arguments every probe gets (verify/README.md), with `expect` from the state for `patch`."""
        expect: dict[str, Any] = {"applied": patch is not None and patch.id in self.applied}
        mr_patch, mr_value = self.max_resolution_patch()
        if patch is not None and mr_patch is not None and patch.id == mr_patch.id:
            expect["max_resolution"] = mr_value
        target = self.target
        return {
            "device": self.options.device,
            # Spelled as the probe's UTF-8 mode reads them: the same bytes on disk under any locale.
            "comfyui_root": text_for_child(target.comfyui_root) if target.comfyui_root else None,
            "site_packages": text_for_child(target.site_packages) if target.site_packages else None,
            "expect": expect,
            "real_import": self.options.real_import,
        }

    def run_probe(self, probe: str, args: dict, *, timeout: float | None = None,
                  env_extra: dict[str, str] | None = None) -> ProbeResult:
        """Run a probe in the target's interpreter; the same probe with the same arguments runs once per verify."""
        unusable = self.no_interpreter()
        if unusable:
            return ProbeResult(Outcome.SKIP, unusable)
        key = json.dumps([probe, args, env_extra or {}], sort_keys=True)
        if key not in self._probe_cache:
            self._probe_cache[key] = run_probe(self.target.python, probe, args,
                                               self.options.timeout if timeout is None else timeout, env_extra,
                                               keep_pythonpath=self.options.keep_pythonpath)
        return self._probe_cache[key]


MAX_DIFF_BYTES = 16 * 1024 * 1024
_MAX_RESOLUTION_ADDED = re.compile(rb"^\+\s*MAX_RESOLUTION\s*(?::\s*int\s*)?=\s*(\d+)\s*$", re.MULTILINE)


def max_resolution_set_by(diff_path: Path) -> int | None:
    """The value an added `MAX_RESOLUTION = N` line of a diff sets, None when the diff sets none."""
    try:
        data = read_regular(diff_path, limit=MAX_DIFF_BYTES)
    except (OSError, ApplierError):
        return None
    match = _MAX_RESOLUTION_ADDED.search(data.replace(b"\r\n", b"\n"))
    return int(match.group(1)) if match else None


def plan_checks(options: VerifyOptions, ctx: VerifyContext | None = None) -> list[CheckInstance]:
    """The checks `run_verify` would run for these options, in order; RefusedError for an unknown --only name."""
    from . import checks  # noqa: F401 - importing registers the checks

    ctx = ctx or VerifyContext(options)
    every: list[CheckInstance] = []
    for registered in REGISTRY.values():
        every.extend(_instances(registered, ctx))
    known = {i.name for i in every} | {i.check.name for i in every} | {i.member for i in every if i.member}
    unknown = [name for name in options.only if name not in known]
    if unknown:
        raise RefusedError(f"no check named {', '.join(map(repr, unknown))}",
                           hint=f"checks: {', '.join(sorted(i.name for i in every))}")
    plan = []
    for instance in every:
        if not selected(instance.name, instance.check.name, options.only):
            continue
        flag = instance.check.opt_in
        # An opt-in check runs when its flag is set or when --only names it explicitly.
        if flag and not getattr(options, flag) and instance.name not in options.only \
                and instance.check.name not in options.only:
            continue
        plan.append(instance)
    return plan


def _instances(registered: Check, ctx: VerifyContext) -> list[CheckInstance]:
    if registered.each is None:
        return [CheckInstance(registered.name, registered)]
    return [CheckInstance(f"{registered.name}:{member}", registered, member) for member in registered.each(ctx)]


def run_verify(options: VerifyOptions) -> list[CheckResult]:
    """Run the selected checks in registry order; every check yields a result, none raises."""
    ctx = VerifyContext(options)
    results = []
    plan = plan_checks(options, ctx)
    for index, instance in enumerate(plan, start=1):
        slow = instance.is_slow(ctx)
        if options.progress is not None:
            options.progress(CheckProgress(instance.name, index, len(plan), slow))
        results.append(instance.run(ctx))
        if options.progress is not None:
            options.progress(CheckProgress(instance.name, index, len(plan), slow, results[-1]))
    return results


def results_to_json(results: list[CheckResult], target: Target | None = None) -> dict:
    """The `applier verify --json` document; its schema is docs/verify-schema.json."""
    return {
        "format": REPORT_FORMAT,
        "target": str(target.root) if target is not None else None,
        "ok": overall_ok(results),      # false also when nothing was verified (every check SKIPped)
        "summary": summarize(results),
        "checks": [r.to_json() for r in results],
    }
