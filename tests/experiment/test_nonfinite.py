"""A store whose run holds NaN or inf in its metrics is refused in one line naming the store and the
run, before any mean, t-test or report is made of it (`aggregation.load_results`)."""
import json
from contextlib import closing

import pytest

from posbias.errors import ConfigError
from posbias.experiment import load_results
from posbias.experiment.store import connect

from helpers import cli_here

GOOD = {"val": {"exact_match": 50.0, "f1": 60.0, "total": 4}}


def make_store(exp_dir, bad_metrics_json: str):
    """A store of two finished runs of one method; the second's metrics_json is `bad_metrics_json`."""
    db = exp_dir / "experiment.sqlite"
    with closing(connect(db)) as conn, conn:
        for seed, metrics in ((1, json.dumps(GOOD)), (2, bad_metrics_json)):
            conn.execute("INSERT INTO runs (name, method, seed, dataset, train_size, config_json, output_dir, status, "
                         "metrics_json) VALUES (?, 'base', ?, 'squad', 0, '{}', ?, 'finished', ?)",
                         (f"base/seed{seed}", seed, str(exp_dir / "runs" / f"seed{seed}"), metrics))
    return db


@pytest.mark.parametrize("text, shown", [
    (json.dumps({"val": {"exact_match": 50.0, "f1": float("nan"), "total": 4}}), "nan at val.f1"),
    ('{"val": {"exact_match": Infinity, "f1": 1.0}}', "inf at val.exact_match"),
    ('{"val": {"by_answer_length": {"01": {"f1": -1e999}}}}', "-inf at val.by_answer_length.01.f1"),
], ids=["nan", "Infinity", "overflowing literal"])
def test_a_run_with_non_finite_metrics_is_refused_naming_store_and_run(tmp_path, text, shown):
    db = make_store(tmp_path, text)
    with pytest.raises(ConfigError, match=f"^{db}: run 'base/seed2': its metrics_json holds {shown}; a metric is "
                                          "a finite number"):
        load_results(tmp_path)


def test_the_report_command_refuses_it_in_one_line_with_exit_2(tmp_path):
    db = make_store(tmp_path, json.dumps({"val": {**GOOD["val"], "f1": float("nan")}}))
    out = tmp_path / "report"
    r = cli_here("experiment", "report", str(tmp_path), "--output-dir", str(out))
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr == f"posbias: error: {db}: run 'base/seed2': its metrics_json holds nan at val.f1; a metric " \
                       "is a finite number, and a mean or t-test over this one would print it as a finding\n"
    assert not out.exists()  # refused before the output folder is made


def test_finite_metrics_still_load(tmp_path):
    make_store(tmp_path, json.dumps({"val": {"exact_match": 40.0, "f1": 55.5, "total": 4}}))
    runs = load_results(tmp_path)["runs"]
    assert [r["metrics"]["val"]["f1"] for r in runs] == [60.0, 55.5]


@pytest.mark.parametrize("config_json, why", [("{not json", "not valid JSON"), ("[1, 2]", "not a JSON object")])
def test_a_run_with_a_damaged_config_json_is_refused_naming_store_and_run(tmp_path, config_json, why):
    db = make_store(tmp_path, json.dumps(GOOD))
    with closing(connect(db)) as conn, conn:
        conn.execute("UPDATE runs SET config_json = ? WHERE name = 'base/seed2'", (config_json,))
    with pytest.raises(ConfigError, match=f"^{db}: run 'base/seed2': its config_json is {why}"):
        load_results(tmp_path)


def test_a_store_with_a_column_posbias_cannot_fill_is_refused_before_any_run_trains(tmp_path):
    """An extra NOT NULL column without a default in `runs`: every insert of a run would fail after its
    training; the store is refused, named, before anything trains."""
    import sqlite3

    import posbias
    from tests.experiment.test_store import tiny_spec

    exp = tmp_path / "exp"
    exp.mkdir()
    with closing(connect(exp / "experiment.sqlite")):  # a store as posbias creates it
        pass
    with closing(sqlite3.connect(exp / "experiment.sqlite")) as conn:
        conn.executescript("CREATE TABLE runs2 AS SELECT * FROM runs; DROP TABLE runs; "
                           "CREATE TABLE runs (name TEXT PRIMARY KEY, method TEXT, seed INTEGER, dataset TEXT, "
                           "train_size INTEGER, config_hash TEXT, config_json TEXT, output_dir TEXT, status TEXT, "
                           "started TEXT, finished TEXT, wall_seconds REAL, train_seconds REAL, metrics_json TEXT, "
                           "versions_json TEXT, owner TEXT NOT NULL); DROP TABLE runs2;")
    spec = tiny_spec(tmp_path)
    with pytest.raises(ConfigError, match=f"{exp / 'experiment.sqlite'} is not a posbias experiment store: its runs "
                                          "table has a column 'owner'"):
        posbias.experiment_run(spec, progress=False)
    assert not (exp / "runs").exists()  # nothing trained
