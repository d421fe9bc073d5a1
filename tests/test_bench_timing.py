"""The benchmark's timing rules: input sets that spill the L2 at every size, spread over
repeats reported beside each figure, and a warning when two CPU runs disagree."""

import pytest
import torch

import rope_compat.bench as bench
from rope_compat.bench import format_tables, timing
from rope_compat.bench.inputs import sets_needed
from rope_compat.bench.shapes import MODEL_SHAPES, bytes_to_move

L2 = 60 * 2**20


@pytest.mark.parametrize("tokens", [1, 3, 16, 128, 1024, 131072])
@pytest.mark.parametrize("model", ["llama3-8b", "gptj"])
def test_sets_exceed_twice_l2_with_no_cap(model, tokens):
    shape = MODEL_SHAPES[model]
    per_set = bytes_to_move(shape, tokens, torch.bfloat16, torch.float32)
    n = sets_needed(shape, tokens, torch.bfloat16, torch.float32, 2 * L2)
    assert n * per_set > 2 * L2
    assert n == 1 or (n - 1) * per_set <= 2 * L2  # no more than it takes
    if tokens == 1:
        assert n > 200  # the old cap of 200 sets left one-token calls in L2


def test_max_sets_caps_the_count():
    shape = MODEL_SHAPES["llama3-8b"]
    assert sets_needed(shape, 1, torch.bfloat16, torch.float32, 2 * L2, max_sets=1) == 1


def test_cpu_timing_reports_spread_of_two_runs(monkeypatch):
    runs = iter([[3.0, 1.0, 2.0], [6.0, 4.0, 5.0]])
    monkeypatch.setattr(timing, "_cpu_batches", lambda *a: next(runs))
    t = timing.cpu_us(lambda i: None, 1, repeats=3)
    assert (t.min, t.median, t.max) == (1.0, 3.5, 6.0)
    assert t.disagreement == pytest.approx((5.0 - 2.0) / 2.0)


def test_cpu_timing_of_a_real_step_is_ordered():
    x = torch.randn(64, 64)
    t = timing.cpu_us(lambda i: torch.mm(x, x), 1, target_s=0.02, repeats=5)
    assert 0 < t.min <= t.median <= t.max and t.disagreement >= 0


@pytest.mark.parametrize("disagreement, warned", [(0.5, True), (0.1, False)])
def test_cpu_runs_that_disagree_are_flagged(monkeypatch, disagreement, warned):
    monkeypatch.setattr(bench, "cpu_us", lambda *a, **k: timing.Timing(2.0, 2.5, 9.0, disagreement))
    result = bench.run(shapes=["4/2x64:32:neox"], tokens=[4], device="cpu", peers=[], progress=False)
    (row,) = result.rows
    assert (row.us, row.us_min, row.us_median, row.us_max) == (2.0, 2.0, 2.5, 9.0)
    text = format_tables(result)
    assert "2.00 [2.5-9]" in text
    assert ("WARNING" in text) == warned and (len(result.warnings) == 1) == warned
    if warned:
        assert "50%" in result.warnings[0] and "T=4" in result.warnings[0]
