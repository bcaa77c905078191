"""reproductions/first_sentence/first_sentence_report.py on a hand-built store: every number of the
issue-31 table worked out by hand (gap closed, PSI, drop, paired Δ, cost, loss flatness) and the missing-run notes."""
from __future__ import annotations

import importlib.util
import json
import math
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest
import yaml

from posbias.experiment import connect

SCRIPT = Path(__file__).resolve().parents[2] / "reproductions" / "first_sentence" / "first_sentence_report.py"
_spec = importlib.util.spec_from_file_location("first_sentence_report", SCRIPT)
fsr = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fsr)

# 4 paragraphs x 3 questions, one answer in each sentence: buckets 1, 2, 3 hold 4 questions each.
COLORS = ["red", "blue", "green"]
B1 = [f"p{i}s1" for i in range(4)]
B2 = [f"p{i}s2" for i in range(4)]
B3 = [f"p{i}s3" for i in range(4)]


def _dev(path: Path) -> Path:
    paragraphs = []
    for i in range(4):
        sents = [f"Item {i} number {k + 1} is {c}." for k, c in enumerate(COLORS)]
        context = " ".join(sents)
        qas = []
        for k, c in enumerate(COLORS):
            start = context.index(sents[k]) + sents[k].index(c)
            qas.append({"id": f"p{i}s{k + 1}", "question": f"What colour is item {i} number {k + 1}?",
                        "answers": [{"text": c, "answer_start": start}]})
        paragraphs.append({"context": context, "qas": qas})
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]}))
    return path


def _loss_curve(before: float, recent: float) -> list[tuple[int, float]]:
    """Logged every 10 steps to 800: 5.0 early on (outside both windows), `before` over steps
    610..700, `recent` over 710..800."""
    return [(s, 5.0 if s <= 600 else before if s <= 700 else recent) for s in range(10, 801, 10)]


# Per-question F1 (0..1) by arm and seed.
ONES = dict.fromkeys(B1 + B2 + B3, 1.0)
FLOOR = {**dict.fromkeys(B1, 1.0), **dict.fromkeys(B2 + B3, 0.0)}
HALFWAY = {  # sentence 1 right; on 2+ half right on average over seeds, different per seed
    1: {**dict.fromkeys(B1, 1.0), **dict.fromkeys(B2 + B3, 0.5)},                      # 2: 50, 3: 50
    2: {**dict.fromkeys(B1 + B2, 1.0), **dict(zip(B3, [1.0, 1.0, 0.0, 0.0]))},          # 2: 100, 3: 50
    3: {**dict.fromkeys(B1, 1.0), **dict(zip(B2, [1.0, 1.0, 0.0, 0.0])), **dict.fromkeys(B3, 0.0)},  # 2: 50, 3: 0
}
ARMS = {  # arm -> seed -> (scores, train_seconds, loss curve)
    "random/baseline": {s: (ONES, 100 + 10 * s, None) for s in (1, 2, 3)},
    "first/baseline": {1: (FLOOR, 90, _loss_curve(1.0, 0.85)), 2: (FLOOR, 100, _loss_curve(1.0, 0.85)),
                       3: (FLOOR, 130, _loss_curve(1.0, 0.85))},
    "first/halfway": {1: (HALFWAY[1], 200, _loss_curve(2.0, 1.9)), 2: (HALFWAY[2], 250, _loss_curve(2.0, 1.9)),
                      3: (HALFWAY[3], 150, _loss_curve(2.0, 1.9))},
    "first/rpp": {1: (HALFWAY[1], 120, None), 2: (HALFWAY[2], 120, None)},  # seed 3 still running
}
SPEC_METHODS = ["baseline", "rpp", "halfway", "dyref"]  # dyref: no run at all


def _store(tmp_path: Path, arms=ARMS, dev_in_spec: bool = True, eval_sets: bool = False) -> Path:
    """`eval_sets`: the spec has no data.eval_file, its runs are scored on one `eval_sets: {dev: ...}`
    (reproductions/first_sentence/ko_full.yaml's layout)."""
    store = tmp_path / "store"
    store.mkdir(parents=True)
    dev = _dev(tmp_path / "dev.json")
    spec = {"name": "first_sentence_stress", "base": "demo", "datasets": {"first": {}, "random": {}},
            "methods": {m: {} for m in SPEC_METHODS}, "seeds": [1, 2, 3], "baseline": "baseline",
            "exclude": [f"random/{m}/*" for m in SPEC_METHODS[1:]]}
    if dev_in_spec and not eval_sets:
        spec["overrides"] = {"data": {"eval_file": str(dev)}}
    if eval_sets:
        spec["eval_sets"] = {"dev": str(dev)}
    set_name = "dev" if eval_sets else "val"
    (store / "experiment.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    with closing(connect(store / "experiment.sqlite")) as conn, conn:  # the store's own schema
        for arm, seeds in arms.items():
            dataset, method = arm.split("/")
            for seed, (scores, train_s, curve) in seeds.items():
                name = f"{arm}/seed{seed}"
                conn.execute("INSERT INTO runs (name, method, seed, dataset, status, wall_seconds, train_seconds, "
                             "metrics_json) VALUES (?, ?, ?, ?, 'finished', ?, ?, ?)",
                             (name, method, seed, dataset, train_s + 10, train_s,
                              json.dumps({set_name: {"f1": 100 * np.mean(list(scores.values()))}})))
                conn.executemany("INSERT INTO question_scores VALUES (?, ?, ?, ?, ?)",
                                 [(name, set_name, q, float(f1 == 1.0), f1) for q, f1 in scores.items()])
                conn.executemany("INSERT INTO curves VALUES (?, 'loss', ?, ?)",
                                 [(name, step, v) for step, v in curve or []])
                if arm == "first/halfway":  # positions: seed s trains ids 0..99 always, 256..(256 + 64 s) half the time
                    conn.executemany("INSERT INTO curves VALUES (?, 'position_updates', ?, ?)",
                                     [(name, i, 1.0) for i in range(100)]
                                     + [(name, i, 0.5) for i in range(256, 256 + 64 * seed)])
        if "first/rpp" in arms:
            conn.execute("INSERT INTO runs (name, method, seed, dataset, status) "
                         "VALUES ('first/rpp/seed3', 'rpp', 3, 'first', 'running')")
    return store


def _rows(report) -> dict:
    return {r["arm"]: r for r in report["rows"]}


def _check_gap(report) -> None:
    """Halfway closes half the gap overall ((66.7 − 33.3) / (100 − 33.3)) and on 2+ ((50 − 0) / (100 − 0));
    dividing by F1_random instead gives 1/3 overall."""
    half = _rows(report)["first/halfway"]
    assert half["gap"]["value"] == pytest.approx(0.5, abs=1e-12)
    assert half["gap_later"]["value"] == pytest.approx(0.5, abs=1e-12)


def test_gap_closed_by_hand():
    assert fsr.gap_closed(0.6, 0.2, 1.0) == pytest.approx(0.5)
    assert fsr.gap_closed(0.2, 0.2, 0.8) == 0.0 and fsr.gap_closed(0.8, 0.2, 0.8) == 1.0
    assert math.isnan(fsr.gap_closed(0.5, 0.4, 0.4))  # no gap to close
    np.testing.assert_allclose(fsr.gap_closed(np.array([0.3, 0.5, np.nan]), np.array([0.1, 0.5, 0.1]), 0.9),
                               [0.25, 0.0, np.nan])


def test_loss_flatness_windows():
    f = fsr.loss_flatness(_loss_curve(2.0, 1.9))
    assert f["final"] == pytest.approx(1.9) and f["change"] == pytest.approx(-0.05)
    short = fsr.loss_flatness([(10, 3.0), (20, 2.0)])
    assert short == {"final": 2.5, "change": None}  # no 100 steps before the last 100


def test_report_numbers(tmp_path):
    report = fsr.build_report(_store(tmp_path), samples=500, seed=0)
    rows = _rows(report)
    assert list(rows) == ["random/baseline", "first/baseline", "first/rpp", "first/halfway"]
    meta = report["meta"]
    assert meta["questions"] == 12 and meta["later_questions"] == 8 and meta["gap"] and meta["delta"]
    assert meta["bucket_questions"] == {"1": 4, "2": 4, "3": 4, "4": 0, "5+": 0}

    ceiling, floor, half = rows["random/baseline"], rows["first/baseline"], rows["first/halfway"]
    assert ceiling["f1"] == 100 and ceiling["f1_later"] == 100
    assert floor["f1"] == pytest.approx(100 / 3) and floor["f1_later"] == 0
    # halfway per seed: overall (4 + 4, 6, 2) / 12, 2+ (4, 6, 2) / 8
    assert half["f1"] == pytest.approx(200 / 3) and half["f1_later"] == pytest.approx(50)
    assert half["f1_std"] == pytest.approx(np.std([200 / 3, 250 / 3, 50], ddof=1))
    _check_gap(report)
    for key in ("gap", "gap_later"):  # a real spread (the seeds disagree per question) around 0.5
        g = half[key]
        assert g["ci_low"] < g["value"] < g["ci_high"] and g["n"] == (12 if key == "gap" else 8)
    assert "gap" in floor and floor["gap"]["value"] == 0 and ceiling["gap"]["value"] == 1

    # Δ paired by seed, p from scipy's own paired t-test
    from scipy import stats

    d = half["delta_f1"]
    assert d["n"] == 3 and d["diff"] == pytest.approx(100 / 3)
    assert d["p"] == pytest.approx(stats.ttest_rel([200 / 3, 250 / 3, 50], [100 / 3] * 3).pvalue)
    assert half["delta_f1_later"]["diff"] == pytest.approx(50)
    assert "delta_f1" not in floor

    # buckets (means over seeds) and PSI / drop per run: seeds (100, 50, 50), (100, 100, 50), (100, 50, 0)
    assert half["by_bucket"]["1"] == 100 and half["by_bucket"]["2"] == pytest.approx(200 / 3)
    assert half["by_bucket"]["3"] == pytest.approx(100 / 3) and math.isnan(half["by_bucket"]["4"])
    assert half["psi"] == pytest.approx(2 / 3) and half["psi_std"] == pytest.approx(math.sqrt(1 / 12))
    assert half["drop"] == pytest.approx(200 / 3)
    assert floor["psi"] == 1 and floor["drop"] == 100 and floor["psi_std"] == 0
    assert ceiling["psi"] == 0 and ceiling["drop"] == 0

    # cost: medians 200 vs 100 (train), 210 vs 110 (wall)
    assert half["train_seconds"] == 200 and half["train_seconds_ratio"] == pytest.approx(2.0)
    assert half["wall_seconds"] == 210 and half["wall_seconds_ratio"] == pytest.approx(210 / 110)

    # loss: last 100 steps vs the 100 before
    assert half["final_loss"] == pytest.approx(1.9) and half["loss_change"] == pytest.approx(-0.05) and half["flat"]
    assert floor["final_loss"] == pytest.approx(0.85) and floor["loss_change"] == pytest.approx(-0.15)
    assert not floor["flat"]
    assert ceiling["loss_change"] is None and not ceiling["flat"]  # no curve in the store

    # loss per 200 steps: 5.0 up to step 600, then before (610..700) and recent (710..800) in equal parts
    assert half["loss_blocks"] == pytest.approx([5.0, 5.0, 5.0, (2.0 + 1.9) / 2])
    assert floor["loss_blocks"] == pytest.approx([5.0, 5.0, 5.0, (1.0 + 0.85) / 2]) and ceiling["loss_blocks"] == []
    # positions: ids 0-127 trained 100 of 128 always; 256-511: 64, 128, 192 of 256 ids half the time
    assert half["id_updates"]["0-127"] == pytest.approx(100 * 100 / 128)
    assert half["id_updates"]["128-255"] == 0
    assert half["id_updates"]["256-511"] == pytest.approx(100 * 0.5 * (64 + 128 + 192) / 3 / 256)
    assert floor["id_updates"] is None and half["id_update_runs"] == 3

    # missing runs are stated, not fatal
    rpp = rows["first/rpp"]
    assert rpp["runs"] == 2 and rpp["expected_runs"] == 3 and rpp["delta_f1"]["n"] == 2
    notes = "\n".join(report["notes"])
    assert "first/rpp: 2 of 3 seeds finished (seed3: running)" in notes
    assert "first/dyref: 0 of 3 seeds finished (seed1, seed2, seed3: not started)" in notes

    text = fsr.render_markdown(report)
    assert "| first/rpp | 2 of 3 |" in text and "0.50 [" in text and "-5.0% flat" in text
    assert "-15.0% not flat (3 of 3 runs)" in text and "| 1 (n=4) | 2 (n=4) |" in text
    assert "| first/halfway | 5.000 | 5.000 | 5.000 | 1.950 | 78.1 | 0.0 | 25.0 |" in text


def test_a_wrong_gap_formula_fails(tmp_path, monkeypatch):
    store = _store(tmp_path)
    monkeypatch.setattr(fsr, "gap_closed", lambda arm, floor, ceiling: (np.asarray(arm) - floor) / ceiling)
    with pytest.raises(AssertionError):
        _check_gap(fsr.build_report(store, samples=20))


def test_cli_writes_markdown_and_json(tmp_path, capsys):
    store = _store(tmp_path)
    out, js = tmp_path / "r" / "table.md", tmp_path / "r" / "table.json"
    assert fsr.main(["--store", str(store), "--samples", "200", "--out", str(out), "--json", str(js)]) == 0
    printed = capsys.readouterr().out
    assert out.read_text() == printed and "| first/halfway | 3 |" in printed
    data = json.loads(js.read_text())  # NaN written as null
    half = next(r for r in data["rows"] if r["arm"] == "first/halfway")
    assert half["gap"]["value"] == pytest.approx(0.5) and half["by_bucket"]["4"] is None
    assert data["meta"]["dev"] == str(tmp_path / "dev.json")  # from the spec's data.eval_file


def test_without_references_prints_f1_and_says_why(tmp_path, capsys):
    arms = {k: v for k, v in ARMS.items() if k in ("first/halfway", "first/rpp")}
    store = _store(tmp_path, arms, dev_in_spec=False)
    assert fsr.main(["--store", str(store), "--dev", str(tmp_path / "dev.json"), "--samples", "10"]) == 0
    text = capsys.readouterr().out
    assert "gap closed" not in text and "Δ F1" not in text and "| first/halfway | 3 | 66.7 ± 16.7 |" in text
    assert "no gap columns: no finished run of random/baseline and first/baseline" in text
    assert "first/baseline: 0 of 3 seeds finished" in text


def test_missing_store_is_an_error(tmp_path, capsys):
    assert fsr.main(["--store", str(tmp_path)]) == 2
    assert "holds no experiment.sqlite" in capsys.readouterr().err


def test_gap_closed_over_seeds_by_hand(tmp_path):
    """Per seed: the arm, floor and ceiling runs of one seed number give one share; mean and t-interval
    over seeds. The stress benchmark's bias product (0.676, 0.705, 0.771 by seed) spans about [0.60, 0.84]."""
    g = fsr.gap_over_seeds({1: 67.6, 2: 70.5, 3: 77.1, 4: 50.0}, {1: 0.0, 2: 0.0, 3: 0.0}, {1: 100.0, 2: 100.0, 3: 100.0})
    assert g["n"] == 3 and g["values"] == pytest.approx({1: 0.676, 2: 0.705, 3: 0.771})
    assert (round(g["ci_low"], 2), round(g["ci_high"], 2)) == (0.60, 0.84)
    assert fsr.gap_over_seeds({1: 5.0}, {1: 3.0}, {1: 3.0})["n"] == 0  # no gap on that seed

    report = fsr.build_report(_store(tmp_path), samples=200, seed=0)
    half = _rows(report)["first/halfway"]
    # halfway per seed: overall F1 (200/3, 250/3, 50) against floor 100/3 and ceiling 100 -> 0.5, 0.75, 0.25
    assert half["gap_seeds"]["values"] == pytest.approx({1: 0.5, 2: 0.75, 3: 0.25})
    assert half["gap_seeds"]["mean"] == pytest.approx(0.5)
    assert half["gap_seeds"]["ci_high"] - 0.5 == pytest.approx(4.302653 * 0.25 / np.sqrt(3), abs=1e-5)
    deltas = [r[f"delta_{k}"] for r in report["rows"] for k in ("f1", "f1_later") if f"delta_{k}" in r]
    assert deltas and all(d["family"] == len(deltas) and d["p_holm"] >= d["p"] for d in deltas)
    text = fsr.render_markdown(report)
    assert "Holm" in text and "0.50 [" in text and "(3 seeds)" in text


def test_a_spec_scored_on_its_one_eval_set_is_read_without_flags(tmp_path):
    """A spec without data.eval_file whose runs are scored on one `eval_sets` entry (ko_full): the report
    finds that set's file and scores by itself; the same numbers as the eval_file layout."""
    by_eval_file = fsr.build_report(_store(tmp_path / "a"), samples=200, seed=0)
    report = fsr.build_report(_store(tmp_path / "b", eval_sets=True), samples=200, seed=0)
    assert report["meta"]["eval_set"] == "dev" and report["meta"]["dev"] == str(tmp_path / "b" / "dev.json")
    assert report["meta"]["questions"] == by_eval_file["meta"]["questions"] == 12
    _check_gap(report)
    assert _rows(report)["first/halfway"]["f1"] == _rows(by_eval_file)["first/halfway"]["f1"]
    asked = fsr.build_report(_store(tmp_path / "c", eval_sets=True), samples=20, eval_set="val")  # not there
    assert any("no `val` question scores" in n for n in asked["notes"])
