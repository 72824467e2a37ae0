"""A small file system for the free-space sweeps of reliability round 4 (issue 49), and the sweep itself.

Where the suite runs as root and may mount, the test mounts a tmpfs of its own (SmallDisk) and leaves a chosen number
of bytes free by filling the rest with one file: the command then meets ENOSPC wherever the space runs out. Elsewhere
the command runs in a forked child whose RLIMIT_FSIZE caps every file it writes (EFBIG past it, SIGXFSZ ignored), the
sweep then moving that cap instead of the free space. Neither possible: the test is skipped with the reason. APPLIER_SMALLDISK=fsize chooses the size cap as root too.

The sweep finds the threshold (the least free space, or cap, at which the command succeeds) by bisection in pages,
then tries every page just below and at it, where the last writes fail, and a random sample of the pages below.
"""
from __future__ import annotations

import os
import random
import resource
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from reltools import Outcome, cli, fork_cli, wait_exit

PAGE = 4096


def can_mount() -> str | None:
    """None when a tmpfs can be mounted here, else why not."""
    if os.geteuid() != 0:
        return "not root: no tmpfs of the test's own"
    if shutil.which("mount") is None or shutil.which("umount") is None:
        return "no mount(8) on this machine"
    return None


class SmallDisk:
    """A tmpfs of `size` bytes mounted at `where` (mode "tmpfs"), or, where that cannot be, the folder as it is with
    every file a command writes capped by RLIMIT_FSIZE (mode "fsize"). set(n): n bytes free (or the cap n);
    release(): all of it back. run(args): the CLI under that limit."""

    def __init__(self, where: Path, size: int = 8 << 20):
        self.where = Path(where)
        self.where.mkdir(parents=True, exist_ok=True)
        self.filler = None
        self.limit: int | None = None
        why = can_mount() if os.environ.get("APPLIER_SMALLDISK") != "fsize" else "APPLIER_SMALLDISK=fsize"
        if why is None:
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "applier-test",
                                   str(self.where)], capture_output=True, text=True)
            why = None if done.returncode == 0 else f"mount failed: {done.stderr.strip()[:200]}"
        self.mode = "tmpfs" if why is None else "fsize"
        # the least value swept: under a cap of 0 the command could not even write its message (its output file is
        # capped too), which is no full disk
        self.floor = 0 if self.mode == "tmpfs" else PAGE
        self.why_not_tmpfs = why
        if self.mode == "tmpfs":
            self.filler = self.where / ".filler"

    def close(self) -> None:
        self.release()
        if self.mode == "tmpfs":
            subprocess.run(["umount", "-l", str(self.where)], capture_output=True)

    def free(self) -> int:
        st = os.statvfs(self.where)
        return st.f_bavail * st.f_frsize

    def set(self, n: int) -> None:
        """Leave n bytes free (tmpfs), or cap every written file at n bytes (fsize)."""
        self.release()
        if self.mode == "fsize":
            self.limit = n
            return
        fill = self.free() - n
        if fill <= 0:
            return
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.posix_fallocate(fd, 0, fill)
        finally:
            os.close(fd)

    def release(self) -> None:
        self.limit = None
        if self.filler is not None and self.filler.exists():
            self.filler.unlink()

    def run(self, *args) -> Outcome:
        if self.limit is None:
            return cli(*args)
        out = self.where.parent / f".out-{os.getpid()}"
        limit = self.limit

        def capped():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))

        pid = fork_cli(*args, output=out, before=capped)
        code = wait_exit(pid, 120)
        text = out.read_text(errors="replace") if out.exists() else ""
        return Outcome(tuple(str(a) for a in args), code if code is not None else -1, text, "")


@dataclass
class Sweep:
    """The cases of one verb's sweep: (bytes, outcome's exit code, problems) each, and the threshold found."""
    verb: str
    cases: list = field(default_factory=list)
    threshold: int | None = None

    @property
    def held(self) -> int:
        return sum(1 for _, _, problems in self.cases if not problems)

    def problems(self) -> list[str]:
        return [f"{self.verb} at {n} bytes: exit {code}: {p}" for n, code, problems in self.cases for p in problems]

    def figure(self) -> dict:
        return {"verb": self.verb, "tried": len(self.cases), "held": self.held, "threshold_bytes": self.threshold,
                "failed_runs": sum(1 for _, code, _ in self.cases if code != 0)}


def sweep(verb: str, attempt, top: int, *, floor: int = 0, near: int = 4, sample: int = 6, seed: int = 49) -> Sweep:
    """attempt(n) -> (exit code, problems) for n bytes (free or cap). top: a value at which the command succeeds.
    Bisects (in pages) for the least one where it succeeds, then tries the `near` pages below it and it, and
    `sample` random pages further down (floor, the least value tried, among them)."""
    result = Sweep(verb)
    tried: dict[int, int] = {}

    def one(pages: int) -> int:
        if pages not in tried:
            code, problems = attempt(pages * PAGE)
            tried[pages] = code
            result.cases.append((pages * PAGE, code, problems))
        return tried[pages]

    low = floor // PAGE
    lo, hi = low - 1, max(low + 1, top // PAGE)
    if one(hi) != 0:
        result.cases[-1][2].append(f"does not succeed with {hi * PAGE} bytes, the sweep's top")
        return result
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if one(mid) == 0:
            hi = mid
        else:
            lo = mid
    result.threshold = hi * PAGE
    rng = random.Random(seed)
    below = list(range(low, max(low, hi - near)))
    for pages in sorted({*range(max(low, hi - near), hi + 1), low, *rng.sample(below, min(sample, len(below)))}):
        one(pages)
    return result
