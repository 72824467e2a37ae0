"""Bounded child processes: every program applier runs (the target's interpreter, verify probes, git, nvidia-smi).

`run_bounded` starts the child in a session (process group) of its own with stdin closed, reads its stdout and
stderr incrementally, and ends the whole group with SIGKILL when it runs past its timeout or prints more than its
cap; the caller gets a `ChildResult` or a typed `ChildFailure` saying why in words, never a hang or a traceback.
Output is bytes; `ChildResult.text()` decodes it as strict UTF-8 (anything else is a `ChildFailure` too).

Paths cross the boundary as text: a Python child runs with `-X utf8` (`PYTHON_FLAGS`), so its file system encoding
is UTF-8 with surrogateescape whatever the locale; `text_for_child` / `path_from_child` map this process's paths
to and from that form, byte for byte (LC_ALL=C with a non-ASCII path included).
"""
from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from applier.errors import ChildFailure

DEFAULT_OUTPUT_LIMIT = 1024 * 1024
# After the child itself has exited, how long a grandchild may keep its pipes open before the group is ended.
EXIT_GRACE_S = 2.0
# Every Python child: isolated (no user site, no PYTHON* variables, no current folder on sys.path), UTF-8 mode, and
# no bytecode written (-B): a probe that imports the target's code must not write __pycache__ into the install (a
# __pycache__ or a source folder there may be a link leading anywhere).
PYTHON_FLAGS = ("-I", "-B", "-X", "utf8")
# For children that honour the environment (-I makes a Python child ignore these; -X utf8 covers it then).
UTF8_ENV = {"PYTHONIOENCODING": "utf-8", "PYTHONUTF8": "1"}


@dataclass(frozen=True)
class ChildResult:
    what: str                 # the child in words, for messages ("the interpreter venv/bin/python")
    returncode: int           # negative: killed by that signal
    stdout: bytes
    stderr: bytes             # with stderr_tail, only its last stderr_limit bytes
    duration_s: float
    stderr_truncated: bool = False

    def text(self, stream: str = "stdout") -> str:
        """The stream decoded as strict UTF-8; ChildFailure("... not UTF-8 ...") otherwise."""
        return decode_utf8(getattr(self, stream), self.what, stream)


def decode_utf8(data: bytes, what: str, stream: str = "stdout") -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ChildFailure(f"{what} printed bytes that are not UTF-8 on {stream} (byte {exc.start}: "
                           f"{data[exc.start:exc.start + 1]!r})", reason="not-utf8") from None


def child_env(extra: dict[str, str | None] | None = None, *, drop: tuple[str, ...] = ()) -> dict[str, str]:
    """This process's environment for a child: `drop` removed, UTF-8 I/O asked for, then `extra` (None removes)."""
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(UTF8_ENV)
    for key, value in (extra or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def text_for_child(path: str | os.PathLike) -> str:
    """A path as a UTF-8-mode Python child spells it (the same bytes on disk, whatever this process's locale)."""
    return os.fsencode(path).decode("utf-8", "surrogateescape")


def path_from_child(text: str) -> Path:
    """A path a UTF-8-mode Python child printed, as this process names the same bytes. ValueError when the text
    holds something no file name can (a NUL, a lone surrogate outside surrogateescape's range)."""
    if "\0" in text:
        raise ValueError("a NUL in a path")
    try:
        return Path(os.fsdecode(text.encode("utf-8", "surrogateescape")))
    except UnicodeError as exc:
        raise ValueError(f"not a file name: {exc}") from None


def timeout_from_env(default: float, variable: str) -> float:
    """`default`, lowered (never raised) by a positive number of seconds in the environment variable."""
    raw = os.environ.get(variable)
    try:
        value = float(raw) if raw else None
    except ValueError:
        value = None
    return min(default, value) if value is not None and value > 0 else default


def run_bounded(argv: list[str | os.PathLike], *, timeout: float, what: str | None = None,
                stdout_limit: int = DEFAULT_OUTPUT_LIMIT, stderr_limit: int = DEFAULT_OUTPUT_LIMIT,
                stderr_tail: bool = False, env: dict[str, str] | None = None,
                cwd: str | os.PathLike | None = None) -> ChildResult:
    """Run argv to completion within `timeout` seconds and at most the limits of output (bytes per stream).

    Past the timeout, or past a limit, the child's whole process group is killed and ChildFailure raised
    (reason "timeout" / "overflow"); a child that cannot start is ChildFailure("cannot-start"). With stderr_tail,
    stderr past its limit is not an error: only its last stderr_limit bytes are kept. A non-zero exit is no error
    here: the caller reads `returncode`."""
    what = what or os.fsdecode(os.path.basename(os.fsencode(argv[0])))
    started = time.monotonic()
    try:
        proc = subprocess.Popen([os.fspath(a) for a in argv], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env, cwd=cwd, **_own_group())
    except (OSError, ValueError, subprocess.SubprocessError) as exc:   # ValueError: a NUL in an argument
        reason = getattr(exc, "strerror", None) or str(exc)
        raise ChildFailure(f"cannot start {what}: {reason}", reason="cannot-start") from None
    try:
        if sys.platform == "win32":   # pragma: no cover - no selectable pipes: bounded in time only
            out, err, truncated = _collect_windows(proc, timeout, what)
        else:
            out, err, truncated = _collect(proc, started + timeout, timeout, what, stdout_limit, stderr_limit,
                                           stderr_tail)
    finally:
        _end(proc)
    return ChildResult(what, proc.returncode, out, err, time.monotonic() - started, truncated)


def _collect(proc: subprocess.Popen, deadline: float, timeout: float, what: str, stdout_limit: int,
             stderr_limit: int, stderr_tail: bool) -> tuple[bytes, bytes, bool]:
    buffers = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    limits = {proc.stdout: stdout_limit, proc.stderr: stderr_limit}
    names = {proc.stdout: "stdout", proc.stderr: "stderr"}
    truncated = False
    with selectors.DefaultSelector() as selector:
        for stream in buffers:
            os.set_blocking(stream.fileno(), False)
            selector.register(stream, selectors.EVENT_READ)
        exited_at = None
        while selector.get_map():
            now = time.monotonic()
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > EXIT_GRACE_S:
                _kill_group(proc)   # the child is done; a grandchild still holding its pipes ends with the group
                break
            if now >= deadline:
                _kill_group(proc)
                raise ChildFailure(f"{what} did not finish within {timeout:g} s (killed)", reason="timeout",
                                   stderr=bytes(buffers[proc.stderr]))
            wait = min(deadline - now, 0.1 if exited_at is None else EXIT_GRACE_S)
            for key, _ in selector.select(wait):
                stream = key.fileobj
                try:
                    chunk = os.read(stream.fileno(), 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    selector.unregister(stream)
                    continue
                buffer = buffers[stream]
                buffer += chunk
                if len(buffer) > limits[stream]:
                    if stream is proc.stderr and stderr_tail:
                        del buffer[:len(buffer) - limits[stream]]
                        truncated = True
                        continue
                    _kill_group(proc)
                    raise ChildFailure(f"{what} printed more than {_size(limits[stream])} on {names[stream]} "
                                       "(killed)", reason="overflow", stderr=bytes(buffers[proc.stderr]))
    remaining = deadline - time.monotonic()
    try:
        proc.wait(timeout=max(remaining, 0.01))
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise ChildFailure(f"{what} did not finish within {timeout:g} s (killed)", reason="timeout",
                           stderr=bytes(buffers[proc.stderr])) from None
    return bytes(buffers[proc.stdout]), bytes(buffers[proc.stderr]), truncated


def _collect_windows(proc: subprocess.Popen, timeout: float, what: str):   # pragma: no cover
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise ChildFailure(f"{what} did not finish within {timeout:g} s (killed)", reason="timeout") from None
    return out, err, False


def _own_group() -> dict:
    # A group of its own lets a timeout end the child's children too (a compile worker, a server it started).
    if sys.platform == "win32":   # pragma: no cover
        return {"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP}
    return {"start_new_session": True}


def _kill_group(proc: subprocess.Popen) -> None:
    if sys.platform != "win32":
        try:
            os.killpg(proc.pid, signal.SIGKILL)   # the session leader's pid is the group's id
            return
        except (ProcessLookupError, PermissionError):
            pass
    try:
        proc.kill()
    except OSError:
        pass


def _end(proc: subprocess.Popen) -> None:
    """Leave nothing behind: a child still running is killed with its group, then reaped; the pipes are closed."""
    if proc.poll() is None:
        _kill_group(proc)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:   # pragma: no cover - SIGKILL does not wait for anyone
        pass
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def _size(limit: int) -> str:
    for unit, size in (("MiB", 1024 * 1024), ("KiB", 1024)):
        if limit % size == 0:
            return f"{limit // size} {unit}"
    return f"{limit} bytes"
