"""Outcomes are enums whose members are their JSON strings, and every match over one handles each member."""
from __future__ import annotations

import json

import pytest

from applier.budget import VerdictKind
from applier.catalog.check import CellState
from applier.catalog.planner import PlanAction
from applier.cli import patches
from applier.diffengine import FileState, HunkReport, HunkState
from applier.operations import FileOutcome, backup_done_with
from applier.pack.node_pack import Installer
from applier.status import DRIFT, STATES, PatchState, installed_by_words

ENUMS = (PlanAction, FileOutcome, PatchState, Installer, VerdictKind, HunkState, FileState, CellState)


@pytest.mark.parametrize("enum", ENUMS, ids=lambda e: e.__name__)
def test_an_outcome_is_its_string_in_json_in_text_and_in_comparisons(enum):
    for member in enum:
        assert member == member.value and f"{member}" == member.value and str(member) == member.value
        assert json.dumps({"action": member}) == json.dumps({"action": member.value})


def test_status_states_and_drift_are_the_members_of_patch_state():
    assert STATES == ("applied", "not-applied", "lost", "modified", "partial", "conflict", "not-applicable")
    assert set(DRIFT) == {"lost", "modified"}


def test_every_file_outcome_is_worded_and_decides_its_backup():
    kept = {member for member in FileOutcome if not backup_done_with(member)}
    assert kept == {FileOutcome.LOST, FileOutcome.FORGOTTEN, FileOutcome.ACCEPTED}
    verbs = {member: patches.dry_run_verb(member) for member in FileOutcome}
    assert verbs[FileOutcome.RESTORED] == "would restore" and verbs[FileOutcome.LOST] == "lost"


def test_every_plan_action_and_patch_state_is_worded():
    assert [patches.plan_verb(action, False) for action in PlanAction] == ["applied", "already applied",
                                                                           "not applicable"]
    assert patches.plan_verb(PlanAction.APPLY, True) == "would apply"
    assert {state: patches.state_color(state) for state in PatchState} == {
        "applied": "green", "not-applied": None, "lost": "yellow", "modified": "yellow", "partial": None,
        "conflict": "red", "not-applicable": None}
    assert all(installed_by_words(installer) for installer in Installer)


def test_every_hunk_state_is_worded_for_each_plan_action():
    for action in PlanAction:
        for state in HunkState:
            line = patches.hunk_line(HunkReport("f.py", 1, state, 3), action, dry_run=False)
            assert line.endswith(" at line 3")
    assert patches.hunk_line(HunkReport("f.py", 1, HunkState.NOT_APPLIED, None), PlanAction.APPLY, True) == \
        "would apply at new file"
