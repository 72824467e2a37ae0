"""The `fp8` attention mode's yardstick (issue 38): SageAttention 2's measured error per band of shapes, derived from
a benchmark run by `attention-kernels --write-table`, read by integration/attention_yardstick.py.

Pinned here: the derivation's bands (boundaries between measured shapes, `within` only for rows at most SageAttention
2's error on every input kind) load back into the pack; where a band covers a shape a lossy kernel runs only if the
band lists it and its error on the call is within the band's limit, said once with the results key; a shape in no
band, the shipped table (no bands until the device run) and an unreadable table keep the earlier rule.
"""
from __future__ import annotations

import json
import sys

import pytest

from benchmarks import attention_kernels
from fused_dit import state
from fused_dit.integration import attention_fp8, attention_yardstick
from test_attention_optional import Fp8Call

HEADS, D, TOKENS = 2, 64, 8


def run_report(shapes: dict) -> dict:
    """A benchmark report as attention-kernels writes it: {name: (tokens, head_dim, {kind: {row: error}})}."""
    report = {"environment": {"gpu": "test GPU"}, "sageattention": "2.2.0", "sageattention_source": "test",
              "shapes": {}}
    for name, (tokens, d, errors) in shapes.items():
        entry = {"b_h_lq_lkv_d": [1, HEADS, tokens, tokens, d], "speed": {"sage2": {"tflops": 1.0}}}
        for kind, rows in errors.items():
            entry[f"error_{kind}"] = {row: {"relative_frobenius": e} for row, e in rows.items()}
        report["shapes"][name] = entry
    return report


def errors(sage2, fp8, cudnn):
    return {kind: {"sage2": sage2[i], "fp8": fp8[i], "cudnn_fp8": cudnn[i]} for i, kind in
            enumerate(attention_kernels.INPUT_KINDS)}


def test_the_derivation_bands_the_measured_shapes_and_lists_rows_within_on_every_kind():
    report = run_report({
        "small": (4, D, errors((0.04, 0.05), (0.01, 0.04), (0.06, 0.3))),
        "large": (16, D, errors((0.04, 0.06), (0.01, 0.07), (0.03, 0.05))),
        "no sage2": (64, D, {"gaussian": {"fp8": {"relative_frobenius": 0.01}}}),
        "sage2 failed": (256, D, {kind: {"sage2": {"error": "RuntimeError"}} for kind in ("gaussian", "dit_like")}),
    })
    bands = attention_kernels.derive_yardstick(report)["bands"]
    assert [(b["shape"], b["min_tokens"], b["max_tokens"]) for b in bands] == [("small", 2, 8), ("large", 9, 32)]
    assert bands[0]["within"] == ["fp8"]              # cuDNN beyond SageAttention 2 on both kinds
    assert bands[1]["within"] == ["cudnn_fp8"]        # the kernel beyond it on DiT-like inputs only
    assert bands[0]["sage2_error"] == {"gaussian": 0.04, "dit_like": 0.05}
    assert bands[0]["evidence"] == "shapes.small"


@pytest.fixture
def table(tmp_path):
    """Write a table from a run (as `--write-table` does) and have the pack read it; the shipped one after."""
    def write(shapes: dict):
        source = tmp_path / "attention-kernels-test.json"
        source.write_text(json.dumps(run_report(shapes)))
        path = attention_kernels.write_yardstick(run_report(shapes), source, tmp_path / "yardstick.json")
        attention_yardstick.use_table(path)
        return path
    state.forget_said()
    yield write
    attention_yardstick.use_table(None)
    state.forget_said()


def test_the_written_table_loads_back_with_its_citation(table):
    path = table({"flux-like": (TOKENS, D, errors((0.04, 0.05), (0.01, 0.04), (0.06, 0.3)))})
    data = json.loads(path.read_text())
    assert data["measured"] is True and data["evidence"] == {"file": "attention-kernels-test.json", "key": "shapes"}
    band = attention_yardstick.band_for(D, TOKENS)
    assert band.admits("fp8") and not band.admits("cudnn_fp8") and band.limit() == 0.05
    assert band.evidence.cite() == "see benchmarks/results/attention-kernels-test.json: shapes.flux-like"
    assert attention_yardstick.band_for(D, TOKENS * 100) is None and attention_yardstick.band_for(128, TOKENS) is None


def test_the_shipped_table_is_derived_from_the_committed_run_it_cites():
    """The shipped bands are what `attention-kernels --from` the cited results file derives, and each band's
    evidence key names a shape of that file: the table holds no figure of its own."""
    from benchmarks import results
    attention_yardstick.use_table(None)
    data = json.loads(attention_yardstick.TABLE_FILE.read_text())
    assert data["measured"] is True and data["evidence"]["key"] == "shapes"
    run = json.loads((results.RESULTS / data["evidence"]["file"]).read_text())
    assert data["bands"] == attention_kernels.derive_yardstick(run)["bands"]
    for band in data["bands"]:
        assert band["evidence"].split(".", 1)[1] in run["shapes"]
    assert len(attention_yardstick.bands()) == len(data["bands"]) > 0


class Candidates(Fp8Call):
    """ComfyUI's exact function and the pack's kernel with `kernel_error`, the kernel the faster; no SageAttention
    (its live yardstick would take the table's place)."""

    def __init__(self, monkeypatch, kernel_error: float):
        super().__init__(monkeypatch, kernel_error, {"kernel": 1.0, "exact": 2.0})
        monkeypatch.setitem(sys.modules, "sageattention", None)

    def choose(self) -> str:
        override = attention_fp8.Fp8Attention(timer=self.timer, devices=("cpu",))
        self.run(override)
        return override.choices.popitem()[1]


def test_where_a_band_lists_the_kernel_and_its_error_is_within_it_runs(table, monkeypatch):
    table({"flux-like": (TOKENS, D, errors((0.04, 0.05), (0.01, 0.04), (0.06, 0.3)))})
    assert Candidates(monkeypatch, kernel_error=0.03).choose() == attention_fp8.KERNEL


def test_where_the_kernels_error_on_the_call_is_beyond_the_band_exact_runs_and_it_is_said_once(table, monkeypatch,
                                                                                                 caplog):
    table({"flux-like": (TOKENS, D, errors((0.04, 0.05), (0.01, 0.04), (0.06, 0.3)))})
    with caplog.at_level("DEBUG", logger="fused_dit"):
        assert Candidates(monkeypatch, kernel_error=0.2).choose() == attention_fp8.EXACT
    said = [r for r in caplog.records if "attention fp8 for" in r.getMessage()]
    assert [r.levelname for r in said] == ["INFO", "DEBUG"]
    assert attention_fp8.NO_LOSSY_WIN in said[0].getMessage()
    assert "beyond SageAttention 2's" in said[1].getMessage()
    assert "attention-kernels-test.json: shapes.flux-like" in said[1].getMessage()


def test_where_a_band_does_not_list_the_kernel_exact_runs_however_small_its_error_on_the_call(table, monkeypatch):
    table({"wan-like": (TOKENS, D, errors((0.04, 0.05), (0.01, 0.07), (0.06, 0.3)))})
    assert Candidates(monkeypatch, kernel_error=0.001).choose() == attention_fp8.EXACT


def test_a_shape_in_no_band_keeps_the_earlier_rule(table, monkeypatch):
    table({"far": (TOKENS * 100, D, errors((0.04, 0.05), (0.01, 0.07), (0.06, 0.3)))})
    assert Candidates(monkeypatch, kernel_error=0.2).choose() == attention_fp8.KERNEL


def test_an_unreadable_table_keeps_the_earlier_rule_and_says_so_once(tmp_path, monkeypatch, caplog):
    bad = tmp_path / "yardstick.json"
    bad.write_text('{"bands": [{"shape": "x"}]}')
    state.forget_said()
    attention_yardstick.use_table(bad)
    try:
        with caplog.at_level("INFO", logger="fused_dit"):
            assert Candidates(monkeypatch, kernel_error=0.2).choose() == attention_fp8.KERNEL
            assert attention_yardstick.band_for(D, TOKENS) is None
        assert sum("no readable yardstick table" in r.getMessage() for r in caplog.records) == 1
    finally:
        attention_yardstick.use_table(None)
        state.forget_said()


# ------------------------------------------------------------------------------------------------ the recipe's gate
def with_row(shapes_errors: dict, row: str, added: tuple) -> dict:
    """`errors(...)` with one more row, one error per kind."""
    return {kind: {**rows, row: added[i]} for i, (kind, rows) in enumerate(shapes_errors.items())}


def with_recipe(shapes_errors: dict, recipe: tuple) -> dict:
    """`errors(...)` with the `fp8_sage2` row (the kernel on SageAttention 2's recipe) added, one error per kind."""
    return with_row(shapes_errors, "fp8_sage2", recipe)


class RecipeCandidates(Candidates):
    """Candidates with the kernel on SageAttention 2's recipe too, `recipe_error` on the call and the fastest of all."""

    def __init__(self, monkeypatch, kernel_error: float, recipe_error: float):
        super().__init__(monkeypatch, kernel_error)
        self.times = {**self.times, "recipe": 0.5}
        monkeypatch.setattr(attention_fp8.kernel, "attention_fp8_sage2",
                            lambda q, k, v, scale=None: self.ran.append("recipe") or q * (1 + recipe_error))

    def choose_and_run_again(self) -> tuple[str, str]:
        """(the shape's choice, what its second call ran); what the first call (the measurement) ran in
        `measured` (run() clears `ran` at each call)."""
        override = attention_fp8.Fp8Attention(timer=self.timer, devices=("cpu",))
        self.run(override)
        self.measured = list(self.ran)
        return next(iter(override.choices.values())), self.run(override)


@pytest.mark.parametrize("row", ["fp8_sage2", "cudnn_fp8_rotated"])     # the recipe's, cuDNN's rotated path's
def test_the_derivation_lists_an_added_row_where_it_is_within_sage2_on_every_kind(row):
    report = run_report({
        "within": (4, D, with_row(errors((0.04, 0.05), (0.01, 0.07), (0.06, 0.3)), row, (0.03, 0.05))),
        "beyond": (16, D, with_row(errors((0.04, 0.05), (0.01, 0.04), (0.06, 0.3)), row, (0.03, 0.06))),
    })
    bands = {b["shape"]: b for b in attention_kernels.derive_yardstick(report)["bands"]}
    assert bands["within"]["within"] == [row] and bands["beyond"]["within"] == ["fp8"]


def test_with_the_shipped_table_and_no_sageattention_the_recipe_is_never_chosen_nor_timed(monkeypatch):
    """No band, no SageAttention 2 on the call: no yardstick says the recipe is as accurate, so it is not a candidate,
    however fast and accurate it would be; the earlier rule keeps the kernel."""
    attention_yardstick.use_table(None)
    candidates = RecipeCandidates(monkeypatch, kernel_error=0.01, recipe_error=0.0)
    assert candidates.choose_and_run_again() == (attention_fp8.KERNEL, "kernel")
    assert "recipe" not in candidates.measured and "kernel" in candidates.measured


def test_where_a_band_lists_the_recipe_and_its_error_is_within_it_is_chosen_and_runs(table, monkeypatch):
    table({"flux-like": (TOKENS, D, with_recipe(errors((0.04, 0.05), (0.01, 0.04), (0.06, 0.3)), (0.02, 0.03)))})
    candidates = RecipeCandidates(monkeypatch, kernel_error=0.01, recipe_error=0.03)
    assert candidates.choose_and_run_again() == (attention_fp8.RECIPE, "recipe")


def test_where_the_recipes_error_on_the_call_is_beyond_the_band_the_next_fastest_runs(table, monkeypatch):
    table({"flux-like": (TOKENS, D, with_recipe(errors((0.04, 0.05), (0.01, 0.04), (0.06, 0.3)), (0.02, 0.03)))})
    candidates = RecipeCandidates(monkeypatch, kernel_error=0.01, recipe_error=0.2)
    assert candidates.choose_and_run_again() == (attention_fp8.KERNEL, "kernel")


def test_where_a_band_does_not_list_the_recipe_it_is_not_timed(table, monkeypatch):
    table({"flux-like": (TOKENS, D, with_recipe(errors((0.04, 0.05), (0.01, 0.04), (0.06, 0.3)), (0.02, 0.09)))})
    candidates = RecipeCandidates(monkeypatch, kernel_error=0.01, recipe_error=0.0)
    assert candidates.choose_and_run_again() == (attention_fp8.KERNEL, "kernel")
    assert "recipe" not in candidates.measured and "kernel" in candidates.measured


@pytest.mark.parametrize("recipe_error, chosen", [(0.01, attention_fp8.RECIPE), (0.05, attention_fp8.KERNEL)])
def test_where_sageattention_2_runs_on_the_call_the_recipe_runs_only_within_its_error(monkeypatch, recipe_error,
                                                                                     chosen):
    """SageAttention 2 in the user's environment is the yardstick on the call itself: the recipe may run where its
    error there is at most SageAttention 2's (here SageAttention 2 is the slowest lossy candidate)."""
    from test_attention_optional import fake_sage
    attention_yardstick.use_table(None)
    candidates = RecipeCandidates(monkeypatch, kernel_error=0.001, recipe_error=recipe_error)
    candidates.times = {**candidates.times, "sage2": 1.5}
    fake_sage(monkeypatch, "2.2.0", 0.02, candidates.ran)
    assert candidates.choose_and_run_again()[0] == chosen


# ------------------------------------------------------------------------------------ cuDNN's rotated path's gate
class RotatedCandidates(Candidates):
    """Candidates with cuDNN's FP8 SDPA taking the call: plain (`cudnn_error`, slow) and Hadamard-rotated
    (`rotated_error` on the call, the fastest of all); which options each call ran is recorded."""

    def __init__(self, monkeypatch, kernel_error: float, cudnn_error: float, rotated_error: float):
        super().__init__(monkeypatch, kernel_error)
        self.times = {**self.times, "cudnn": 3.0, "rotated": 0.5}
        cudnn_fp8 = attention_fp8.cudnn_fp8
        monkeypatch.setattr(cudnn_fp8, "refusal", lambda q, k, v, mask=None: None)

        def attend(q, k, v, options=cudnn_fp8.PLAIN):
            assert options in (cudnn_fp8.PLAIN, cudnn_fp8.ROTATED)
            self.ran.append("rotated" if options.rotate else "cudnn")
            return q * (1 + (rotated_error if options.rotate else cudnn_error))
        monkeypatch.setattr(cudnn_fp8, "attention_cudnn_fp8", attend)

    def choose_and_run_again(self) -> tuple[str, str]:
        """(the shape's choice, what its second call ran); what the first call (the measurement) ran in
        `measured`."""
        override = attention_fp8.Fp8Attention(timer=self.timer, devices=("cpu",))
        self.run(override)
        self.measured = list(self.ran)
        return next(iter(override.choices.values())), self.run(override)


def with_rotated(shapes_errors: dict, rotated: tuple) -> dict:
    return with_row(shapes_errors, "cudnn_fp8_rotated", rotated)


def test_with_the_shipped_table_and_no_sageattention_the_rotated_path_is_never_chosen_nor_timed(monkeypatch):
    attention_yardstick.use_table(None)
    candidates = RotatedCandidates(monkeypatch, kernel_error=0.01, cudnn_error=0.3, rotated_error=0.0)
    assert candidates.choose_and_run_again() == (attention_fp8.KERNEL, "kernel")
    assert "rotated" not in candidates.measured and "cudnn" in candidates.measured   # plain: the earlier rule


@pytest.mark.parametrize("rotated_error, chosen", [(0.03, attention_fp8.CUDNN_ROTATED), (0.2, attention_fp8.KERNEL)])
def test_where_a_band_lists_the_rotated_path_it_runs_only_within_the_band(table, monkeypatch, rotated_error, chosen):
    table({"flux-like": (TOKENS, D, with_rotated(errors((0.04, 0.05), (0.01, 0.04), (0.06, 0.3)), (0.02, 0.03)))})
    candidates = RotatedCandidates(monkeypatch, kernel_error=0.01, cudnn_error=0.3, rotated_error=rotated_error)
    expected_run = {attention_fp8.CUDNN_ROTATED: "rotated", attention_fp8.KERNEL: "kernel"}[chosen]
    assert candidates.choose_and_run_again() == (chosen, expected_run)


def test_where_a_band_does_not_list_the_rotated_path_it_is_not_timed(table, monkeypatch):
    table({"flux-like": (TOKENS, D, with_rotated(errors((0.04, 0.05), (0.01, 0.04), (0.06, 0.3)), (0.02, 0.09)))})
    candidates = RotatedCandidates(monkeypatch, kernel_error=0.01, cudnn_error=0.3, rotated_error=0.0)
    assert candidates.choose_and_run_again() == (attention_fp8.KERNEL, "kernel")
    assert "rotated" not in candidates.measured


@pytest.mark.parametrize("rotated_error, chosen", [(0.01, attention_fp8.CUDNN_ROTATED), (0.05, attention_fp8.KERNEL)])
def test_where_sageattention_2_runs_on_the_call_the_rotated_path_runs_only_within_its_error(monkeypatch,
                                                                                           rotated_error, chosen):
    from test_attention_optional import fake_sage
    attention_yardstick.use_table(None)
    candidates = RotatedCandidates(monkeypatch, kernel_error=0.001, cudnn_error=0.3, rotated_error=rotated_error)
    candidates.times = {**candidates.times, "sage2": 1.5}
    fake_sage(monkeypatch, "2.2.0", 0.02, candidates.ran)
    assert candidates.choose_and_run_again()[0] == chosen
