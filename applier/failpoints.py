"""Named failpoints: APPLIER_FAILPOINT=<name> makes the process exit abruptly (os._exit) at that step.

Used by the tests to kill apply and revert at every step and prove the next command recovers. Names:
    after-backups      originals backed up, journal not yet written (no target file changed)
    after-journal      journal committed, no target file changed yet
    after-first-file   the first target file replaced
    after-files        every target file replaced, state not yet written
    after-state        state written, journal not yet removed
"""
from __future__ import annotations

import os

NAMES = ("after-backups", "after-journal", "after-first-file", "after-files", "after-state")
EXIT_CODE = 77


def failpoint(name: str) -> None:
    assert name in NAMES, name
    if os.environ.get("APPLIER_FAILPOINT") == name:
        os._exit(EXIT_CODE)
