"""Section 1, the failpoint matrix: apply, revert, overlay install and overlay uninstall killed at every named
failpoint (APPLIER_FAILPOINT, applier/store/failpoints.py; the killed run is a forked child of the test process); then
each of status / list / apply / revert / overlay list / overlay uninstall, as the next command, must finish the run
(journal committed) or roll it back (not yet committed): every file all old or all new, the state agreeing with the
files, no temp file, no empty folder, no pending journal; and revert + overlay uninstall afterwards still bring back
the untouched tree."""
from __future__ import annotations

import pytest

from applier.store import failpoints
from reltools import (FAILPOINT_EXIT, INTERRUPTED, NEXT, cli, consistency_problems, effect_of, fork_cli,
                      make_install, problems_of, removal_problems, restore, set_up, stash, wait_exit)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """(command, failpoint) -> (install, the tree as the kill left it): each kill is made once, every next
    command starts from a byte copy put back at the same path."""
    cache = {}

    def get(command: str, name: str, layout: str = "portable"):
        if (command, name, layout) not in cache:
            folder = tmp_path_factory.mktemp(f"{command}-{name}-{layout}")
            inst = make_install(folder / "t", layout=layout)
            set_up(inst, command)
            log = folder / "killed-run.log"
            pid = fork_cli(*inst.args(*INTERRUPTED[command][0]), env={"APPLIER_FAILPOINT": name}, output=log)
            code = wait_exit(pid)
            assert code == FAILPOINT_EXIT, f"the failpoint {name} was not reached (exit {code}):\n{log.read_text()}"
            cache[command, name, layout] = (inst, stash(inst.root, folder / "killed"))
        return cache[command, name, layout]
    return get


@pytest.mark.parametrize("next_name", list(NEXT))
@pytest.mark.parametrize("name", failpoints.NAMES)
@pytest.mark.parametrize("command", list(INTERRUPTED))
def test_the_next_command_finishes_or_rolls_back(command, name, next_name, killed):
    check_next_command(killed(command, name), command, name, next_name)


@pytest.mark.parametrize("name", failpoints.NAMES)
@pytest.mark.parametrize("command", list(INTERRUPTED))
def test_a_venv_inside_comfyui_recovers_too(command, name, killed):
    """The git-checkout layout, ComfyUI/venv: site-packages lies inside the ComfyUI folder (status as the next
    command; the whole matrix runs on the portable layout, which needs no interpreter)."""
    check_next_command(killed(command, name, "venv"), command, name, "status")


def check_next_command(killed_install, command, name, next_name):
    inst, saved = killed_install
    restore(inst.root, saved)
    out = cli(*inst.args(*NEXT[next_name]))
    assert not problems_of(out, allowed=(0,)), f"{problems_of(out, allowed=(0,))}:\n{out}"
    _, _, before, after = INTERRUPTED[command]
    # the journal is the commit point: a kill before it is rolled back, any later one finished
    resolved = before if name == "after-backups" else after
    problems = consistency_problems(inst, {effect_of(next_name, resolved)})
    assert not problems, "\n".join(problems)
    problems = removal_problems(inst)
    assert not problems, "after the recovery, revert + overlay uninstall:\n" + "\n".join(problems)
