"""The check registry: outcomes, results, and the `@check` decorator that names each check.

A check is a function of the verify context returning one `CheckResult`. A check declared with `each=` is a family:
`each(ctx)` lists its members (e.g. one per catalog patch) and the check runs once per member as "<name>:<member>".
"""
from __future__ import annotations

import enum
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable


class Outcome(str, enum.Enum):
    PASS = "PASS"
    FAIL = "FAIL"
    WARN = "WARN"     # something the user should know; never fails the run
    SKIP = "SKIP"     # nothing was verified (and it is never counted as a PASS)


@dataclass
class CheckResult:
    name: str
    outcome: Outcome
    reason: str
    numbers: dict[str, Any] = field(default_factory=dict)
    stderr: str = ""              # the tail of a probe's stderr, for the report
    duration_s: float = 0.0

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "outcome": self.outcome.value,
            "reason": self.reason,
            "numbers": self.numbers,
            "stderr": self.stderr,
            "duration_s": round(self.duration_s, 3),
        }


@dataclass(frozen=True)
class Check:
    name: str
    description: str
    slow: bool | Callable[[Any], bool]   # a callable decides per run (e.g. slow only with --real-import)
    func: Callable[..., CheckResult]
    each: Callable[[Any], Iterable[str]] | None = None   # members of a family; None for a single check
    opt_in: str | None = None    # the VerifyOptions flag that enables the check ("kernels"); None: always on


@dataclass(frozen=True)
class CheckInstance:
    """One runnable check: a single check, or one member of a family."""
    name: str
    check: Check
    member: str | None = None

    def is_slow(self, ctx) -> bool:
        return bool(self.check.slow(ctx)) if callable(self.check.slow) else bool(self.check.slow)

    def run(self, ctx) -> CheckResult:
        """Run the check; an exception inside it becomes a FAIL with the traceback, never a crash of verify."""
        started = time.monotonic()
        try:
            result = self.check.func(ctx) if self.member is None else self.check.func(ctx, self.member)
            if not isinstance(result, CheckResult):
                raise TypeError(f"check {self.name} returned {type(result).__name__}, not CheckResult")
        except Exception as exc:   # noqa: BLE001 - a broken check is reported as that check's failure
            result = CheckResult(self.name, Outcome.FAIL, f"the check itself crashed: {type(exc).__name__}: {exc}",
                                 stderr=traceback.format_exc()[-4000:])
        result.name = self.name
        if not result.duration_s:
            result.duration_s = time.monotonic() - started
        return result


REGISTRY: dict[str, Check] = {}


def check(name: str, description: str, slow: bool | Callable[[Any], bool] = False, *,
          each: Callable[[Any], Iterable[str]] | None = None, opt_in: str | None = None):
    """Register the decorated function as the check `name` (a family "<name>:<member>" when `each` is given)."""
    def register(func: Callable[..., CheckResult]) -> Callable[..., CheckResult]:
        if name in REGISTRY:
            raise ValueError(f"check {name!r} registered twice")
        REGISTRY[name] = Check(name, description, slow, func, each, opt_in)
        return func
    return register


def selected(instance_name: str, family: str, only: tuple[str, ...]) -> bool:
    """Whether --only asks for this check: its exact name, its family ("effect"), or a family member's key
    ("torch/stream-priority" selects "effect:torch/stream-priority")."""
    if not only:
        return True
    member = instance_name.split(":", 1)[1] if ":" in instance_name else None
    return any(want in (instance_name, family) or (member is not None and want == member) for want in only)


def overall_ok(results: Iterable[CheckResult]) -> bool:
    """True iff no check FAILed and something was verified: WARN and some SKIPs leave the exit status at 0, but a
    run where every check SKIPped proved nothing and must not read as success (`verify --only effect` on a target
    without a usable interpreter)."""
    results = list(results)
    return all(r.outcome is not Outcome.FAIL for r in results) and not nothing_verified(results)


def nothing_verified(results: Iterable[CheckResult]) -> bool:
    """At least one check ran and every one of them SKIPped."""
    results = list(results)
    return bool(results) and all(r.outcome is Outcome.SKIP for r in results)


def summarize(results: Iterable[CheckResult]) -> dict[str, int]:
    counts = {outcome.value: 0 for outcome in Outcome}
    for result in results:
        counts[result.outcome.value] += 1
    return counts
