"""Fingerprints do not depend on the Python that computes them: a ComfyUI running on Python 3.12 must match the
fingerprints recorded on 3.11 (ast.dump's text differs between them: 3.12 adds type_params=[] to every def, and
the H200 benchmark on Python 3.12 found every family stock until the normaliser stopped using it)."""
from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fused_dit import fingerprint

SOURCE = '''
class Block(nn.Module):
    def forward(self, x: Tensor, pe=None, *, mod=(1, 2)) -> Tensor:
        """A docstring the fingerprint ignores."""
        q, k = self.norm(x).chunk(2, dim=-1)
        x = x + self.gate * attention(q, k, pe=pe, mask=None)   # a comment it ignores too
        return x[:, 1:] if mod else f"{x!r:>4}"
'''
FINGERPRINT_PY = Path(fingerprint.__file__)


def test_the_normalised_text_leaves_out_the_fields_pythons_disagree_on():
    node = ast.parse(SOURCE).body[0]
    text = fingerprint.stable_dump(node)
    for field in ("type_params", "ctx=", "type_comment", "lineno", "kind="):
        assert field not in text
    assert "=[]" not in text and "=None" not in text


def test_reformatting_and_comments_keep_the_fingerprint_and_a_changed_constant_changes_it():
    node = ast.parse(SOURCE).body[0]
    reformatted = SOURCE.replace("(1, 2)", "( 1,2 )").replace("   # a comment it ignores too", "")
    assert fingerprint.of_node(node) == fingerprint.of_node(ast.parse(reformatted).body[0])
    assert fingerprint.of_node(node) != fingerprint.of_node(ast.parse(SOURCE.replace("1:", "2:")).body[0])


def other_pythons() -> list[str]:
    found = []
    for name in ("python3.10", "python3.12", "python3.13", "python3.14"):
        path = shutil.which(name)
        if path and Path(path).resolve() != Path(sys.executable).resolve() and subprocess.run(
                [path, "-I", "-c", "pass"], capture_output=True, timeout=30).returncode == 0:   # pyenv shims may not run
            found.append(path)
    return found


@pytest.mark.skipif(not other_pythons(), reason="no other Python version on this machine")
def test_every_python_on_this_machine_computes_the_same_fingerprint():
    code = ("import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('fp', {str(FINGERPRINT_PY)!r})\n"
            "fp = importlib.util.module_from_spec(spec); spec.loader.exec_module(fp)\n"
            "print(fp.of_definition(sys.stdin.read(), 'Block.forward'))\n")
    here = fingerprint.of_definition(SOURCE, "Block.forward")
    for python in other_pythons():
        out = subprocess.run([python, "-I", "-c", code], input=SOURCE, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == here, python
