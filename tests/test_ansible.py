"""contrib/ansible: the `applier` Ansible module, run by a real ansible-playbook against localhost (local connection)
on two ComfyUI-shaped trees, and its JSON-to-`changed` logic on its own."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.fixtures.comfy_tree import build_comfy_tree

REPO = Path(__file__).resolve().parent.parent
LIBRARY = REPO / "contrib" / "ansible" / "library"
MODULE_FILE = LIBRARY / "applier.py"
EXAMPLE_PLAYBOOK = REPO / "contrib" / "ansible" / "playbook.yml"
COMFY_IDS = ("comfyui/max-resolution", "comfyui/oom-retry", "comfyui/pil-pixel-limit")
RECAP = re.compile(r"^localhost\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


def ansible_tool(name: str) -> str | None:
    """The ansible-core executable beside this interpreter (the test extra installs it into .venv), else on PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.is_file() else shutil.which(name)


ANSIBLE_PLAYBOOK = ansible_tool("ansible-playbook")
needs_ansible = pytest.mark.skipif(ANSIBLE_PLAYBOOK is None,
                                   reason="ansible-playbook is not installed (ansible-core is in the test extra)")


def load_module():
    pytest.importorskip("ansible.module_utils.basic", reason="ansible-core is not installed")
    spec = importlib.util.spec_from_file_location("applier_ansible_module", MODULE_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------- the module's reading of applier's JSON

def test_apply_changes_only_for_patches_whose_action_is_apply():
    mod = load_module()
    payload = {"patches": [{"id": "a", "action": "apply"}, {"id": "b", "action": "already-applied"},
                           {"id": "c", "action": "not-applicable"}]}
    assert mod.applied_changes(payload) == ["a"]
    assert mod.applied_changes({"patches": [{"id": "b", "action": "already-applied"}]}) == []


def test_revert_changes_when_any_file_changes_bytes():
    mod = load_module()
    payload = {"patches": [
        {"id": "a", "files": [{"path": "x", "action": "unchanged"}, {"path": "y", "action": "restored"}]},
        {"id": "b", "files": [{"path": "z", "action": "unchanged"}, {"path": "w", "action": "lost"}]},
        {"id": "c", "files": [{"path": "v", "action": "reversed-diff"}]},
        {"id": "d", "files": [{"path": "u", "action": "deleted"}, {"path": "t", "action": "forced"}]}]}
    assert mod.reverted_changes(payload) == ["a", "c", "d"]
    assert mod.reverted_changes({"patches": []}) == []


def test_revert_selection_keeps_recorded_ids_components_and_unknown_names():
    mod = load_module()
    status = {"patches": [{"id": "comfyui/max-resolution", "recorded": True},
                          {"id": "comfyui/oom-retry", "recorded": False},
                          {"id": "torch/stream-priority", "recorded": False}]}
    assert mod.recorded_selection(status, ["comfyui/max-resolution", "comfyui/oom-retry"]) == \
        ["comfyui/max-resolution"]
    assert mod.recorded_selection(status, ["comfyui", "torch"]) == ["comfyui"]
    # an id the catalog does not have goes to `applier revert`, which refuses it with its own message
    assert mod.recorded_selection(status, ["comfyui/nope"]) == ["comfyui/nope"]
    assert mod.recorded_selection(status, ["comfyui/oom-retry"]) == []


def test_a_failure_carries_the_cli_message_hint_and_exit_code():
    mod = load_module()
    out = json.dumps({"ok": False, "error": {"kind": "BadTargetError", "message": "target /x does not exist",
                                             "hint": None, "exit_code": 9}})
    assert mod.error_of(out, "", 9) == {"msg": "target /x does not exist", "rc": 9, "stderr": "",
                                        "kind": "BadTargetError"}
    with_hint = json.dumps({"ok": False, "error": {"kind": "RefusedError", "message": "no patch 'p'",
                                                   "hint": "known: q", "exit_code": 3}})
    assert mod.error_of(with_hint, "", 3)["msg"] == "no patch 'p' (hint: known: q)"
    # Click's usage errors are not JSON: stderr is the message
    assert mod.error_of("", "Error: No such option: --bogus\n", 2)["msg"] == "Error: No such option: --bogus"


def test_the_module_documentation_parses():
    yaml = pytest.importorskip("yaml")
    mod = load_module()
    doc = yaml.safe_load(mod.DOCUMENTATION)
    assert set(doc["options"]) == {"target", "state", "only", "applier", "python", "patches"}
    assert doc["options"]["state"]["choices"] == ["applied", "reverted"]
    assert isinstance(yaml.safe_load(mod.EXAMPLES), list) and isinstance(yaml.safe_load(mod.RETURN), dict)


# ---------------------------------------------------------------- a real ansible-playbook on localhost

def tree_bytes(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not {".git", ".applier", "__pycache__"} & set(p.relative_to(root).parts)}


class Farm:
    """Two sandbox installs and the means to run the example playbook on them, every file ansible writes
    (its home, local and "remote" temp) kept under one folder inside the repository."""

    def __init__(self, base: Path):
        self.base = base
        self.trees = [build_comfy_tree(base / "node1", era="latest", layout="git"),
                      build_comfy_tree(base / "node2", era="0.3.45", layout="portable", crlf=True)]
        self.original = [tree_bytes(t) for t in self.trees]
        self.home = base / "home"
        for folder in ("home", "local-tmp", "remote-tmp", "tmp"):
            (base / folder).mkdir()
        self.applier = str(Path(sys.executable).parent / "applier")

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("ANSIBLE_") and k not in ("APPLIER_FAILPOINT", "PYTHONPATH")}
        env.update({
            "HOME": str(self.home),                       # nothing of ansible's lands in the real home
            "ANSIBLE_HOME": str(self.home / ".ansible"),
            "ANSIBLE_LOCAL_TEMP": str(self.base / "local-tmp"),
            "ANSIBLE_REMOTE_TEMP": str(self.base / "remote-tmp"),
            "ANSIBLE_CONFIG": str(self.base / "no-ansible.cfg"),   # absent: no ansible.cfg of the machine
            "ANSIBLE_LIBRARY": str(LIBRARY),
            "ANSIBLE_PYTHON_INTERPRETER": sys.executable,
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_RETRY_FILES_ENABLED": "0",
            "ANSIBLE_LOCALHOST_WARNING": "0",
            "TMPDIR": str(self.base / "tmp"),
            "APPLIER_NO_GPU_PROBE": "1",
        })
        return env

    def play(self, *extra: str, state: str = "applied", only: tuple[str, ...] = (),
             targets: list[str] | None = None, **more_vars: str) -> tuple[int, dict[str, int], str]:
        variables = {"applier_hosts": "localhost", "applier_state": state, "applier_only": list(only),
                     "applier_executable": self.applier,
                     "comfyui_targets": targets if targets is not None else [str(t) for t in self.trees],
                     **more_vars}
        var_file = self.base / "vars.json"
        var_file.write_text(json.dumps(variables))
        proc = subprocess.run([ANSIBLE_PLAYBOOK, "-i", "localhost,", "-c", "local", "-e", f"@{var_file}", *extra,
                               str(EXAMPLE_PLAYBOOK)], capture_output=True, text=True, env=self.env(),
                              cwd=self.base, stdin=subprocess.DEVNULL)
        output = proc.stdout + proc.stderr
        recap = RECAP.search(output)
        assert recap, f"no PLAY RECAP in ansible-playbook's output (exit {proc.returncode}):\n{output}"
        ok, changed, unreachable, failed = map(int, recap.groups())
        return proc.returncode, {"ok": ok, "changed": changed, "unreachable": unreachable, "failed": failed}, output

    def recorded(self) -> list[set[str]]:
        """Per tree: the patch ids applier's status records as applied."""
        out = []
        for tree in self.trees:
            proc = subprocess.run([self.applier, "status", "--target", str(tree), "--json"], capture_output=True,
                                  text=True, env=self.env())
            assert proc.returncode in (0, 5), proc.stdout + proc.stderr
            out.append({p["id"] for p in json.loads(proc.stdout)["patches"] if p["recorded"]})
        return out


@pytest.fixture
def farm():
    (REPO / ".cache").mkdir(exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="test-ansible-", dir=REPO / ".cache"))
    try:
        yield Farm(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def assert_played(result, *, changed: int, output_hint: str = ""):
    rc, recap, output = result
    assert rc == 0 and recap["failed"] == 0 and recap["unreachable"] == 0, output
    assert recap["changed"] == changed, f"expected changed={changed}{output_hint}:\n{output}"


@pytest.mark.slow
@needs_ansible
def test_playbook_applies_on_two_installs_is_idempotent_and_reverts_byte_identical(farm):
    # check mode is applier's --dry-run: it reports the change and writes nothing
    assert_played(farm.play("--check"), changed=1)
    assert [tree_bytes(t) for t in farm.trees] == farm.original
    assert farm.recorded() == [set(), set()]

    assert_played(farm.play(only=("comfyui/max-resolution",)), changed=1)
    assert farm.recorded() == [{"comfyui/max-resolution"}] * 2
    assert_played(farm.play(), changed=1)
    assert farm.recorded() == [set(COMFY_IDS)] * 2
    for tree in farm.trees:
        root = tree / "ComfyUI" if (tree / "python_embeded").is_dir() else tree
        assert re.search(rb"^MAX_RESOLUTION\s*=\s*40960\s*$", (root / "nodes.py").read_bytes(), re.M)

    # the second run changes nothing: changed=0
    assert_played(farm.play(), changed=0, output_hint=" (a second apply must be a no-op)")

    assert_played(farm.play(state="reverted", only=("comfyui/oom-retry",)), changed=1)
    assert farm.recorded() == [{"comfyui/max-resolution", "comfyui/pil-pixel-limit"}] * 2
    assert_played(farm.play(state="reverted", only=("comfyui/oom-retry",)), changed=0)

    assert_played(farm.play(state="reverted"), changed=1)
    assert [tree_bytes(t) for t in farm.trees] == farm.original
    assert farm.recorded() == [set(), set()]
    assert_played(farm.play(state="reverted"), changed=0, output_hint=" (a second revert must be a no-op)")
    assert [p for p in farm.home.rglob("*") if p.is_file()] == []   # ansible kept its files where it was told


@pytest.mark.slow
@needs_ansible
def test_playbook_fails_with_the_cli_message_and_exit_code(farm):
    missing = farm.base / "no-such-install"
    rc, recap, output = farm.play(only=("comfyui/no-such-patch",), targets=[str(missing), str(farm.trees[0])])
    assert rc != 0 and recap["failed"] == 1, output
    failures = [json.loads(line.split(" => ", 1)[1]) for line in output.splitlines()
                if line.startswith("failed: [localhost]")]
    assert [(f["item"], f["rc"]) for f in failures] == [(str(missing), 9), (str(farm.trees[0]), 3)], output
    assert str(missing) in failures[0]["msg"]                     # exit 9: bad target, in applier's words
    assert "no-such-patch" in failures[1]["msg"]                  # exit 3: refused

    # `patches` reaches the CLI as --patches
    no_catalog = farm.base / "no-such-catalog"
    rc, recap, output = farm.play(targets=[str(farm.trees[0])], applier_patches=str(no_catalog))
    assert rc != 0 and recap["failed"] == 1 and str(no_catalog) in output and '"rc": 3' in output, output
    assert [tree_bytes(t) for t in farm.trees] == farm.original
