"""reproductions/which_method.py: the "Which method should I use?" page, generated from
reproductions/which_method.yaml and the archived stores; its verdict rule on synthetic numbers."""
from __future__ import annotations

import importlib.util
import math
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "reproductions" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


wm = _load("which_method")
SPEC = yaml.safe_load((ROOT / "reproductions" / "which_method.yaml").read_text(encoding="utf-8"))
STORES = ROOT / "docs" / "experiments"
M = "\u2212"


def c(diff, lo, hi, n=3):
    return {"n": n, "diff": diff, "ci_low": lo, "ci_high": hi}


ONE = {"n": 1, "diff": 2.0, "ci_low": math.nan, "ci_high": math.nan}


@pytest.fixture(scope="module")
def text() -> str:
    return wm.page()


def _section(text: str, task: str) -> str:
    head = f"## {wm._md(task)}\n"
    assert head in text, task
    return text.split(head, 1)[1].split("\n## ", 1)[0]


def _row(section: str, label: str) -> list[str]:
    rows = [line for line in section.splitlines() if line.startswith(f"| {wm._md(label)} |")]
    assert len(rows) == 1, label
    return [x.strip() for x in rows[0].strip("|").split("|")]


# -------------------------------------------------------------------------------- the page, real stores

def test_page_builds_and_every_task_appears(text):
    assert text.startswith("# Which method should I use?\n")
    for task in SPEC["tasks"]:
        if not (STORES / task["store"] / "experiment.sqlite").is_file():
            assert task.get("optional"), task["task"]  # else page() raised
            assert f"## {wm._md(task['task'])}\n" not in text
            continue
        section = _section(text, task["task"])
        assert section.count("**Recommendation:**") == 1
        for label in task["methods"].values():
            row = _row(section, label)
            assert row[-2 if task.get("also") else -1] in wm.WORDS
    required = [t for t in SPEC["tasks"] if not t.get("optional")]
    assert {t["store"] for t in required} >= {"tpb_conll_authors", "tpb_ewt_authors", "rp_squad_d50_3ep",
                                              "first_sentence_stress", "map_squad"}
    optional = {t["store"] for t in SPEC["tasks"] if t.get("optional")}
    assert optional >= {"rp_squad_d50_3ep_reinit", "tpb_conll_authors_reinit"}


def test_page_is_user_facing(text):
    assert not re.search(r"\b[Ii]ssue\b|#\d|\b20\d\d-\d\d-\d\d\b", text)
    assert "regimes listed" in text and "MiniLM-L6" in text
    for target in re.findall(r"\]\(([^)]*)\)", text):  # links only to the Results pages beside this one
        assert re.fullmatch(r"[a-z-]+\.md", target), target
        summary = yaml.safe_load((ROOT / "reproductions" / "summary.yaml").read_text(encoding="utf-8"))
        assert target[:-3] in summary["papers"], target
    # numbers: 2 decimals (p-values 3), U+2212 minus signs only
    for line in (x for x in text.splitlines() if x.startswith("| ") and "---" not in x and "method" not in x):
        assert not re.search(r"-\d", line), line
        cells = [c.strip() for c in line.strip("|").split("|")]
        for i, c in enumerate(cells):
            numbers = re.findall(r"[+−]?\d+\.\d+", c)
            p_cell = i == 2 and re.fullmatch(r"<0\.001|0\.\d\d\d|1\.000|—", c)
            assert p_cell or all(re.fullmatch(r"[+−]?\d+\.\d\d", n) for n in numbers), line


def _gap_ttest(store: str, method: str, metric: str, minus: str, eval_set: str = "test D*(k)") -> dict:
    """method − baseline of (metric − minus) per seed, recomputed here from the store's runs."""
    from posbias.analysis.stats import paired_ttest
    from posbias.experiment.aggregation import metric_value

    results = wm.load_results(STORES / store)

    def gaps(m):
        return {r["seed"]: metric_value(r["metrics"][eval_set], metric) - metric_value(r["metrics"][eval_set], minus)
                for r in results["runs"] if r["method"] == m and r["status"] == "finished"}

    return paired_ttest(gaps(method), gaps(results["baseline"]))


def test_a_page_number_is_the_store_value(text):
    """tpb_conll_authors, CP: the page's gap change is (sub-token F1(10) − sub-token F1), CP − baseline, per
    seed, from the store; the quality column is aggregate()'s."""
    t = _gap_ttest("tpb_conll_authors", "cp", "sub-token F1(10)", "sub-token F1")
    task = next(t for t in SPEC["tasks"] if t["store"] == "tpb_conll_authors")
    cells = _row(_section(text, task["task"]), task["methods"]["cp"])
    want = f"{t['diff']:+.2f} [{t['ci_low']:.2f}, {t['ci_high']:.2f}]".replace("-", M)
    assert cells[1] == want == "+2.14 [1.37, 2.91]"
    quality = next(r for r in wm.aggregate(wm.load_results(STORES / "tpb_conll_authors"), bootstrap_samples=0)
                   if r["eval_set"] == "test" and r["metric"] == "F1" and r["method"] == "cp")["ttest"]
    assert cells[3] == f"{quality['diff']:+.2f} [{quality['ci_low']:.2f}, {quality['ci_high']:.2f}]".replace("-", M)
    assert cells[4] == str(t["n"]) == "5"
    # Holm over the task's two methods: CP's p doubled at most, RPP's the larger kept
    rpp = _gap_ttest("tpb_conll_authors", "rpp", "sub-token F1(10)", "sub-token F1")
    assert float(cells[2]) == pytest.approx(min(1.0, 2 * min(t["p"], rpp["p"])) if t["p"] < rpp["p"]
                                            else max(2 * rpp["p"], t["p"]), abs=5e-4)


def test_a_gain_at_every_position_is_not_a_gap_change(text):
    """UD EWT RPP lifts accuracy(10) about as much as accuracy: its gap change is within seed noise."""
    task = next(t for t in SPEC["tasks"] if t["store"] == "tpb_ewt_authors")
    cells = _row(_section(text, task["task"]), task["methods"]["rpp"])
    assert cells[1] == "+0.15 [−0.05, 0.36]" and cells[5] == "within seed noise"


def test_a_segment_is_aggregate_segments_value():
    """One segment read by the page equals aggregate_segments' row; the pooled 2+ segments of the
    first-sentence store equal the first-sentence report's "+2.3 on sentences 2+, p 0.088"."""
    from posbias.experiment.aggregation import aggregate_segments

    results = wm.load_results(STORES / "rp_squad_d50_3ep")
    spec = {"eval_set": "test", "segmenter": "first_x_tokens(x=100)", "segment": "S100(2)"}
    ours = wm._segment_ttest(results, spec, "random_padding", None, "test")
    theirs = next(r for r in aggregate_segments(results, bootstrap_samples=0) if r["eval_set"] == "test"
                  and r["segment"] == "S100(2)" and r["method"] == "random_padding")["ttest"]
    for key in ("n", "diff", "ci_low", "ci_high"):
        assert ours[key] == pytest.approx(theirs[key], abs=1e-9)
    results = wm.load_results(STORES / "first_sentence_stress", baseline="bias_product_sentence")
    pooled = wm._segment_ttest(results, {"eval_set": "val", "segmenter": "answer_sentence",
                                         "segment": ["2", "3", "4", "5+"]}, "random_padding_k16_bp_sentence", "first", "t")
    assert (round(pooled["diff"], 1), round(pooled["p"], 3)) == (2.3, 0.088)


# -------------------------------------------------------------------------------- the rule, synthetic

@pytest.mark.parametrize("bias, quality, better, word", [
    (c(2.0, 1.0, 3.0), c(0.5, -0.2, 1.2), "higher", "recommended here"),
    (c(2.0, 1.0, 3.0), c(0.7, 0.5, 0.9), "higher", "recommended here"),
    (c(2.0, 1.0, 3.0), c(-1.0, -1.5, -0.5), "higher", "costs quality"),
    (c(0.5, -1.0, 2.0), c(-1.0, -1.5, -0.5), "higher", "costs quality"),
    (c(0.5, -1.0, 2.0), c(0.1, -0.5, 0.7), "higher", "within seed noise"),
    (c(-2.0, -3.0, -1.0), c(0.1, -0.5, 0.7), "higher", "increases position bias"),
    (c(-2.0, -3.0, -1.0), c(0.1, -0.5, 0.7), "lower", "recommended here"),
    (c(2.0, 1.0, 3.0), c(0.1, -0.5, 0.7), "lower", "increases position bias"),
    (c(-2.0, -3.0, -1.0), c(-1.0, -1.5, -0.5), "higher", "increases position bias"),  # checked before quality
    ({**c(2.0, 1.0, 3.0), "p": 0.02, "p_holm": 0.06}, c(0.1, -0.5, 0.7), "higher", "within seed noise"),
    ({**c(2.0, 1.0, 3.0), "p": 0.01, "p_holm": 0.02}, c(0.1, -0.5, 0.7), "higher", "recommended here"),
    ({**c(-2.0, -3.0, -1.0), "p": 0.01, "p_holm": 0.02}, c(0.1, -0.5, 0.7), "higher", "increases position bias"),
    (ONE, c(0.1, -0.5, 0.7), "higher", "not tested over seeds"),
    (c(2.0, 1.0, 3.0), dict(ONE), "higher", "not tested over seeds"),
    (None, c(-1.0, -1.5, -0.5), "higher", "costs quality"),
    (None, c(0.3, -0.5, 1.1), "higher", "within seed noise"),
    (None, c(1.0, 0.5, 1.5), "higher", "gains quality"),
])
def test_verdict_rule(bias, quality, better, word):
    assert wm.verdict(bias, quality, better) == word


def _rows(*specs):
    return [{"label": label, "bias": b, "quality": q, "also": a, "verdict": wm.verdict(b, q)}
            for label, b, q, a in specs]


def test_recommendation_line():
    good = _rows(("CP", c(2.16, 1.01, 3.32), c(0.3, -0.2, 0.8), None), ("RPP", c(-0.73, -2.99, 1.54), c(0.6, -0.2, 1.4), None))
    line = wm.recommendation(good, "MiniLM-L6, 3 seeds")
    assert line == ("In this regime, CP (Δ +2.16 [1.01, 3.32]) reduced position bias without a measurable quality"
                    " loss; 3 seeds; regime: MiniLM-L6, 3 seeds.")
    assert "RPP" not in line
    up = _rows(("CP", c(2.16, 1.01, 3.32), c(0.72, 0.52, 0.93), c(-5.0, -9.0, -2.0)))
    assert "it raised quality too, so part of the gain may be general" in wm.recommendation(up, "r")
    assert "it lost F1 on A (last column)" in wm.recommendation(up, "r", also="F1 on A")
    assert "general" not in wm.recommendation(up, "r", also="F1 on A")
    noise = _rows(("RPP", c(-0.73, -2.99, 1.54), c(0.6, -0.2, 1.4), None),
                  ("RP", c(-12.0, -17.0, -6.0), c(-10.0, -14.0, -6.0), None))
    assert wm.recommendation(noise, "r") == (
        "In this regime no method reduced position bias beyond seed noise: keep the baseline, or test on your"
        " own data with `posbias experiment run`.")
    costly = _rows(("X", c(3.0, 1.0, 5.0), c(-2.0, -3.0, -1.0), None))
    line = wm.recommendation(costly, "r")
    assert line.startswith("In this regime X (Δ +3.00 [1.00, 5.00]) reduced position bias only at a cost in quality")
    assert "without a measurable" not in line and line.endswith("`posbias experiment run`.")
    one = _rows(("X", ONE, c(0.1, -0.5, 0.7), None))
    assert one[0]["verdict"] == "not tested over seeds"
    assert "no method was tested over seeds" in wm.recommendation(one, "r")
    assert wm.cell(ONE) == "+2.00 (1 seed, no interval)"
    assert "none is recommended" in wm.recommendation(_rows(("H", None, c(1.0, 0.5, 1.5), None)), "r", has_bias=False)


def test_numbers():
    assert wm.num(-0.7349) == "−0.73" and wm.num(2.164, sign=True) == "+2.16" and wm.num(2.164) == "2.16"
    assert wm.num(-0.004, sign=True) == "0.00"
    assert wm.cell(c(-0.11, -2.87, 2.66)) == "−0.11 [−2.87, 2.66]" and wm.cell(None) == "—"


# -------------------------------------------------------------------------------- missing stores

def _task(store, **kw):
    return {"task": f"Task on {store}", "regime": "r", "store": store, "methods": {"cp": "CP"},
            "bias": {"eval_set": "test D*(k)", "metric": "sub-token F1(10)", "minus": "sub-token F1", "label": "b"},
            "quality": {"eval_set": "test", "metric": "F1", "label": "q"}, **kw}


def test_optional_task_without_store_is_skipped(tmp_path):
    (tmp_path / "docs" / "experiments").mkdir(parents=True)
    (tmp_path / "docs" / "experiments" / "tpb_conll_authors").symlink_to(STORES / "tpb_conll_authors")
    spec = {"tasks": [_task("tpb_conll_authors"), _task("absent_store", optional=True)]}
    text = wm.page(tmp_path, spec)
    assert "## Task on tpb_conll_authors" in text and "absent_store" not in text
    assert _row(_section(text, "Task on tpb_conll_authors"), "CP")[1] == "+2.14 [1.37, 2.91]"


def test_required_task_without_store_is_an_error(tmp_path, capsys):
    spec = {"tasks": [_task("absent_store")]}
    with pytest.raises(FileNotFoundError) as e:
        wm.page(tmp_path, spec)
    assert "absent_store" in str(e.value) and "\n" not in str(e.value)
    path = tmp_path / "tasks.yaml"
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    assert wm.main(["--tasks", str(path)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "absent_store" in err


def test_main_writes_the_page(tmp_path):
    out = tmp_path / "which-method.md"
    assert wm.main(["--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8").startswith("# Which method should I use?")


@pytest.mark.parametrize("content, message", [("", "the file is empty"), ("tasks: 3\n", "tasks must be a non-empty list"),
                                              ("tasks: [{task: t}]\n", "tasks[0].regime must be a text")])
def test_a_malformed_tasks_file_is_one_line_and_exit_2(tmp_path, capsys, content, message):
    path = tmp_path / "tasks.yaml"
    path.write_text(content, encoding="utf-8")
    assert wm.main(["--tasks", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err
