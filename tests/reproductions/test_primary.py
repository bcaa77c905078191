"""reproductions/primary.py: the claims' primary tests (one-sided over seeds, Holm over a paper's
primary tests, the one-sided test against the paper's effect size), on synthetic seed values and on
the archived stores."""
from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest
from scipy import stats

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "reproductions"))
_spec = importlib.util.spec_from_file_location("primary", ROOT / "reproductions" / "primary.py")
P = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(P)


def _fake(monkeypatch, arm: dict, versus: dict):
    monkeypatch.setattr(P, "seed_values", lambda test, over: dict(versus if over else arm))


def test_the_one_sided_p_is_scipys_paired_t_test_in_the_papers_direction(monkeypatch):
    arm, base = {1: 86.1, 2: 85.4, 3: 86.9}, {1: 84.0, 2: 84.2, 3: 85.0}
    _fake(monkeypatch, arm, base)
    got = P.compute({"direction": "greater", "metric": "F1", "paper_effect": 1.65})
    d = [arm[s] - base[s] for s in arm]
    assert got["n"] == 3 and got["diff"] == pytest.approx(sum(d) / 3)
    assert got["p"] == pytest.approx(stats.ttest_1samp(d, 0, alternative="greater").pvalue)
    assert got["p_size"] == pytest.approx(stats.ttest_1samp(d, 1.65, alternative="less").pvalue)
    assert got["smaller"] is (got["p_size"] < 0.05)
    low, high = stats.t.interval(0.95, 2, loc=sum(d) / 3, scale=stats.sem(d))
    assert (got["ci_low"], got["ci_high"]) == (pytest.approx(low), pytest.approx(high))


def test_a_claimed_drop_is_tested_the_other_way(monkeypatch):
    _fake(monkeypatch, {1: 83.0, 2: 83.5, 3: 82.9}, {1: 86.5, 2: 86.7, 3: 86.4})
    got = P.compute({"direction": "less", "metric": "F1(10)", "paper_effect": -2.31})
    assert got["diff"] < -2.31 and got["p"] < 0.01 and got["p_size"] > 0.5 and not got["smaller"]
    # a drop much smaller than the paper's is "smaller"
    _fake(monkeypatch, {1: 86.3, 2: 86.6, 3: 86.2}, {1: 86.5, 2: 86.7, 3: 86.4})
    assert P.compute({"direction": "less", "metric": "F1(10)", "paper_effect": -2.31})["smaller"]


def test_one_seed_gives_no_test_and_identical_differences_no_spread(monkeypatch):
    _fake(monkeypatch, {1: 70.0}, {1: 69.0})
    got = P.compute({"direction": "greater", "metric": "F1", "paper_effect": 1.0})
    assert got["n"] == 1 and math.isnan(got["p"]) and math.isnan(got["p_size"]) and not got["smaller"]
    _fake(monkeypatch, {1: 71.0, 2: 72.0}, {1: 70.0, 2: 71.0})
    got = P.compute({"direction": "greater", "metric": "F1", "paper_effect": 2.0})
    assert got["p"] == 0.0 and got["p_size"] == 0.0 and got["smaller"]


def test_a_direction_must_be_named():
    with pytest.raises(ValueError, match="direction"):
        P.compute({"metric": "F1", "method": "x"})


def test_holm_is_over_each_papers_primary_tests(monkeypatch):
    values = {"a": ({1: 2.0, 2: 2.2, 3: 2.1}, {1: 0.0, 2: 0.1, 3: 0.0}),
              "b": ({1: 0.5, 2: -0.4, 3: 0.3}, {1: 0.0, 2: 0.0, 3: 0.0}),
              "c": ({1: 3.0, 2: 3.1, 3: 2.9}, {1: 0.0, 2: 0.0, 3: 0.1})}
    monkeypatch.setattr(P, "seed_values", lambda test, over: dict(values[test["method"]][1 if over else 0]))
    summary = {"rows": [
        {"claim": "A", "paper": "x", "primary": [{"method": "a", "metric": "F1", "direction": "greater"},
                                                  {"method": "b", "metric": "F1", "direction": "greater"}]},
        {"claim": "C", "paper": "y", "primary": [{"method": "c", "metric": "F1", "direction": "greater"}]},
        {"claim": "N", "paper": "x", "primary": {"none": "qualitative"}}]}
    tests = P.primary_tests(summary)
    assert [t["claim"] for t in tests] == ["A", "A", "C"]
    a, b, c = tests
    assert a["family"] == b["family"] == 2 and c["family"] == 1
    assert a["p_holm"] == pytest.approx(min(1, 2 * a["p"])) and c["p_holm"] == pytest.approx(c["p"])
    assert b["p_holm"] == pytest.approx(max(a["p_holm"], b["p"]))
    assert P.significant(a) and not P.significant(b)


def test_a_segment_test_reads_the_stores_segment_rows():
    got = P.compute({"store": "docs/experiments/rp_squad_d50_3ep", "eval_set": "test", "metric": "F1 on S100(2)",
                     "segmenter": "first_x_tokens(x=100)", "segment": "S100(2)", "method": "random_padding",
                     "direction": "greater"})
    assert got["n"] == 3 and got["diff"] == pytest.approx(-12.08, abs=0.01)
    with pytest.raises(LookupError, match="S100\\(9\\)"):
        P.compute({"store": "docs/experiments/rp_squad_d50_3ep", "eval_set": "test", "metric": "F1",
                   "segmenter": "first_x_tokens(x=100)", "segment": "S100(9)", "method": "random_padding",
                   "direction": "greater"})
