"""Experiments: grid expansion, identical data order, the SQLite store, resuming, aggregation, report."""
import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

import posbias
import posbias.qa.readers
from posbias.analysis.stats import mean_std, paired_bootstrap, paired_ttest
from posbias.config import PRESETS
from posbias.errors import ConfigError
from posbias.experiment import aggregate, load_experiment, load_results

from helpers import cli_here

SMOKE = PRESETS / "experiments" / "smoke.yaml"
BIN = Path(sys.executable).parent


def smoke_spec(tmp_path, **changes):
    spec = yaml.safe_load(SMOKE.read_text(encoding="utf-8"))
    spec.update(changes)
    spec["output_dir"] = str(tmp_path / "exp")
    return spec


@pytest.mark.parametrize("path", sorted((PRESETS / "experiments").glob("*.yaml")), ids=lambda p: p.stem)
def test_bundled_experiments_expand(path):
    exp = load_experiment(path)
    assert len(exp.runs) == len(exp.methods) * len(yaml.safe_load(path.read_text(encoding="utf-8"))["seeds"]) >= 4


def test_grid_expansion(tmp_path):
    spec = smoke_spec(tmp_path, datasets={"a": {}, "b": {"data": {"max_seq_len": 160}}}, train_sizes=[16, 32])
    exp = load_experiment(spec)
    assert len(exp.runs) == 2 * 2 * 2 * 2
    names = [r.name for r in exp.runs]
    assert len(set(names)) == 16 and "b/n32/all_token_softmax/seed2" in names
    run = next(r for r in exp.runs if r.name == "b/n32/all_token_softmax/seed2")
    assert run.seed == run.config.train.seed == 2
    assert run.config.data.max_train_examples == 32 and run.config.data.max_seq_len == 160
    assert run.config.model.head_options == {"softmax_over": "all"}
    assert run.config.train.output_dir == str(tmp_path / "exp" / "runs" / "b/n32/all_token_softmax/seed2")
    assert exp.baseline == "context_softmax"  # the first method unless `baseline:` says otherwise
    assert len({r.config_hash for r in exp.runs}) == 16


@pytest.mark.parametrize("change, message", [
    ({"colour": 1}, "unknown key 'colour'"),
    ({"seeds": []}, "seeds must be a non-empty list"),
    ({"baseline": "nope"}, "baseline 'nope'"),
    ({"methods": {"m": {"train": {"lrr": 1}}}}, "experiment run m/seed1: unknown config key train.lrr"),
])
def test_bad_specs_are_refused(tmp_path, change, message):
    with pytest.raises(ConfigError, match=message):
        load_experiment(smoke_spec(tmp_path, **change))


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("smoke")
    spec = smoke_spec(tmp)
    result = posbias.experiment_run(spec, progress=False)
    return tmp / "exp", spec, result


def test_smoke_experiment_records_every_run(smoke):
    exp_dir, spec, result = smoke
    assert len(result["ran"]) == 4 and not result["skipped_finished"]
    with sqlite3.connect(exp_dir / "experiment.sqlite") as conn:
        rows = conn.execute("SELECT name, status, metrics_json FROM runs").fetchall()
        assert {r[1] for r in rows} == {"finished"} and len(rows) == 4
        for _, _, m in rows:
            m = json.loads(m)
            assert set(m) == {"val", "test"} and m["test"]["total"] == 433
        n = conn.execute("SELECT COUNT(*) FROM question_scores WHERE eval_set='test'").fetchone()[0]
        assert n == 4 * 433
        assert conn.execute("SELECT COUNT(*) FROM curves WHERE kind='val_f1'").fetchone()[0] == 4 * 2


def test_same_seed_same_data_order_across_methods(smoke):
    exp_dir = smoke[0]
    order = lambda m, s: json.loads((exp_dir / "runs" / m / f"seed{s}" / "data_order" / "epoch-0.json").read_text(encoding="utf-8"))["batches"]  # noqa: E731
    assert order("context_softmax", 1) == order("all_token_softmax", 1)
    assert order("context_softmax", 2) == order("all_token_softmax", 2)
    assert order("context_softmax", 1) != order("context_softmax", 2)


def test_rerun_skips_finished_runs(smoke):
    exp_dir, spec, _ = smoke
    again = posbias.experiment_run(spec, progress=False)
    assert again["ran"] == [] and len(again["skipped_finished"]) == 4


def test_changed_config_is_refused_unless_forced(smoke):
    exp_dir, spec, _ = smoke
    changed = dict(spec, methods={**spec["methods"], "context_softmax": {"train": {"lr": 0.01}}})
    with pytest.raises(ConfigError, match="context_softmax/seed1 changed.*--force"):
        posbias.experiment_run(changed, progress=False)
    with sqlite3.connect(exp_dir / "experiment.sqlite") as conn:  # nothing was touched
        assert {r[0] for r in conn.execute("SELECT status FROM runs")} == {"finished"}


def test_report_files(smoke):
    exp_dir = smoke[0]
    res = posbias.experiment_report(exp_dir, bootstrap_samples=500)
    md = (exp_dir / "report.md").read_text(encoding="utf-8")
    page = (exp_dir / "report.html").read_text(encoding="utf-8")
    assert "all_token_softmax" in md and "± " in md and "t-test p" in md
    assert "| answer_length | 01 |" in md  # the smoke spec's gold-answer-length segments
    pngs = sorted((exp_dir / "plots").glob("*.png"))
    assert {p.name for p in pngs} >= {"comparison_f1.png", "comparison_em.png", "learning_curves.png"}
    import base64
    for p in pngs:  # self-contained: every plot is embedded in the page and linked from the Markdown
        assert base64.b64encode(p.read_bytes()).decode() in page
        assert f"plots/{p.name}" in md
    assert res["rows"] == 2 * 2 * 2  # 2 eval sets x 2 metrics x 2 methods
    # Which code trained the runs: this checkout's commit (the smoke runs trained in this process).
    from posbias.utils import git_state
    state = git_state(Path(posbias.__file__).resolve().parents[1])
    code = state["git_commit"][:12] + (" + changes" if state["git_dirty"] else "") if state else "not recorded"
    n = len(load_results(exp_dir)["runs"])
    assert f"| {code} | posbias {posbias.__version__}, torch " in md and f" | {n} | " in md.split("## Code and versions")[1]


def test_an_archive_keeps_the_bootstrap_of_segments_that_need_no_checkpoint(smoke, tmp_path):
    # `experiment copy` leaves the checkpoints behind: answer lengths (text alone) can still be
    # labelled per question, token positions (first_x_tokens: the run's tokenizer) cannot.
    from posbias.experiment import aggregate_segments
    archive = tmp_path / "archive"
    posbias.experiment_copy(smoke[0], archive)
    with sqlite3.connect(archive / "experiment.sqlite") as conn:  # the archive on another machine
        conn.execute("UPDATE runs SET output_dir = ? || name", (str(tmp_path / "gone") + "/",))
    conn.close()
    results = load_results(archive)
    by = {}
    for r in aggregate_segments(results, bootstrap_samples=200):
        if r["method"] != results["baseline"]:
            by.setdefault(r["segmenter"], []).append("bootstrap" in r)
    assert by["answer_length"] and all(by["answer_length"])
    first_x = next(k for k in by if k.startswith("first_x_tokens"))
    assert by[first_x] and not any(by[first_x])
    live = [r for r in aggregate_segments(load_results(smoke[0]), bootstrap_samples=200)
            if r["segmenter"].startswith("first_x_tokens") and r["method"] != results["baseline"]]
    assert live and all("bootstrap" in r for r in live)  # with the checkpoints present


def test_code_table_groups_runs_by_commit_and_versions():
    from posbias.analysis.report import code_table
    libs = {"posbias": "0.1.0", "torch": "2.13.0", "transformers": "5.24.0", "numpy": "2"}
    runs = [{"name": "a/seed1", "status": "finished", "versions_json": json.dumps({**libs, "git_commit": "f" * 40,
                                                                                   "git_dirty": False})},
            {"name": "a/seed2", "status": "finished", "versions_json": json.dumps({**libs, "git_commit": "f" * 40,
                                                                                   "git_dirty": False})},
            {"name": "b/seed1", "status": "finished", "versions_json": json.dumps({**libs, "git_commit": "e" * 40,
                                                                                   "git_dirty": True})},
            {"name": "c/seed1", "status": "finished", "versions_json": json.dumps(libs)},  # an older record
            {"name": "c/seed2", "status": "running", "versions_json": None}]
    head, body = code_table(runs)
    v = "posbias 0.1.0, torch 2.13.0, transformers 5.24.0"
    assert body == [["f" * 12, v, "2", "a/seed1 … a/seed2"], ["e" * 12 + " + changes", v, "1", "b/seed1"],
                    ["not recorded", v, "1", "c/seed1"]]


def test_report_of_a_selection_against_another_baseline(smoke, tmp_path):
    exp_dir = smoke[0]
    full = {(r["eval_set"], r["metric"], r["method"]): r for r in aggregate(load_results(exp_dir), 500)}
    out = tmp_path / "vs_all"
    res = posbias.experiment_report(exp_dir, bootstrap_samples=500, baseline="all_token_softmax", output_dir=out)
    md = (out / "report.md").read_text(encoding="utf-8")
    assert "(baseline **all_token_softmax**)" in md and res["report_md"] == str(out / "report.md")
    assert "500 resamples" in md and "10,000" not in md  # the count used, not a fixed 10,000
    quick = posbias.experiment_report(exp_dir, bootstrap_samples=0, output_dir=tmp_path / "quick")
    assert "no resamples here" in Path(quick["report_md"]).read_text(encoding="utf-8")
    rows = {(r["eval_set"], r["metric"], r["method"]): r for r in json.loads((out / "report.json").read_text())["rows"]}
    for (ev, metric, method), r in rows.items():  # the same means; the Δ now taken the other way round
        assert r["mean"] == pytest.approx(full[ev, metric, method]["mean"])
        if method == "context_softmax":
            assert r["ttest"]["diff"] == pytest.approx(-full[ev, metric, "all_token_softmax"]["ttest"]["diff"])
        assert ("ttest" in r) == (method == "context_softmax")
    assert (out / "plots" / "comparison_f1.png").is_file()

    one_seed = load_results(exp_dir, only=["*/seed1"])
    assert {r["name"] for r in one_seed["runs"]} == {"context_softmax/seed1", "all_token_softmax/seed1"}
    assert {q["run"] for q in one_seed["questions"]} == {"context_softmax/seed1", "all_token_softmax/seed1"}
    with pytest.raises(ConfigError, match="--only nope/\\* matches none"):
        load_results(exp_dir, only=["nope/*"])
    with pytest.raises(ConfigError, match="--baseline nope: no runs"):
        load_results(exp_dir, baseline="nope")
    r = cli_here("experiment", "report", str(exp_dir), "--only", "*/seed2", "--baseline", "all_token_softmax",
                 "--output-dir", str(tmp_path / "cli"), "--bootstrap-samples", "200")
    assert r.returncode == 0, r.stderr
    assert "Runs selected with --only \\*/seed2." in (tmp_path / "cli" / "report.md").read_text(encoding="utf-8")


def test_cli_dry_run_prints_commands(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(smoke_spec(tmp_path), sort_keys=False))
    r = cli_here("experiment", "run", str(spec), "--dry-run")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    # Each line: the run, its config hash, and the job command that runs it alone under its lock
    # (the run's config written beside it; the store is left to `experiment collect`).
    assert len(lines) == 4
    for line in lines:
        name, _, cmd = line.split("\t")
        assert cmd.endswith(f"--no-store --no-wait --only {name}") and cmd.startswith("posbias experiment run ")
        assert (tmp_path / "exp" / "runs" / name / "run_config.yaml").is_file()
    assert not (tmp_path / "exp" / "experiment.sqlite").exists()


def test_interrupted_experiment_resumes_to_the_same_result(tmp_path):
    """Kill the experiment mid-run (SIGINT, like Ctrl-C, then SIGKILL), run it again: finished runs
    are not redone and the interrupted one continues from its checkpoint to the uninterrupted result."""
    spec = smoke_spec(tmp_path, seeds=[1], eval_sets={})
    spec["overrides"] = {"train": {"max_steps": 60, "save_every": 4, "eval_every": 30, "log_every": 5},
                         "data": {"max_train_examples": 48, "max_eval_examples": 16, "max_seq_len": 128,
                                  "stride": 48}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))  # method order: the first is the baseline
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # SIGINT back to its default in the child: a test suite started in the background from a
    # non-interactive shell (`make test &`) inherits SIGINT ignored, and the run would finish.
    proc = subprocess.Popen([str(BIN / "posbias"), "experiment", "run", str(path)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    state = tmp_path / "exp" / "runs" / "all_token_softmax" / "seed1" / "checkpoints" / "last" / "trainer_state.json"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:  # the second run is half-way through
        if state.is_file() and json.loads(state.read_text(encoding="utf-8"))["global_step"] >= 12:
            break
        time.sleep(0.1)
    assert proc.poll() is None, "the experiment ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    with sqlite3.connect(tmp_path / "exp" / "experiment.sqlite") as conn:
        status = dict(conn.execute("SELECT name, status FROM runs"))
    assert status == {"context_softmax/seed1": "finished", "all_token_softmax/seed1": "interrupted"}

    resumed = posbias.experiment_run(path, progress=False)
    assert resumed["ran"] == ["all_token_softmax/seed1"] and resumed["skipped_finished"] == ["context_softmax/seed1"]
    fresh = posbias.experiment_run(dict(spec, output_dir=str(tmp_path / "fresh")), progress=False)
    assert len(fresh["ran"]) == 2
    a = {r["name"]: r["metrics"] for r in load_results(tmp_path / "exp")["runs"]}
    b = {r["name"]: r["metrics"] for r in load_results(tmp_path / "fresh")["runs"]}
    assert a == b


# ---- aggregation math on hand-made numbers
def test_mean_std_and_paired_ttest_by_hand():
    assert mean_std([1.0, 2.0, 3.0]) == (2.0, 1.0)
    m, s = mean_std([5.0])  # one value: no std (shown without ±)
    assert m == 5.0 and math.isnan(s)
    # d = (1, 2, 3): mean 2, sd 1, t = 2 / (1 / sqrt 3) = 3.4641; two-sided p with 2 d.o.f. = 0.0742
    t = paired_ttest({1: 11.0, 2: 22.0, 3: 33.0}, {1: 10.0, 2: 20.0, 3: 30.0})
    assert t["n"] == 3 and t["diff"] == 2.0
    assert t["t"] == pytest.approx(2 * math.sqrt(3)) and t["p"] == pytest.approx(0.0742, abs=1e-4)
    from scipy import stats
    m, b = np.random.default_rng(0).normal(size=(2, 5))
    ref = stats.ttest_rel(m, b)
    got = paired_ttest(dict(enumerate(m)), dict(enumerate(b)))
    assert got["t"] == pytest.approx(ref.statistic) and got["p"] == pytest.approx(ref.pvalue)
    assert math.isnan(paired_ttest({1: 1.0}, {1: 0.0})["p"])  # one pair: no test
    assert paired_ttest({1: 1.0, 2: 5.0}, {3: 0.0})["n"] == 0  # only common seeds pair


def test_paired_bootstrap():
    rng = np.random.default_rng(1)
    base = rng.uniform(size=400)
    same = paired_bootstrap(base, base, samples=2000)
    assert same["diff"] == 0 and same["p"] == 1.0
    better = paired_bootstrap(base + 0.1 + rng.normal(0, 0.05, 400), base, samples=2000)
    assert better["p"] < 0.001 and better["ci_low"] > 0.05 and better["ci_high"] < 0.15
    noise = paired_bootstrap(base + rng.normal(0, 0.3, 400), base, samples=2000)
    assert noise["p"] > 0.05 and noise["ci_low"] < 0 < noise["ci_high"]


def test_aggregate_on_hand_made_rows():
    runs = []
    for method, f1s in (("base", [50.0, 52.0, 54.0]), ("new", [51.0, 54.0, 57.0])):
        for seed, f1 in zip((1, 2, 3), f1s):
            runs.append({"name": f"{method}/seed{seed}", "method": method, "seed": seed, "dataset": None,
                         "train_size": None, "status": "finished", "wall_seconds": 1.0,
                         "metrics": {"val": {"exact_match": f1 - 10, "f1": f1}}})
    questions = [{"run": f"{m}/seed{s}", "eval_set": "val", "qid": f"q{i}", "exact": 0.0,
                  "f1": (0.6 if m == "new" else 0.5)} for m in ("base", "new") for s in (1, 2, 3) for i in range(50)]
    rows = aggregate({"runs": runs, "questions": questions, "methods": ["base", "new"], "baseline": "base"},
                     bootstrap_samples=500)
    f1 = {r["method"]: r for r in rows if r["metric"] == "F1"}
    assert f1["base"]["mean"] == 52.0 and f1["base"]["std"] == 2.0 and "ttest" not in f1["base"]
    assert f1["new"]["mean"] == 54.0 and f1["new"]["std"] == 3.0
    assert f1["new"]["ttest"]["diff"] == 2.0  # d = (1, 2, 3)
    assert f1["new"]["ttest"]["p"] == pytest.approx(0.0742, abs=1e-4)
    assert f1["new"]["bootstrap"]["diff"] == pytest.approx(10.0)  # per-question F1 0.6 vs 0.5, in points


def test_a_run_is_recorded_with_the_code_it_trained_with(tmp_path, monkeypatch):
    # The checkout moves on while a run trains (a commit, an edit): the store keeps what the run's
    # training recorded at its start, not what the checkout is when the run is recorded.
    import posbias.training
    at_start = {"posbias": posbias.__version__, "git_commit": "a" * 40, "git_dirty": False}
    monkeypatch.setattr(posbias.training, "versions", lambda: dict(at_start))
    spec = smoke_spec(tmp_path, seeds=[1], eval_sets={}, segments=[], methods={"only": {}})
    spec["overrides"] = {**spec["overrides"], "train": {"max_steps": 1, "eval_every": 1, "log_every": 1}}
    posbias.experiment_run(spec, progress=False)
    run = load_results(tmp_path / "exp")["runs"][0]
    assert json.loads(run["versions_json"]) == at_start


def test_the_learned_mixin_gate_is_stored_as_a_curve(tmp_path):
    spec = smoke_spec(tmp_path, seeds=[1], eval_sets={}, segments=[],
                      methods={"mixin": {"train": {"debias": {"method": "learned_mixin"}}}})
    spec["overrides"] = {**spec["overrides"], "train": {"max_steps": 3, "eval_every": 3, "log_every": 1}}
    posbias.experiment_run(spec, progress=False)
    curves = load_results(tmp_path / "exp")["curves"]
    gate = {c["step"]: c["value"] for c in curves if c["kind"] == "debias_gate_mean"}
    low = {c["step"]: c["value"] for c in curves if c["kind"] == "debias_gate_min"}
    assert sorted(gate) == [1, 2, 3] and all(0 < low[k] <= gate[k] for k in gate)


def test_segments_flow_into_store_and_report(tmp_path):
    """A registered segmenter (position buckets plug in the same way) gives per-segment rows,
    their aggregation, a table and a plot."""
    from posbias.experiment import SEGMENTERS, aggregate_segments

    if "_test_context_half" not in SEGMENTERS.names():
        @SEGMENTERS.register("_test_context_half")
        def _half(examples, eval_dir, checkpoint, **options):
            return {e.id: ("short" if len(e.context) < 700 else "long") for e in examples}

    if "_test_gold_half" not in SEGMENTERS.names():
        @SEGMENTERS.register("_test_gold_half")
        def _gold_half(examples, eval_dir, checkpoint, **options):
            return {e.id: ("early" if e.answers[0].start < 300 else "late") for e in examples}
        _gold_half.gold_only = True  # same questions for every method -> paired bootstrap

    spec = smoke_spec(tmp_path, seeds=[1, 2], eval_sets={}, segments=["_test_context_half", "_test_gold_half"])
    posbias.experiment_run(spec, progress=False)
    results = load_results(tmp_path / "exp")
    assert {s["segment"] for s in results["segments"]} == {"short", "long", "early", "late"}
    n = {s["segment"]: s["n"] for s in results["segments"] if s["run"] == "context_softmax/seed1"}
    assert n["short"] + n["long"] == n["early"] + n["late"] == 24  # every question in exactly one segment
    rows = aggregate_segments(results, bootstrap_samples=500)
    assert len(rows) == 2 * 2 * 2 and all(r["n_runs"] == 2 for r in rows)
    method_rows = {r["segment"]: r for r in rows if r["method"] == "all_token_softmax"}
    assert all("ttest" in r for r in method_rows.values())
    # Only the gold-only segmenter pairs questions; its bootstrap equals one computed by hand.
    assert "bootstrap" not in method_rows["short"] and "bootstrap" not in method_rows["long"]
    scores = {(q["run"], q["qid"]): q["f1"] for q in results["questions"] if q["eval_set"] == "val"}
    spec_ds = posbias.qa.readers.read_dataset(load_experiment(spec).runs[0].config.data.eval_file)
    late = sorted(e.id for e in spec_ds.examples[:24] if e.answers[0].start >= 300)
    m = np.mean([[scores[(f"all_token_softmax/seed{s}", q)] for q in late] for s in (1, 2)], axis=0) * 100
    b = np.mean([[scores[(f"context_softmax/seed{s}", q)] for q in late] for s in (1, 2)], axis=0) * 100
    expected = paired_bootstrap(m, b, samples=500)
    assert method_rows["late"]["bootstrap"]["diff"] == pytest.approx(expected["diff"])
    assert method_rows["late"]["bootstrap"]["p"] == pytest.approx(expected["p"])
    posbias.experiment_report(tmp_path / "exp", bootstrap_samples=200)
    md = (tmp_path / "exp" / "report.md").read_text(encoding="utf-8")
    assert "## Segments" in md and "_test_context_half" in md and "_test_gold_half" in md
    assert list((tmp_path / "exp" / "plots").glob("segments_*.png"))


def test_force_redoes_only_the_changed_runs(tmp_path):
    spec = smoke_spec(tmp_path, seeds=[1], eval_sets={})
    posbias.experiment_run(spec, progress=False)
    changed = dict(spec, methods={**spec["methods"], "all_token_softmax": {
        "model": {"head_options": {"softmax_over": "all"}}, "train": {"lr": 0.002}}})
    res = posbias.experiment_run(changed, force=True, progress=False)
    assert res["ran"] == ["all_token_softmax/seed1"] and res["skipped_finished"] == ["context_softmax/seed1"]
    runs = {r["name"]: r for r in load_results(tmp_path / "exp")["runs"]}
    assert json.loads(runs["all_token_softmax/seed1"]["config_json"])["train"]["lr"] == 0.002
    log = (tmp_path / "exp" / "runs" / "all_token_softmax" / "seed1" / "train_log.jsonl").read_text(encoding="utf-8")
    assert [json.loads(x)["step"] for x in log.splitlines()] == [1, 2, 3, 4, 5, 6]  # redone from scratch


def test_loss_smoothing_keeps_the_ends():
    """The learning-curve smoothing must not pull the first and last points towards 0."""
    from posbias.analysis.report import moving_average

    np.testing.assert_allclose(moving_average(np.full(40, 4.0), 3), 4.0)
    np.testing.assert_allclose(moving_average(np.arange(6.0), 3), [0.5, 1, 2, 3, 4, 4.5])


def test_tagging_experiment_runs_and_reports(tmp_path):
    """The same grid -> store -> report path for token classification: F1/precision/recall rows,
    a sentence-level bootstrap on the corpus F1, per-sentence ratios in the store, val_f1 curves."""
    spec = yaml.safe_load((PRESETS / "experiments" / "smoke_tagging.yaml").read_text(encoding="utf-8"))
    spec["output_dir"] = str(tmp_path / "exp")
    res = posbias.experiment_run(spec, progress=False)
    assert len(res["ran"]) == 4
    results = load_results(tmp_path / "exp")
    assert all(r["status"] == "finished" and "f1" in r["metrics"]["test"] for r in results["runs"])
    n = {(q["run"], q["eval_set"]) for q in results["questions"]}
    assert len(n) == 8  # 4 runs x (val, test)
    test_rows = [q for q in results["questions"] if q["eval_set"] == "test" and q["run"] == "first_subtoken/seed1"]
    assert len(test_rows) == 150 and all(0 <= q["exact"] <= q["f1"] for q in test_rows)  # 2 TP <= pred + gold
    rows = aggregate(results, bootstrap_samples=200)
    # the authors' sub-token F1 (seqeval's lenient mode) beside the strict word-level ones
    assert {r["metric"] for r in rows} == {"F1", "precision", "recall", "sub-token F1"}
    f1 = [r for r in rows if r["metric"] == "F1" and r["method"] == "all_subtokens"]
    assert f1 and all("ttest" in r and "bootstrap" in r for r in f1)
    assert not any("bootstrap" in r for r in rows if r["metric"] != "F1")
    run = next(r for r in results["runs"] if r["name"] == "first_subtoken/seed1")
    kinds = {c["kind"] for c in results["curves"]}
    assert kinds == {"loss", "val_f1", "position_updates"} and run["metrics"]["test"]["sentences"] == 150
    out = posbias.experiment_report(tmp_path / "exp", bootstrap_samples=200)
    md = (tmp_path / "exp" / "report.md").read_text(encoding="utf-8")
    assert "| test | F1 | all_subtokens |" in md and "| test | precision | first_subtoken |" in md
    assert "| test | sub-token F1 | first_subtoken |" in md
    assert any(p.endswith("comparison_f1.png") for p in out["plots"])


def test_position_eval_experiment_runs_and_reports(tmp_path):
    """D*-trained baseline vs RPP vs CP with the duplicated-test evaluation as an eval of every run:
    its F1(α) rows (t-test over seeds, no per-sentence bootstrap) and its report figure."""
    spec = yaml.safe_load((PRESETS / "experiments" / "smoke_position_bias.yaml").read_text(encoding="utf-8"))
    spec["output_dir"] = str(tmp_path / "exp")
    spec["seeds"] = [1, 2]
    res = posbias.experiment_run(spec, progress=False)
    assert len(res["ran"]) == 6
    results = load_results(tmp_path / "exp")
    run = next(r for r in results["runs"] if r["name"] == "rpp/seed1")
    m = run["metrics"]["test D*(k)"]
    assert m["report"][0] == ["accuracy", "accuracy"] and len(m["accuracy_by_alpha"]) == 4
    assert (tmp_path / "exp" / "runs" / "rpp" / "seed1" / "position_eval" / "test" / "diagnosis.json").is_file()
    info = json.loads((tmp_path / "exp" / "runs" / "rpp" / "seed1" / "run_info.json").read_text(encoding="utf-8"))
    assert info["train_length_subset"]["quantiles"] == [0.25, 0.75]
    rows = aggregate(results, bootstrap_samples=100)
    pos = [r for r in rows if r["eval_set"] == "test D*(k)"]
    assert {r["metric"] for r in pos} == {"accuracy", "accuracy(2)", "accuracy(4)", "sub-token F1",
                                          "sub-token F1(2)", "sub-token F1(4)", "shift accuracy(4)",
                                          "consistency(4)"}
    assert all("ttest" in r and "bootstrap" not in r for r in pos if r["method"] != "baseline")
    out = posbias.experiment_report(tmp_path / "exp", bootstrap_samples=100)
    assert any(p.endswith("position_eval_test.png") for p in out["plots"])
    md = (tmp_path / "exp" / "report.md").read_text(encoding="utf-8")
    assert "| test D\\*(k) | accuracy(4) | cp |" in md
    # every run's per-copy, per-sentence counts are in the store, and rebuild its stored accuracy(α)
    from posbias.tagging.duplicated import load_copy_scores

    assert {(c["run"], c["eval_set"]) for c in results["copies"]} == {(r["name"], "test D*(k)") for r in results["runs"]}
    copies = load_copy_scores(next(c["data"] for c in results["copies"] if c["run"] == "rpp/seed1"), "rpp/seed1")
    part = copies["modes"]["duplicate"]
    cells = [tuple(c) for c in part["cells"]]
    assert len(cells) == 4 * 5 // 2 and part["accuracy"].shape[1] == len(copies["body_tokens"])
    for alpha in range(1, 5):  # accuracy(α): the mean over k >= α of each cell's corpus accuracy
        per_k = [part["accuracy"][cells.index((k, alpha))].sum(0) for k in range(alpha, 5)]
        assert np.isclose(np.mean([100 * a / b for a, b in per_k]), m["accuracy_by_alpha"][alpha - 1])
    # the report splits each method's accuracy(α) by the ids its runs trained
    assert "## F1(α) on trained and untrained position ids" in md
    split = json.loads((tmp_path / "exp" / "report.json").read_text(encoding="utf-8"))["sections"][
        "F1(α) on trained and untrained position ids"]
    assert {r["method"] for r in split} == {"rpp", "cp"} and {r["alpha"] for r in split} == {1, 2, 3, 4}
    assert all(0 <= r["trained_share"] <= 100 and r["seeds"] == 2 for r in split)


@pytest.mark.parametrize("change, message", [
    ({"position_eval": {"dev": {}}}, "position_eval.dev is not one of the eval_sets"),
    ({"position_eval": {"test": {"k": 3}}}, "position_eval.test.k is not an option"),
])
def test_bad_position_eval_specs_are_refused(tmp_path, change, message):
    spec = yaml.safe_load((PRESETS / "experiments" / "smoke_position_bias.yaml").read_text(encoding="utf-8"))
    spec.update(change, output_dir=str(tmp_path / "exp"))
    with pytest.raises(ConfigError, match=message):
        load_experiment(spec)


def test_position_eval_is_refused_for_qa(tmp_path):
    spec = yaml.safe_load((PRESETS / "experiments" / "smoke.yaml").read_text(encoding="utf-8"))
    spec.update(eval_sets={"test": "demo:dev"}, position_eval={"test": {}}, output_dir=str(tmp_path / "exp"))
    with pytest.raises(ConfigError, match="not available for task 'qa'"):
        load_experiment(spec)


def test_exclude_removes_cells_of_the_grid(tmp_path):
    """`exclude` drops grid cells (e.g. extra methods run at one dataset only); a pattern that matches
    nothing, or one that empties the grid, is a spec error."""
    spec = smoke_spec(tmp_path, datasets={"a": {}, "b": {}})
    first, *rest = spec["methods"]
    spec["exclude"] = [f"b/{m}/*" for m in rest]
    names = [r.name for r in load_experiment(spec).runs]
    seeds = spec["seeds"]
    assert names == ([f"a/{m}/seed{k}" for m in spec["methods"] for k in seeds] + [f"b/{first}/seed{k}" for k in seeds])
    with pytest.raises(ConfigError, match="exclude pattern 'c/\\*' matches none"):
        load_experiment({**spec, "exclude": ["c/*"]})
    with pytest.raises(ConfigError, match="removes every run"):
        load_experiment({**spec, "exclude": ["*"]})
    with pytest.raises(ConfigError, match="exclude must be a list"):
        load_experiment({**spec, "exclude": "b/*"})


def test_copy_archives_restores_and_joins_results(smoke, tmp_path):
    """`experiment copy`: results without checkpoints; a report from the archive equals the original's;
    restored into a fresh folder, `experiment run` skips every run; conflicting configs are refused."""
    exp_dir, spec, _ = smoke
    archive = tmp_path / "archive"
    res = posbias.experiment_copy(exp_dir, archive)
    assert sorted(res["copied"]) == sorted(f"{m}/seed{s}" for m in spec["methods"] for s in spec["seeds"])
    assert {p.name for p in archive.iterdir()} == {".posbias-output", "experiment.sqlite", "experiment.yaml"}
    original, copied = load_results(exp_dir), load_results(archive)
    for key in ("runs", "segments", "curves", "questions"):
        rows = lambda r: sorted(r[key], key=lambda x: json.dumps(x, sort_keys=True))  # noqa: E731
        assert rows(copied) == rows(original) and len(rows(copied)) > 0
    assert aggregate(copied, bootstrap_samples=200) == aggregate(original, bootstrap_samples=200)
    # The positions each run trained travel with the archive: the plot needs no run folder.
    updates = [c for c in copied["curves"] if c["kind"] == "position_updates"]
    assert {c["run"] for c in updates} == set(res["copied"])
    assert all(c["value"] == 1.0 for c in updates if c["step"] == 0)  # [CLS] is in every step
    from posbias.analysis.report import plot_updates

    gone = dict(copied, runs=[dict(r, output_dir=str(tmp_path / "gone")) for r in copied["runs"]])
    assert plot_updates(gone, tmp_path / "updates.png").is_file()
    # A store recorded before position updates were kept gets them from the run folders on copy.
    older = tmp_path / "older"
    posbias.experiment_copy(exp_dir, older)
    with sqlite3.connect(older / "experiment.sqlite") as conn:
        conn.execute("DELETE FROM curves WHERE kind = 'position_updates'")
    posbias.experiment_copy(older, tmp_path / "older_archive")
    def curves(r):
        return sorted(json.dumps(c, sort_keys=True) for c in r["curves"])
    assert curves(load_results(tmp_path / "older_archive")) == curves(copied)
    # Restore into a fresh working folder: every run counts as finished there.
    fresh = dict(spec, output_dir=str(tmp_path / "fresh"))
    posbias.experiment_copy(archive, tmp_path / "fresh")
    assert posbias.experiment_run(fresh, progress=False)["ran"] == []
    # Join: a second store holding one run with another config is refused, then replaced with --force.
    other = tmp_path / "other"
    posbias.experiment_copy(archive, other)
    with sqlite3.connect(other / "experiment.sqlite") as conn:
        conn.execute("UPDATE runs SET config_hash = 'x' WHERE name = 'context_softmax/seed1'")
    with pytest.raises(ConfigError, match="context_softmax/seed1 is finished in both"):
        posbias.experiment_copy(other, archive)
    assert load_results(archive)["runs"] == original["runs"]  # untouched by the refused copy
    assert posbias.experiment_copy(other, archive, force=True)["replaced"] == ["context_softmax/seed1"]
    # The grid grew (a method added to the spec): the source's spec replaces the archive's.
    grown = yaml.safe_load((exp_dir / "experiment.yaml").read_text(encoding="utf-8"))
    grown["methods"]["added"] = {}
    (other / "experiment.yaml").write_text(yaml.safe_dump(grown, sort_keys=False))
    assert posbias.experiment_copy(other, archive, force=True)["spec"] == "replaced"
    assert "added" in load_results(archive)["spec"]["methods"]
    assert posbias.experiment_copy(other, archive, force=True)["spec"] is None  # equal: untouched
    with pytest.raises(ConfigError, match="holds no experiment.sqlite"):
        posbias.experiment_copy(tmp_path / "nothing", archive)


def test_only_runs_the_matching_runs(tmp_path):
    """`--only` patterns pick runs of the grid (e.g. one lane of a parallel run); the rest are untouched."""
    spec = smoke_spec(tmp_path)
    plan = posbias.experiment_run(spec, dry_run=True, only=["*/seed2"])
    assert [r["name"] for r in plan["runs"]] == [f"{m}/seed2" for m in spec["methods"]]
    with pytest.raises(ConfigError, match="--only nope/\\* matches none of the runs"):
        posbias.experiment_run(spec, dry_run=True, only=["nope/*"])
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    r = cli_here("experiment", "run", str(spec_file), "--dry-run", "--only", f"{next(iter(spec['methods']))}/*")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.strip().splitlines()) == 2


_REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("path", sorted([*_REPO.glob("benchmarks/*.yaml"), *_REPO.glob("reproductions/*/*.yaml")]),
                         ids=lambda p: p.stem)
def test_benchmark_specs_expand(path):
    """The specs under benchmarks/ and reproductions/<paper>/ are valid (their data files are built by
    the scripts beside them)."""
    spec = yaml.safe_load(path.read_text(encoding="utf-8"))
    if "methods" not in spec:
        pytest.skip("not an experiment spec")
    exp = load_experiment(path)
    assert len(exp.runs) >= len(exp.methods)


def test_one_run_shows_no_spread():
    """A single seed has no standard deviation: the table says `(1 run)` rather than `± 0.00`."""
    from posbias.analysis.report import comparison_table

    row = {"dataset": None, "train_size": None, "eval_set": "test", "metric": "F1", "method": "m",
           "mean": 67.5, "std": 0.0, "n_runs": 1, "wall_seconds": 60.0}
    _, body = comparison_table([row, dict(row, std=0.5, n_runs=3)])
    assert body[0][4] == "67.50 (1 run)" and body[1][4] == "67.50 ± 0.50"


def test_delta_over_fewer_seeds_than_the_means_is_marked():
    """A method run on 3 seeds against a baseline run on 5: the Δ (paired over the 3 common seeds)
    is not the difference of the two means shown, so the table says over how many seeds it is."""
    from posbias.analysis.report import comparison_table

    row = {"dataset": None, "train_size": None, "eval_set": "val", "metric": "F1", "method": "m",
           "mean": 40.0, "std": 1.0, "n_runs": 3, "wall_seconds": 60.0,
           "ttest": {"n": 3, "diff": -1.41, "t": -0.8, "p": 0.49}}
    _, body = comparison_table([dict(row, baseline_n_runs=5), dict(row, baseline_n_runs=3),
                                dict(row, n_runs=5, baseline_n_runs=5, ttest=dict(row["ttest"], n=5))])
    assert body[0][5] == "-1.41 (3 paired seeds)"
    assert body[1][5] == "-1.41" and body[2][5] == "-1.41"


def test_seed_t_interval_by_hand():
    """The t-interval over seeds of a Δ: d = (1, 2, 3), mean 2, sd 1, t(0.975, 2) = 4.3027 -> 2 ± 2.4841.
    The first-sentence stress test's per-seed gap closed (0.676, 0.705, 0.771) gives about [0.60, 0.84]."""
    from posbias.analysis.stats import t_interval

    t = paired_ttest({1: 11.0, 2: 22.0, 3: 33.0}, {1: 10.0, 2: 20.0, 3: 30.0})
    assert t["ci_low"] == pytest.approx(2 - 4.302653 / math.sqrt(3), abs=1e-5)
    assert t["ci_high"] == pytest.approx(2 + 4.302653 / math.sqrt(3), abs=1e-5)
    ci = t_interval([0.676, 0.705, 0.771])
    assert (round(ci["ci_low"], 2), round(ci["ci_high"], 2)) == (0.60, 0.84)
    assert math.isnan(paired_ttest({1: 1.0}, {1: 0.0})["ci_low"])  # one pair: no interval
    same = paired_ttest({1: 2.0, 2: 3.0}, {1: 1.0, 2: 2.0})  # every difference 1: the interval is 1
    assert (same["ci_low"], same["ci_high"]) == (1.0, 1.0)


def test_holm_by_hand():
    """Holm (1979): sorted p (0.005, 0.01, 0.03, 0.04) of m = 4 -> 4·0.005, 3·0.01, 2·0.03, then the
    running maximum (1·0.04 < 0.06); NaN stays NaN and is not counted in m."""
    from posbias.analysis.stats import holm

    got = holm([0.01, 0.04, 0.03, float("nan"), 0.005])
    assert got[:3] == pytest.approx([0.03, 0.06, 0.06]) and got[4] == pytest.approx(0.02) and math.isnan(got[3])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert holm([0.036]) == pytest.approx([0.036])  # one test: nothing to correct


def test_a_delta_is_bold_only_when_it_survives_holm():
    """Two seed-level tests at p 0.036 and 0.018 among 20 comparisons (the issue's two "significant
    reproductions"): neither survives Holm, so neither is bold; the table shows both p-values and the
    t-interval over seeds."""
    from posbias.analysis.report import comparison_table
    from posbias.experiment.aggregation import adjust_family

    def row(method, p, diff=1.1):
        return {"dataset": None, "train_size": None, "eval_set": "val", "metric": "F1", "method": method,
                "mean": 40.0, "std": 1.0, "n_runs": 3, "wall_seconds": 60.0, "baseline_n_runs": 3,
                "ttest": {"n": 3, "diff": diff, "t": 3.0, "p": p, "ci_low": 0.2, "ci_high": 2.0},
                "bootstrap": {"p": 0.001, "ci_low": 0.5, "ci_high": 1.5}}

    rows = adjust_family([row("cp", 0.036), row("map_e", 0.018)] + [row(f"m{i}", 0.5) for i in range(18)])
    head, body = comparison_table(rows)
    assert rows[0]["ttest"]["family"] == 20 and rows[1]["ttest"]["p_holm"] == pytest.approx(0.36)
    assert body[0][5] == "+1.10" and body[1][5] == "+1.10"  # not bold
    assert body[1][head.index("t-test p (seeds)")] == "0.018 (Holm 0.360)"
    assert body[0][head.index("95% CI (t, seeds)")] == "[0.20, 2.00]"
    alone = adjust_family([row("cp", 0.036)])  # one comparison: the p-value is its own family
    assert comparison_table(alone)[1][0][5] == "**+1.10**"
    assert comparison_table(alone)[1][0][head.index("t-test p (seeds)")] == "0.036"


def test_bootstraps_with_no_resamples_give_the_difference_alone():
    """`bootstrap_samples=0` (a quick report) used to fail inside numpy's percentile."""
    from posbias.analysis.stats import paired_bootstrap_ratio

    b = paired_bootstrap(np.array([1.0, 2.0]), np.array([0.0, 0.0]), samples=0)
    assert b["diff"] == 1.5 and math.isnan(b["p"]) and math.isnan(b["ci_low"])
    r = paired_bootstrap_ratio(np.array([[1, 2], [1, 2]]), np.array([[0, 2], [1, 2]]), samples=0)
    assert r["diff"] == pytest.approx(25.0) and math.isnan(r["p"])


def test_a_method_scores_models_trained_elsewhere(tmp_path):
    """`checkpoint:` in a method: its runs train nothing and score the given model (here: the
    baseline's own best/, then the same weights exported as a Hugging Face folder, as a Trainer
    script leaves them) on the validation set, the eval sets and F1(α), and compare with the
    trained methods seed by seed: the same weights give Δ 0 everywhere."""
    spec = yaml.safe_load((PRESETS / "experiments" / "smoke_position_bias.yaml").read_text(encoding="utf-8"))
    spec.update(output_dir=str(tmp_path / "exp"), seeds=[1, 2],
                methods={"baseline": {}, "same": {"checkpoint": "{output_dir}/runs/baseline/seed{seed}/best"}})
    res = posbias.experiment_run(spec, progress=False)
    assert sorted(res["ran"]) == ["baseline/seed1", "baseline/seed2", "same/seed1", "same/seed2"]
    for k in (1, 2):  # every seed's run scores its own checkpoint (not only the first seed's)
        run = tmp_path / "exp" / "runs" / "same" / f"seed{k}"
        info = json.loads((run / "run_info.json").read_text(encoding="utf-8"))
        assert info["checkpoint"] == str(tmp_path / "exp" / "runs" / "baseline" / f"seed{k}" / "best")
        assert not (run / "best").exists() and not (run / "checkpoints").exists()  # nothing trained, nothing copied
    for k in (1, 2):
        posbias.export(tmp_path / "exp" / "runs" / "baseline" / f"seed{k}" / "best", tmp_path / f"hf{k}")
    spec["methods"]["hf"] = {"checkpoint": str(tmp_path / "hf{seed}")}
    res = posbias.experiment_run(spec, progress=False)
    assert sorted(res["ran"]) == ["hf/seed1", "hf/seed2"]  # the recorded runs are left as they are
    rows = aggregate(load_results(tmp_path / "exp"), bootstrap_samples=100)
    seen = set()
    for r in rows:
        if r["method"] in ("same", "hf") and r["metric"] in ("accuracy", "accuracy(4)", "sub-token F1(4)"):
            assert r["ttest"]["diff"] == pytest.approx(0.0, abs=1e-9), r
            seen.add((r["method"], r["eval_set"], r["metric"]))
    assert {("same", "val", "accuracy"), ("hf", "val", "accuracy"), ("hf", "test", "accuracy"),
            ("hf", "test D*(k)", "accuracy(4)"), ("hf", "test D*(k)", "sub-token F1(4)")} <= seen

    spec["methods"]["hf"] = {"checkpoint": str(tmp_path / "nope{seed}")}
    spec["output_dir"] = str(tmp_path / "exp2")
    with pytest.raises(ConfigError, match=r"run hf/seed1: checkpoint: .*nope1"):
        posbias.experiment_run(spec, progress=False)
    spec["methods"]["hf"] = {"checkpoint": "x/{sed}"}
    with pytest.raises(ConfigError, match=r"methods.hf.checkpoint 'x/\{sed\}': \{sed\} is not one of"):
        posbias.experiment_run(spec, progress=False)



def test_a_checkpoint_method_is_scored_as_the_spec_says_it_trained(tmp_path):
    """A model trained elsewhere with every sub-token labelled (the authors' `label_all_tokens`, an HF
    script's `--label-all-tokens`): the spec's `data.label_subtokens: copy` reaches its scoring, so the
    authors' sub-token F1 reads each sub-token's own prediction, as for the trained runs (the export
    of the baseline's weights: Δ 0); a method's own `data:` says otherwise for its model."""
    spec = yaml.safe_load((PRESETS / "experiments" / "smoke_position_bias.yaml").read_text(encoding="utf-8"))
    spec["overrides"]["data"]["label_subtokens"] = "copy"
    spec.update(output_dir=str(tmp_path / "exp"), seeds=[1], methods={"baseline": {}})
    posbias.experiment_run(spec, progress=False)
    posbias.export(tmp_path / "exp" / "runs" / "baseline" / "seed1" / "best", tmp_path / "hf1")
    spec["methods"].update(hf={"checkpoint": str(tmp_path / "hf{seed}")},
                           hf_first={"checkpoint": str(tmp_path / "hf{seed}"), "data": {"label_subtokens": "first"}})
    posbias.experiment_run(spec, progress=False)

    def reads(method):
        d = json.loads((tmp_path / "exp" / "runs" / method / "seed1" / "position_eval" / "test" / "diagnosis.json")
                       .read_text(encoding="utf-8"))
        return d["subtoken_predictions"]

    assert [reads(m) for m in ("baseline", "hf", "hf_first")] == ["own", "own", "word"]
    rows = aggregate(load_results(tmp_path / "exp"), bootstrap_samples=0)
    hf = [r for r in rows if r["method"] == "hf" and r["metric"] == "sub-token F1(4)"]
    assert hf and all(r["ttest"]["diff"] == pytest.approx(0.0, abs=1e-9) for r in hf)

def test_a_checkpoint_method_decodes_another_way(tmp_path):
    """`decode:` beside `checkpoint:`: the MaP_E runs' own checkpoints scored as their forward
    direction alone (`ensemble: false`) score exactly as the same training decoded that way from the
    start (MaP's decoding options change no weight); anything but a decode-time option is refused."""
    spec = yaml.safe_load(SMOKE.read_text(encoding="utf-8"))
    both = {"head": "matrix", "head_options": {"direction": "both", "k": 4, "inference_k": 4}}
    spec["overrides"]["train"].update(eval_every=6)  # one evaluation, at the end: best/ is the last step for both
    spec.update(output_dir=str(tmp_path / "exp"), seeds=[1], segments=[],
                methods={"map_e": {"model": both},
                         "map_e_forward": {"model": {**both, "head_options": {**both["head_options"], "ensemble": False}}},
                         "forward_only": {"checkpoint": "{output_dir}/runs/map_e/seed{seed}/best",
                                          "decode": {"ensemble": False}}})
    res = posbias.experiment_run(spec, progress=False)
    assert sorted(res["ran"]) == ["forward_only/seed1", "map_e/seed1", "map_e_forward/seed1"]
    assert [(r.checkpoint is not None, r.decode) for r in load_experiment(dict(spec, seeds=[1, 2, 3])).runs
            if r.method == "forward_only"] == [(True, {"ensemble": False})] * 3
    run = tmp_path / "exp" / "runs" / "forward_only" / "seed1"
    assert json.loads((run / "run_info.json").read_text(encoding="utf-8"))["decode"] == {"ensemble": False}
    scored = yaml.safe_load((run / "evals" / "test" / "config.yaml").read_text(encoding="utf-8"))
    assert scored["model"]["head_options"]["ensemble"] is False
    for name in ("eval", "evals/test"):
        fwd = json.loads((run / name / "predictions.json").read_text(encoding="utf-8"))
        same = json.loads((tmp_path / "exp" / "runs" / "map_e_forward" / "seed1" / name / "predictions.json")
                          .read_text(encoding="utf-8"))
        assert fwd == same and fwd
    rows = aggregate(load_results(tmp_path / "exp", baseline="map_e_forward"), bootstrap_samples=0)
    f1 = [r for r in rows if r["method"] == "forward_only" and r["metric"] == "F1"]
    assert {r["eval_set"] for r in f1} == {"val", "test"}
    assert all(r["ttest"]["diff"] == pytest.approx(0.0, abs=1e-9) for r in f1)

    exp = load_experiment(spec)
    plain = dict(spec, methods={"map_e": {"model": both}, "forward_only": {"checkpoint": "x{seed}"}})
    assert load_experiment(plain).runs[1].config_hash != exp.runs[2].config_hash  # decode is part of the run
    for methods, message in (
            ({"b": {}, "m": {"decode": {"ensemble": False}}}, r"methods.m.decode needs checkpoint:"),
            ({"b": {}, "m": {"checkpoint": "x", "decode": ["ensemble"]}}, r"methods.m.decode must be a mapping"),
            ({"b": {}, "m": {"checkpoint": "x", "decode": {"ensemble": [1]}}}, r"decode.ensemble must be a plain value")):
        with pytest.raises(ConfigError, match=message):
            load_experiment(dict(spec, methods=methods))
    best = str(tmp_path / "exp" / "runs" / "map_e" / "seed1" / "best")
    for override, message in (("model.head_options.k=5",
                               r"head_options.k cannot be overridden .*\['ensemble', 'inference', 'inference_k'\]"),
                              ("model.head_options.inference_k=1", r"inference_k must be an integer >= 2"),
                              ("model.head_options.direction=forward", r"head_options.direction cannot be"),
                              ("model.encoder.num_hidden_layers=1", r"model.\* cannot be overridden")):
        with pytest.raises(ConfigError, match=message):
            posbias.evaluate(best, "demo:dev", overrides=[override, "data.max_eval_examples=4"], progress=False)
