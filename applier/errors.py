"""Exceptions of the core, each carrying the stable exit code the CLI uses for it.

Exit codes (documented in README.md, stable):
    0  success, or nothing to do
    1  unexpected internal error
    2  usage error (Click), or an environment variable applier reads holding a value it cannot use (settings.py)
    3  refused: a hunk conflicts, no variant fits, an unsafe path, a binary diff, a catalog entry that cannot be
       read or is past the catalog's bounds, a folder of the overlay pack's name applier did not install
    4  the target is locked by another applier run (the message names the holder the lock file records, and says
       when that process no longer runs)
    5  drift: a file changed since apply (revert refuses without --force); status found lost/modified patches
    6  verify: at least one check FAILed
    7  the state folder is corrupt, of an unknown format or a newer applier's (the message names the version that
       wrote it), holds a link or a special file, or a tree deeper or
       larger than any applier makes
    8  I/O: permission denied (anywhere, the state folder's own files included), disk full, a file that cannot be
       read or written; a link leading out of the install met at a write (the run's files are rolled back first).
       The message says what is on disk: "nothing was changed" only where that is so, else what was done and what
       the next command finishes
    9  bad target: the folder does not exist or holds nothing applier recognises; --target names a file, or a
       folder holding several ComfyUI installs; the interpreter given with --python does not exist, is a folder,
       or is not a usable Python interpreter (it could not start, timed out, printed too much, printed bytes that
       are not UTF-8, or answered applier's query with JSON of the wrong shape). An interpreter found by layout
       (venv/) that is not usable is a note, not an error: commands that do not need it still run.
  130  interrupted by Ctrl-C (SIGINT); 143 terminated by SIGTERM: the next command finishes or rolls back what
       was in flight, as after a kill
"""
from __future__ import annotations

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_LOCKED = 4
EXIT_DRIFT = 5
EXIT_VERIFY_FAILED = 6
EXIT_STATE_CORRUPT = 7
EXIT_IO = 8
EXIT_BAD_TARGET = 9
EXIT_INTERRUPTED = 130     # Ctrl-C (SIGINT): the shell's 128 + 2; the next command recovers, as after a kill
EXIT_TERMINATED = 143      # SIGTERM: 128 + 15


class ApplierError(Exception):
    """Base of every error the CLI reports as a message (never a traceback)."""

    exit_code = EXIT_INTERNAL

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


class RefusedError(ApplierError):
    exit_code = EXIT_REFUSED


class DiffParseError(RefusedError):
    """The patch text is not a unified diff we can apply (or it is a binary diff)."""


class HunkConflict(RefusedError):
    """A hunk matches neither the pre-image nor the post-image of the file."""

    def __init__(self, path: str, hunk_index: int, header: str, expected: list[str],
                 near_line: int | None, near_text: list[str], reason: str):
        self.path = path
        self.hunk_index = hunk_index
        self.header = header
        self.expected = expected
        self.near_line = near_line
        self.near_text = near_text
        self.reason = reason
        lines = [f"{path}: hunk #{hunk_index} {header}: {reason}", "  expected:"]
        lines += [f"    |{line}" for line in expected]
        if near_line is not None:
            lines.append(f"  best near-match at line {near_line}:")
            lines += [f"    |{line}" for line in near_text]
        else:
            lines.append("  no near-match found in the file")
        super().__init__("\n".join(lines))


class UnsafePathError(RefusedError):
    pass


class NoVariantError(RefusedError):
    pass


class LockedError(ApplierError):
    exit_code = EXIT_LOCKED


class DriftError(ApplierError):
    exit_code = EXIT_DRIFT


class StateCorruptError(ApplierError):
    exit_code = EXIT_STATE_CORRUPT


class IOFailure(ApplierError):
    exit_code = EXIT_IO


class BadTargetError(ApplierError):
    exit_code = EXIT_BAD_TARGET


class BadInterpreterError(BadTargetError):
    """The interpreter given with --python is missing, a folder, or not a usable Python interpreter."""


class ChildFailure(ApplierError):
    """A program applier ran (the target's interpreter, a probe, git, nvidia-smi) could not start, ran past its
    timeout or printed more than its cap (its process group was killed), or printed bytes that are not UTF-8.
    `reason` is one of "cannot-start", "timeout", "overflow", "not-utf8". Callers turn it into what it means for
    them (a probe's FAIL, an unknown GPU, an unusable interpreter); one that escapes is a bad target (exit 9)."""

    exit_code = EXIT_BAD_TARGET

    def __init__(self, message: str, *, reason: str, stderr: bytes = b"", hint: str | None = None):
        super().__init__(message, hint=hint)
        self.reason = reason
        self.stderr = stderr
