#!/usr/bin/python
"""Ansible module `applier`: apply or revert applier's catalog patches on one ComfyUI / PyTorch install.

It runs the `applier` CLI on the managed host and reads its `--json` output; nothing of applier is imported, so the
module works with any applier that is installed there (`pipx install ...`), whatever Python runs the module.
"""
from __future__ import annotations

import json
import os

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
---
module: applier
short_description: Apply or revert applier's patches on a ComfyUI / PyTorch install
description:
  - Runs C(applier apply) or C(applier revert) with C(--json) on the managed host against one target folder.
  - Idempotent. A patch that is already applied, or a file that already holds its original bytes, is not a change.
  - Check mode runs the same command with C(--dry-run). Nothing is written; C(changed) says what would change.
options:
  target:
    description: The install to patch (a ComfyUI folder, a portable install, or a venv / prefix for torch only).
    type: path
    required: true
  state:
    description: C(applied) applies the patches that fit; C(reverted) restores the original bytes.
    type: str
    choices: [applied, reverted]
    default: applied
  only:
    description: Patch ids (C(comfyui/max-resolution)) or components (C(comfyui), C(torch)); empty means all.
    type: list
    elements: str
    default: []
  applier:
    description: The applier executable on the managed host (a name looked up on PATH, or a path).
    type: str
    default: applier
  python:
    description: The target's Python interpreter, when detection should not pick it (C(--python)).
    type: path
  patches:
    description: Another catalog folder on the managed host (C(--patches)).
    type: path
notes:
  - C(changed) comes from applier's JSON. For C(applied), any patch whose action is C(apply). For C(reverted),
    any file whose bytes the revert changes (restored, reversed-diff, deleted, forced).
  - A failure reports applier's own error message and hint, and its exit code as C(rc), documented in applier's
    README (3 refused, 4 locked, 5 drift, 7 corrupt state, 8 I/O, 9 bad target).
"""

EXAMPLES = r"""
- name: Patch every ComfyUI of the render node
  applier:
    target: /srv/comfy/ComfyUI
    only: [comfyui/max-resolution, comfyui/oom-retry]

- name: Back to the original bytes before updating ComfyUI
  applier:
    target: /srv/comfy/ComfyUI
    state: reverted
"""

RETURN = r"""
patches:
  description: The C(patches) list of applier's JSON (apply gives id, action, variant...; revert gives id, files).
  returned: success
  type: list
changed_patches:
  description: Ids of the patches this run applied or reverted (or would, in check mode).
  returned: success
  type: list
cmd:
  description: The applier command that ran.
  returned: always
  type: list
rc:
  description: applier's exit code (0 on success; on failure the code its README documents).
  returned: when applier apply or revert ran
  type: int
"""

COMPONENTS = ("comfyui", "torch")
# Revert file actions that leave a file's bytes as they were; every other action ("restored", "reversed-diff",
# "deleted", "forced") writes the file.
REVERT_NO_CHANGE = frozenset({"unchanged", "lost"})


def applied_changes(payload: dict) -> list[str]:
    """Ids of the patches an `applier apply --json` run applied (or, with --dry-run, would apply)."""
    return [p["id"] for p in payload.get("patches", []) if p.get("action") == "apply"]


def reverted_changes(payload: dict) -> list[str]:
    """Ids of the patches an `applier revert --json` run changed a file of (or, with --dry-run, would)."""
    return [p["id"] for p in payload.get("patches", [])
            if any(f.get("action") not in REVERT_NO_CHANGE for f in p.get("files", []))]


def recorded_selection(status_payload: dict, only: list[str]) -> list[str]:
    """The entries of `only` that name something recorded as applied, or that applier does not know (so that
    `applier revert` itself refuses them with its own message). An empty list: nothing selected is applied."""
    listed = {p["id"] for p in status_payload.get("patches", [])}
    recorded = {p["id"] for p in status_payload.get("patches", []) if p.get("recorded")}
    keep = []
    for name in only:
        if name in COMPONENTS:
            if any(r.split("/", 1)[0] == name for r in recorded):
                keep.append(name)
        elif name in recorded or name not in listed:
            keep.append(name)
    return keep


def error_of(stdout: str, stderr: str, rc: int) -> dict:
    """fail_json arguments from a failed run: applier's JSON error when it printed one, its stderr otherwise."""
    try:
        error = json.loads(stdout).get("error") or {}
    except (ValueError, AttributeError):
        error = {}
    message = error.get("message") or (stderr.strip() or stdout.strip() or f"applier exited with status {rc}")
    out = {"msg": message, "rc": rc, "stderr": stderr}
    if error.get("hint"):
        out["hint"] = error["hint"]
        out["msg"] = f"{message} (hint: {error['hint']})"
    if error.get("kind"):
        out["kind"] = error["kind"]
    return out


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            target=dict(type="path", required=True),
            state=dict(type="str", choices=["applied", "reverted"], default="applied"),
            only=dict(type="list", elements="str", default=[]),
            applier=dict(type="str", default="applier"),
            python=dict(type="path"),
            patches=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    executable = os.path.expanduser(params["applier"])
    if "/" not in executable:
        executable = module.get_bin_path(executable, required=True)
    common = ["--target", params["target"], "--json"]
    if params["python"]:
        common += ["--python", params["python"]]
    if params["patches"]:
        common += ["--patches", params["patches"]]

    def run(args: list[str]) -> tuple[list[str], dict]:
        cmd = [executable, *args]
        rc, stdout, stderr = module.run_command(cmd)
        if rc != 0:
            module.fail_json(cmd=cmd, **error_of(stdout, stderr, rc))
        try:
            return cmd, json.loads(stdout)
        except ValueError:
            module.fail_json(msg="applier printed no JSON", cmd=cmd, rc=rc, stdout=stdout, stderr=stderr)

    only = list(params["only"])
    if params["state"] == "reverted" and only:
        # `applier revert --only ID` refuses an id that is not applied; for a play, "already reverted" is success.
        status_cmd = [executable, "status", *common]
        rc, stdout, stderr = module.run_command(status_cmd)
        try:
            status = json.loads(stdout)
        except ValueError:
            status = None
        if status is None or "patches" not in status:   # status exits 5 on drift, with its report
            module.fail_json(cmd=status_cmd, **error_of(stdout, stderr, rc))
        only = recorded_selection(status, only)
        if not only:   # no rc here: Ansible fails a result whose rc is not 0, and status exits 5 on drift
            module.exit_json(changed=False, patches=[], changed_patches=[], cmd=status_cmd,
                             msg="nothing selected is recorded as applied")

    verb = "apply" if params["state"] == "applied" else "revert"
    args = [verb, *common, *(arg for name in only for arg in ("--only", name))]
    if module.check_mode:
        args.append("--dry-run")
    cmd, payload = run(args)
    changed = applied_changes(payload) if verb == "apply" else reverted_changes(payload)
    for warning in payload.get("warnings") or []:
        module.warn(str(warning))
    module.exit_json(changed=bool(changed), changed_patches=changed, patches=payload.get("patches", []),
                     cmd=cmd, rc=0)


if __name__ == "__main__":
    main()
