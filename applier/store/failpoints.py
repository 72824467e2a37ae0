"""Named failpoints: APPLIER_FAILPOINT=<name> makes the process exit abruptly (os._exit) at that step.

Used by the tests to kill apply and revert at every step and prove the next command recovers. Hooks are the
in-process counterpart for race tests: a test registers a function for a hook point (`HOOKS["before-write"]`,
called with the Place about to be written, after every check of the run; `HOOKS["before-state"]`, called with the
run's RunEnds before the state and manifest are recorded; writer.carry_out calls them through call_hook) and swaps
a link in there, deterministically, where a real attacker would need to win a race. Failpoint names:
    after-backups      originals backed up, journal not yet written (no target file changed)
    after-journal      journal committed, no target file changed yet
    after-first-file   the first target file replaced
    after-files        every target file replaced, state not yet written
    after-state        state written, journal not yet removed
and, of `overlay export` (EXPORT_NAMES):
    export-staged      every file in the staging folder, nothing moved into place yet
    export-file-moved  into an earlier export: after each file renamed into place
"""
from __future__ import annotations

import os

from applier.settings import EXPORT_FAILPOINTS as EXPORT_NAMES
from applier.settings import RUN_FAILPOINTS as NAMES

EXIT_CODE = 77


HOOK_NAMES = ("before-write", "before-state")
HOOKS: dict = {}       # {hook name: callable}; empty outside tests


def call_hook(name: str, arg) -> None:
    """The race tests' hook at this point of the run (HOOKS; none outside tests)."""
    assert name in HOOK_NAMES, name
    function = HOOKS.get(name)
    if function is not None:
        function(arg)


def failpoint(name: str) -> None:
    assert name in NAMES or name in EXPORT_NAMES, name
    if os.environ.get("APPLIER_FAILPOINT") == name:
        os._exit(EXIT_CODE)
