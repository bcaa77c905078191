"""The one position-bias number (`posbias.analysis.bias`): drop and PSI on hand-computed cases, the
bootstrap interval over questions within buckets, per-method rows of an experiment, and the
experiment report's "Position bias" block (first, or a plain "none" line)."""
import json
import math

import numpy as np
import pytest

from posbias.analysis.bias import (NO_ANSWER, alpha_bias, bucket_values, drop, experiment_rows, position_bias,
                                   psi, qa_position_bias)


# ----------------------------------------------------------------------------------- point values
def test_equal_buckets_have_no_bias():
    assert drop([70.0, 70.0, 70.0]) == 0.0 and psi([70.0, 70.0, 70.0]) == 0.0
    b = position_bias({"Q1": [50, 90], "Q2": [70, 70], "Q3": [60, 80]}, samples=200)
    assert b["drop"] == 0.0 and b["psi"] == 0.0


def test_a_bucket_at_zero_gives_psi_one():
    assert psi([0.0, 40.0, 80.0]) == 1.0 and drop([0.0, 40.0, 80.0]) == 80.0
    assert psi([0.0, 0.0]) == 0.0  # no score anywhere: defined as 0, not 0/0


def test_hand_computed_case():
    # Bucket means 60, 80, 20, 70 (neither first nor last is the best or the worst):
    # drop = 80 - 20 = 60; PSI = 1 - 20/80 = 0.75. Wrong formulas give other numbers: first - last
    # = -10, min/max = 0.25, 1 - mean/max = 0.28125, (max - min)/mean = 60/57.5.
    buckets = {"1": [100.0, 20.0], "2": [80.0], "3": [0.0, 40.0], "4": [70.0, 70.0, 70.0]}
    b = position_bias(buckets, samples=0)
    assert b["drop"] == pytest.approx(60.0, rel=1e-12) and b["psi"] == pytest.approx(0.75, rel=1e-12)
    assert (b["best"], b["worst"], b["buckets"], b["questions"]) == ("2", "3", 4, 8)
    assert b["means"] == {"1": 60.0, "2": 80.0, "3": 20.0, "4": 70.0}
    assert b["drop_ci"] is None and b["psi_ci"] is None  # no resamples, no interval


def test_empty_and_single_buckets():
    assert position_bias({"1": [50.0], "2": []}) is None  # one non-empty bucket: nothing to compare
    b = position_bias({"1": [50.0], "2": [], "3": [25.0]}, samples=0)
    assert b["buckets"] == 2 and b["drop"] == 25.0 and b["psi"] == 0.5


def test_bucket_values_leave_out_no_answer_and_unscored():
    labels = {"a": "1", "b": "1", "c": "2", "d": NO_ANSWER, "e": "3"}
    scores = {"a": (1.0, 1.0), "b": (0.0, 0.5), "c": (0.0, 0.0), "d": (1.0, 1.0)}  # e: no score
    got = bucket_values(labels, scores)
    assert list(got) == ["1", "2"]
    np.testing.assert_array_equal(got["1"], [100.0, 50.0])
    res = qa_position_bias({"answer_sentence": labels, "one": {"a": "1"}}, scores, samples=0)
    assert res["answer_sentence"]["drop"] == 75.0 and res["answer_sentence"]["psi"] == 1.0
    assert res["one"] is None


# ---------------------------------------------------------------------------------------- bootstrap
def _bernoulli_buckets(n: int, means=(0.8, 0.6, 0.5, 0.7), seed: int = 1) -> dict:
    rng = np.random.default_rng(seed)
    return {f"Q{i + 1}": 100.0 * (rng.random(n) < m) for i, m in enumerate(means)}


def test_interval_contains_the_point_and_shrinks_with_more_questions():
    small = position_bias(_bernoulli_buckets(60), samples=1000, seed=0)
    large = position_bias(_bernoulli_buckets(3000), samples=1000, seed=0)
    for b in (small, large):
        assert b["drop_ci"][0] <= b["drop"] <= b["drop_ci"][1]
        assert b["psi_ci"][0] <= b["psi"] <= b["psi_ci"][1]
        assert 0 <= b["psi_ci"][0] <= b["psi_ci"][1] <= 1
    width = lambda ci: ci[1] - ci[0]  # noqa: E731
    assert width(large["drop_ci"]) < width(small["drop_ci"]) / 3  # ~ 1/sqrt(50) of it
    assert width(large["psi_ci"]) < width(small["psi_ci"]) / 3


def test_interval_is_deterministic_for_a_seed():
    buckets = _bernoulli_buckets(80)
    a, b = position_bias(buckets, samples=500, seed=3), position_bias(buckets, samples=500, seed=3)
    assert a == b
    assert position_bias(buckets, samples=500, seed=4)["drop_ci"] != a["drop_ci"]


def test_interval_resamples_within_buckets():
    # Two buckets far apart: the drop is their difference, whose sampling sd is
    # sqrt(s1^2/n1 + s2^2/n2); a 95% interval spans ~ 2 x 1.96 of it. Resampling the pooled
    # questions (bucket sizes left to chance) or a bucket's sd instead of its mean's would not.
    buckets = _bernoulli_buckets(400, means=(0.9, 0.3), seed=5)
    b = position_bias(buckets, samples=4000, seed=0)
    sd = math.sqrt(sum(np.var(v) / len(v) for v in buckets.values()))
    assert b["drop_ci"][1] - b["drop_ci"][0] == pytest.approx(2 * 1.96 * sd, rel=0.1)


# ------------------------------------------------------------------------------------ tagging curve
def test_alpha_curve():
    b = alpha_bias([80.0, 78.0, 60.0, 64.0])
    assert b["drop"] == pytest.approx(16.0) and b["psi"] == pytest.approx(0.25)  # F1(1) - F1(4); 1 - 60/80
    assert (b["best_alpha"], b["worst_alpha"], b["alphas"]) == (1, 3, 4)
    assert alpha_bias([50.0, 55.0])["drop"] == pytest.approx(-5.0)  # signed: a later copy may score higher
    assert alpha_bias([None, 70.0, 60.0])["drop"] is None  # F1(1) undefined: no drop, PSI over the rest
    assert alpha_bias([70.0]) is None


def test_tagging_diagnosis_block():
    from posbias.tagging.diagnose import _bias_block, position_verdict

    rows = lambda vals: [{"alpha": i + 1, "f1_mean": v} for i, v in enumerate(vals)]  # noqa: E731
    result = {"metric": "f1", "subset": {"k_max": 3, "evaluated_sentences": 50}, "summary": {"f1": 90.0},
              "duplicate": {"by_alpha": rows([90.0, 81.0, 72.0])}, "shift": {"skipped": "relative positions"}}
    bias = position_verdict(result, {})  # no per-sentence counts: the curve alone, no interval
    assert list(bias["axes"]) == ["duplicate"] and bias["axes"]["duplicate"]["effect"] == pytest.approx(18.0)
    assert bias["axes"]["duplicate"]["ci"] is None and bias["evidence"] == "no"  # no interval: no evidence claimed
    headline, head, body, notes = _bias_block(result, bias)
    assert headline == "Copy 3 scores 18.0 F1 lower than copy 1 (50 sentences, duplicate mode) [no interval]; evidence of position bias: no."
    assert head[3] == "front − rear [95% CI]"
    assert body[0][:4] == ["copy α, duplicate mode", "copy 1 (n=50): 90.0", "copy 3 (n=50): 72.0", "18.00"]
    assert body[1][-1] == "skipped"


# ------------------------------------------------------------------------------------- experiments
def _run(name, metrics=None, status="finished"):
    method, seed = name.split("/seed")
    return {"name": name, "method": method, "seed": int(seed), "dataset": None, "train_size": None,
            "status": status, "metrics": metrics or {}, "config_json": json.dumps({"task": "qa"}),
            "output_dir": "/nonexistent", "wall_seconds": 1.0}


def _seg(run, segment, f1, n=10, segmenter="gold_position_quartile", eval_set="val"):
    return {"run": run, "eval_set": eval_set, "segmenter": segmenter, "segment": segment, "n": n,
            "exact": f1, "f1": f1}


def test_experiment_rows_signed_sized_effect_over_seeds():
    by_sentence = lambda a, b: {"val": {"f1": 70.0, "by_answer_sentence": {  # noqa: E731
        "1": {"total": 10, "f1": a}, "2": {"total": 10, "f1": b}, NO_ANSWER: {"total": 10, "f1": 0.0}}}}
    results = {
        "methods": ["base", "rpp"],
        "runs": [_run("base/seed1", by_sentence(80.0, 40.0)), _run("base/seed2", by_sentence(90.0, 60.0)),
                 _run("rpp/seed1"), _run("rpp/seed2", status="failed")],
        "segments": [
            _seg("base/seed1", "Q1", 80.0), _seg("base/seed1", "Q2", 60.0), _seg("base/seed1", "Q3", 0.0, n=0),
            _seg("base/seed2", "Q1", 70.0), _seg("base/seed2", "Q2", 70.0),
            _seg("rpp/seed1", "Q1", 50.0), _seg("rpp/seed1", "Q2", 40.0),
            _seg("rpp/seed2", "Q1", 0.0), _seg("rpp/seed2", "Q2", 100.0),  # failed run: left out
            # the spec's own answer_sentence segments win over metrics.json (rpp has no metrics)
            _seg("rpp/seed1", "1", 30.0, segmenter="answer_sentence(last=3)"),
            _seg("rpp/seed1", "3+", 60.0, segmenter="answer_sentence(last=3)"),
            _seg("rpp/seed1", NO_ANSWER, 0.0, segmenter="answer_sentence(last=3)"),
            _seg("base/seed1", "S100(1)", 0.0, segmenter="first_x_tokens(x=100)"),  # not a bucketing here
            _seg("base/seed1", "S100(2)", 90.0, segmenter="first_x_tokens(x=100)"),
        ]}
    rows = {(r["bucketing"], r["method"]): r for r in experiment_rows(results, min_size=10)}
    assert set(rows) == {("gold_position_quartile", "base"), ("gold_position_quartile", "rpp"),
                         ("answer_sentence", "base"), ("answer_sentence(last=3)", "rpp")}
    q = rows["gold_position_quartile", "base"]  # front − rear +20 and 0 (the empty Q3 ignored); PSI 0.25 and 0
    assert q["n_runs"] == 2 and q["effect_mean"] == pytest.approx(10.0) and q["psi_mean"] == pytest.approx(0.125)
    assert q["effect_std"] == pytest.approx(math.sqrt(200)) and q["psi_std"] == pytest.approx(0.125 * math.sqrt(2))
    # t-interval over 2 seeds: 10 ± t(0.975, 1) x sqrt(200) / sqrt(2) = 10 ± 12.706 x 10
    assert q["effect_ci"] == pytest.approx([10 - 127.062, 10 + 127.062], abs=0.01) and q["evidence"] == "no"
    assert (q["front"], q["rear"], q["front_n"]) == ("Q1", "Q2", 10) and q["score_mean"] == 70.0
    s = rows["answer_sentence", "base"]  # from metrics.json: 40 and 30, both seeds later sentences lower
    assert s["effect_mean"] == pytest.approx(35.0) and s["psi_mean"] == pytest.approx((0.5 + 1 / 3) / 2)
    # both seeds put later sentences lower, but two seeds 10 points apart give 35 ± 12.706 x 5: not resolved
    assert s["effect_ci"] == pytest.approx([35 - 63.53, 35 + 63.53], abs=0.01) and s["evidence"] == "no"
    r = rows["answer_sentence(last=3)", "rpp"]  # "no answer" left out: 30 - 60, later sentences score higher
    assert r["n_runs"] == 1 and r["effect_mean"] == -30.0 and r["psi_mean"] == 0.5 and math.isnan(r["effect_std"])
    assert r["effect_ci"] is None and r["evidence"] == "too few"  # one run: no interval over seeds


def test_experiment_rows_merge_small_buckets_and_keep_the_sign():
    # Q3 holds 6 questions and scores high (the demo model's case): it is merged into Q2, never the rear
    # alone; the effect is front − rear, so a rear that scores higher gives a negative number.
    results = {"methods": ["b"], "runs": [_run("b/seed1", {"val": {"f1": 57.0}}), _run("b/seed2", {"val": {"f1": 57.0}})],
               "segments": [s for run in ("b/seed1", "b/seed2") for s in (
                   _seg(run, "Q1 [0,96)", 56.8, n=330), _seg(run, "Q2 [96,192)", 55.6, n=97),
                   _seg(run, "Q3 [192,288)", 82.8, n=6))]}
    (row,) = experiment_rows(results)
    assert (row["front"], row["rear"], row["rear_n"]) == ("Q1 [0,96)", "Q2–Q3 [96,288)", 103)
    rear = (97 * 55.6 + 6 * 82.8) / 103
    assert row["effect_mean"] == pytest.approx(56.8 - rear) and row["effect_std"] == 0
    assert row["evidence"] == "reversed"  # two identical seeds: an interval of width 0 below 0
    (few,) = experiment_rows({**results, "segments": [s for s in results["segments"] if s["segment"] != "Q1 [0,96)"]})
    assert few["n_runs"] == 0 and few["evidence"] == "too few"  # Q2 + Q3 form one group: nothing to compare


def test_experiment_rows_mark_a_method_under_the_quality_floor():
    results = {"methods": ["b"], "runs": [_run("b/seed1", {"val": {"f1": 3.7}})],
               "segments": [_seg("b/seed1", "Q1", 5.0, n=40), _seg("b/seed1", "Q2", 0.0, n=40)]}
    (row,) = experiment_rows(results)
    assert row["below_floor"] and row["psi_mean"] == 1.0  # PSI 1 from a model at F1 3.7: flagged


def test_experiment_rows_of_a_tagging_alpha_curve():
    m = {"test D*(k)": {"metric": "f1", "f1": 80.0, "evaluated_sentences": 200, "f1_by_alpha": [80.0, 70.0, 60.0],
                        "shift_f1_by_alpha": [80.0, 80.0, 76.0]}}
    results = {"methods": ["b"], "runs": [_run("b/seed1", m), _run("b/seed2", m)], "segments": []}
    rows = {r["bucketing"]: r for r in experiment_rows(results)}
    assert rows["F1(α), duplicate"]["effect_mean"] == 20.0 and rows["F1(α), duplicate"]["psi_mean"] == 0.25
    assert rows["F1(α), shift"]["effect_mean"] == 4.0 and rows["F1(α), shift"]["psi_mean"] == pytest.approx(0.05)
    assert rows["F1(α), duplicate"]["rear"] == "copy 3" and rows["F1(α), duplicate"]["evidence"] == "yes"
    small = {"test D*(k)": {**m["test D*(k)"], "evaluated_sentences": 12}}
    assert experiment_rows({**results, "runs": [_run("b/seed1", small)]}) [0]["evidence"] == "too few"


def _store(exp_dir, segments=(), metrics=None):
    """A minimal experiment store: two finished QA runs and their segments."""
    import sqlite3

    import yaml

    from posbias.experiment import SCHEMA

    exp_dir.mkdir(parents=True)
    (exp_dir / "experiment.yaml").write_text(yaml.safe_dump({"name": "bias", "methods": {"base": {}, "rpp": {}},
                                                             "baseline": "base"}))
    metrics = metrics or {"val": {"exact_match": 50.0, "f1": 60.0, "total": 10}}
    with sqlite3.connect(exp_dir / "experiment.sqlite") as conn:
        conn.executescript(SCHEMA)
        for name in ("base/seed1", "rpp/seed1"):
            r = _run(name)
            conn.execute("INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                         (name, r["method"], r["seed"], None, None, "h", r["config_json"], str(exp_dir / name),
                          "finished", "", "", 60.0, 50.0, json.dumps(metrics), "{}"))
        conn.executemany("INSERT INTO segments VALUES (?, ?, ?, ?, ?, ?, ?)",
                         [(s["run"], s["eval_set"], s["segmenter"], s["segment"], s["n"], s["exact"], s["f1"])
                          for s in segments])


def test_experiment_report_shows_the_bias_first(tmp_path):
    from posbias.experiment.report import write_report

    segs = [_seg("base/seed1", "Q1", 80.0, n=40), _seg("base/seed1", "Q2", 40.0, n=40),
            _seg("rpp/seed1", "Q1", 70.0, n=40), _seg("rpp/seed1", "Q2", 56.0, n=40)]
    _store(tmp_path / "exp", segs)
    write_report(tmp_path / "exp", bootstrap_samples=0)
    md = (tmp_path / "exp" / "report.md").read_text(encoding="utf-8")
    sections = [line for line in md.splitlines() if line.startswith("## ")]
    assert sections[:2] == ["## Position bias", "## Results"]
    assert "| – | val | gold_position_quartile | base | Q1 (n=40) | Q2 (n=40) | 40.00 | – | 0.500 | 1 | too few" in md
    assert "| – | val | gold_position_quartile | rpp | Q1 (n=40) | Q2 (n=40) | 14.00 | – | 0.200 | 1 | too few" in md
    assert ("- base (1 run), gold_position_quartile on val: the rear group (Q2) scores 40.0 points lower than the "
            "front one (Q1) [no interval with one run]; evidence of position bias: too few runs to tell.") in md
    page = (tmp_path / "exp" / "report.html").read_text(encoding="utf-8")
    assert page.index("<h2>Position bias</h2>") < page.index("<li>base (1 run)") < page.index("<h2>Results</h2>")
    report = json.loads((tmp_path / "exp" / "report.json").read_text(encoding="utf-8"))
    assert list(report)[0] == "position_bias" and len(report["position_bias"]) == 2


def test_experiment_report_without_position_segments(tmp_path):
    from posbias.analysis.report import NO_BIAS
    from posbias.experiment.report import write_report

    _store(tmp_path / "exp", [_seg("base/seed1", "01", 80.0, segmenter="answer_length"),
                              _seg("base/seed1", "02", 40.0, segmenter="answer_length")])
    write_report(tmp_path / "exp", bootstrap_samples=0)
    md = (tmp_path / "exp" / "report.md").read_text(encoding="utf-8")
    assert NO_BIAS in md and md.index(NO_BIAS) < md.index("## Results")
    assert json.loads((tmp_path / "exp" / "report.json").read_text(encoding="utf-8"))["position_bias"] == []
