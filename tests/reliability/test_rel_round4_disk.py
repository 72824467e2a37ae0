"""Reliability round 4 (issue 49): every writing verb on a full disk. Free space (or, without a tmpfs of the test's
own, the size cap of each written file) is swept around the point where the verb starts to succeed: at every case the
verb ends in 0 or a documented code without a traceback, a "nothing was changed" is true to the byte (tree and
`.applier/`), once space is back the next command leaves a whole state with no journal and no temp file, and the
verb's retry succeeds. `overlay export` never leaves a half-made folder, and its retry works."""
from __future__ import annotations


import pytest

from reltools import (assert_clean, classify, cli, make_install, problems_of, record_figure, restore,
                      snapshot, stash, state_files, strays)
from smalldisk import SmallDisk, sweep

pytestmark = pytest.mark.slow

NOTHING = "nothing was changed"


@pytest.fixture
def disk(tmp_path):
    small = SmallDisk(tmp_path / "disk")
    yield small
    small.close()


def edit_outside_hunks(inst) -> None:
    nodes = inst.comfy / "nodes.py"
    nodes.write_bytes(nodes.read_bytes() + b"# a user's line\n")


# verb -> (argv, set-up steps, whole state before, whole state after (None: the tree's files do not change))
VERBS = {
    "apply": (("apply",), (), ("original", "absent"), ("patched", "absent")),
    "revert": (("revert",), (("apply",),), ("patched", "absent"), ("original", "absent")),
    "forget": (("revert", "--forget"), (("apply",),), ("patched", "absent"), None),
    "accept": (("accept", "--only", "comfyui/maxres"), (("apply",), edit_outside_hunks), None, None),
    "clean": (("clean",), (("apply",), ("revert",)), ("original", "absent"), None),
    "overlay-install": (("overlay", "install"), (), ("original", "absent"), ("original", "installed")),
    "overlay-uninstall": (("overlay", "uninstall"), (("overlay", "install"),), ("original", "installed"),
                          ("original", "absent")),
}


def set_up(inst, steps) -> None:
    for step in steps:
        if callable(step):
            step(inst)
        else:
            assert_clean(cli(*inst.args(*step)), allowed=(0,))


def judge(inst, verb: str, out, before_tree, before_state) -> list[str]:
    """What is wrong with one case, looked at once the space is back."""
    argv, _, whole_before, whole_after = VERBS[verb]
    found = problems_of(out, allowed=(0, 8))
    if out.code != 0 and NOTHING in out.text and (snapshot(inst.root) != before_tree
                                                  or state_files(inst) != before_state):
        found.append(f"says '{NOTHING}' but the tree or .applier/ changed: {out.text.strip()[-300:]}")
    if out.code != 0 and NOTHING not in out.text and "next applier command" not in out.text:
        found.append(f"a failure that neither says '{NOTHING}' nor what the next command finishes: "
                     f"{out.text.strip()[-300:]}")
    status = cli(*inst.args("status", "--json"))        # the next command: finishes or rolls back
    if status.code not in (0, 5) or problems_of(status, allowed=(0, 5)):
        found.append(f"status afterwards: {status}")
    if inst.journal.exists():
        found.append("a journal still pending after the next command")
    if strays(inst.root):
        found.append(f"temp files left: {strays(inst.root)}")
    if whole_before is not None:
        whole, why = classify(inst)
        allowed = {whole_before, whole_after or whole_before}
        if out.code == 0:
            allowed = {whole_after or whole_before}
        if whole not in allowed:
            found.append(f"after the next command: {whole or why}, expected one of {sorted(allowed)}")
    if out.code != 0:
        retry = cli(*inst.args(*argv))
        if retry.code != 0:
            found.append(f"the retry with space back: {retry}")
    return found


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_every_writing_verb_on_a_full_disk(disk, tmp_path, verb):
    inst = make_install(disk.where / "t", layout="portable")
    set_up(inst, VERBS[verb][1])
    saved = stash(inst.root, tmp_path / "saved")
    before_tree = snapshot(inst.root)
    before_state = state_files(inst)

    def attempt(n: int):
        restore(inst.root, saved)
        disk.set(n)
        try:
            out = disk.run(*inst.args(*VERBS[verb][0]))
        finally:
            disk.release()
        return out.code, judge(inst, verb, out, before_tree, before_state)

    result = sweep(verb, attempt, top=disk.free() - (1 << 20) if disk.mode == "tmpfs" else 1 << 20,
                   floor=disk.floor)
    record_figure("round4-disk", mode=disk.mode, **result.figure())
    assert not result.problems(), "\n".join(result.problems()[:10])
    if result.threshold > disk.floor:     # clean only removes: it succeeds with no byte free (or files capped)
        assert any(code != 0 for _, code, _ in result.cases), "the sweep never made the verb fail"
