"""The experiment store shared by several processes: runs claimed by OS locks, taken over when their
holder dies, recorded once; a damaged store or run log gives a named error or is repaired."""
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading

import pytest
import yaml

import posbias
from posbias.config import PRESETS
from posbias.errors import ConfigError
from posbias.experiment import copy_results, load_results

from helpers import CPU_ONLY_ENV, cli_here

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="the tests hold locks with POSIX processes")

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **CPU_ONLY_ENV}


def tiny_spec(tmp_path, **changes) -> dict:
    """The smoke experiment cut to seconds: 3 steps, no eval sets or segments (2 methods x `seeds`)."""
    spec = yaml.safe_load((PRESETS / "experiments" / "smoke.yaml").read_text(encoding="utf-8"))
    spec.update(overrides={"train": {"max_steps": 3, "eval_every": 3, "log_every": 1},
                           "data": {"max_train_examples": 24, "max_eval_examples": 16, "max_seq_len": 128,
                                    "stride": 48}},
                eval_sets={}, segments=[], output_dir=str(tmp_path / "exp"), **changes)
    return spec


def store(exp_dir) -> dict:
    """Everything recorded per run, comparable across folders (no timings, paths or versions)."""
    with sqlite3.connect(exp_dir / "experiment.sqlite") as conn:
        runs = conn.execute("SELECT name, status, config_hash, metrics_json FROM runs ORDER BY name").fetchall()
        rows = {t: sorted(conn.execute(f"SELECT * FROM {t}").fetchall()) for t in ("question_scores", "curves")}
    return {"runs": runs, **rows}


def logged_steps(exp_dir, run: str) -> list[int]:
    log = (exp_dir / "runs" / run / "train_log.jsonl").read_text(encoding="utf-8")
    return [json.loads(line)["step"] for line in log.splitlines()]


@pytest.mark.slow
def test_concurrent_processes_split_the_grid_like_one_process(tmp_path):
    """Three `posbias experiment run` processes on one folder, started together (forked from one that
    imported torch and posbias, helpers.ranks): each run trained by exactly one of them, every process
    returns when the whole grid is done, and the store equals a single process's."""
    from helpers.ranks import cli_command, run_ranks

    spec = tiny_spec(tmp_path)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    done = run_ranks(cli_command, 3, ["experiment", "run", path], timeout=300, group=False)
    outs = [(d["stdout"], d["stderr"]) for d in done]
    for d in done:
        assert d["code"] == 0, d["stderr"][-3000:]
    ran = [int(re.search(r"ran (\d+), skipped (\d+) finished(?:, (\d+) finished by other processes)?", out)[1])
           for out, _ in outs]
    assert sum(ran) == 4, [out for out, _ in outs]  # no run trained twice, none left out
    for out, _ in outs:  # each process saw every run finished before it returned
        counts = re.search(r"ran (\d+), skipped (\d+) finished(?:, (\d+) finished by other processes)?", out)
        assert sum(int(c or 0) for c in counts.groups()) == 4, out

    exp_dir = tmp_path / "exp"
    names = [f"{m}/seed{s}" for m in spec["methods"] for s in spec["seeds"]]
    for name in names:
        assert logged_steps(exp_dir, name) == [1, 2, 3]
    shared = store(exp_dir)
    assert sorted(r[0] for r in shared["runs"]) == sorted(names) and {r[1] for r in shared["runs"]} == {"finished"}

    single = posbias.experiment_run(spec, output_dir=str(tmp_path / "single"), progress=False)
    assert len(single["ran"]) == 4
    alone = store(tmp_path / "single")
    assert shared["runs"] == alone["runs"] and shared["question_scores"] == alone["question_scores"]
    assert [c[:3] for c in shared["curves"]] == [c[:3] for c in alone["curves"]]
    assert [c[3] for c in shared["curves"]] == pytest.approx([c[3] for c in alone["curves"]], rel=1e-5)


def hold(exp_dir, run: str) -> subprocess.Popen:
    """Another process holding `run`'s lock (as a process training it would) until it is killed."""
    code = ("import sys, time; from posbias.experiment import claim\n"
            "fd = claim(sys.argv[1], sys.argv[2]); print('held' if fd is not None else 'busy', flush=True)\n"
            "time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(exp_dir), run], env=ENV, text=True,
                            stdout=subprocess.PIPE)
    line = proc.stdout.readline().strip()
    if line != "held":
        proc.kill()
        proc.wait()
        raise AssertionError(f"the holder process could not take the lock of {run}: {line!r}")
    return proc


def test_a_held_run_is_left_to_its_holder_and_taken_over_when_it_dies(tmp_path, capsys):
    spec = tiny_spec(tmp_path, seeds=[1])
    exp_dir = tmp_path / "exp"
    holder = hold(exp_dir, "context_softmax/seed1")
    try:
        res = posbias.experiment_run(spec, progress=False, wait=False)
        assert res["ran"] == ["all_token_softmax/seed1"] and res["left_to_others"] == ["context_softmax/seed1"]
        assert f"context_softmax/seed1: held by pid {holder.pid} on " in capsys.readouterr().err
        with sqlite3.connect(exp_dir / "experiment.sqlite") as conn:
            assert conn.execute("SELECT name FROM runs").fetchall() == [("all_token_softmax/seed1",)]

        # --force redoes a changed run while another process holds a different one.
        changed = dict(spec, methods={**spec["methods"], "all_token_softmax": {
            "model": {"head_options": {"softmax_over": "all"}}, "train": {"lr": 0.002}}})
        with pytest.raises(ConfigError, match="all_token_softmax/seed1 changed.*--force"):
            posbias.experiment_run(changed, progress=False, wait=False)
        res = posbias.experiment_run(changed, force=True, progress=False, wait=False)
        assert res["ran"] == ["all_token_softmax/seed1"] and res["left_to_others"] == ["context_softmax/seed1"]
        assert logged_steps(exp_dir, "all_token_softmax/seed1") == [1, 2, 3]  # redone from scratch

        # Waiting for the held run; its holder dies (SIGKILL: no clean-up) and the run is taken over.
        threading.Timer(3, holder.send_signal, (signal.SIGKILL,)).start()
        res = posbias.experiment_run(changed, progress=False)
        assert res["ran"] == ["context_softmax/seed1"] and res["skipped_finished"] == ["all_token_softmax/seed1"]
        assert res["left_to_others"] == [] and res["finished_by_others"] == []
    finally:
        holder.kill()
        holder.wait()
    runs = {r["name"]: r for r in load_results(exp_dir)["runs"]}
    assert {r["status"] for r in runs.values()} == {"finished"} and len(runs) == 2
    assert json.loads(runs["all_token_softmax/seed1"]["config_json"])["train"]["lr"] == 0.002


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A finished 2-run experiment and its store."""
    tmp = tmp_path_factory.mktemp("recorded")
    spec = tiny_spec(tmp, seeds=[1])
    posbias.experiment_run(spec, progress=False)
    return tmp / "exp", spec, store(tmp / "exp")


def test_duplicated_log_steps_do_not_brick_the_store(recorded, tmp_path):
    """A run log with steps twice (two processes of an older posbias trained one run at once) is
    recorded with each step once, instead of failing every later `experiment run`."""
    src, spec, expected = recorded
    exp_dir = tmp_path / "exp"
    shutil.copytree(src, exp_dir)
    log = exp_dir / "runs" / "context_softmax" / "seed1" / "train_log.jsonl"
    log.write_text(log.read_text(encoding="utf-8") * 2, encoding="utf-8")
    with sqlite3.connect(exp_dir / "experiment.sqlite") as conn:
        conn.execute("UPDATE runs SET status = 'running' WHERE name = 'context_softmax/seed1'")
    res = posbias.experiment_run(dict(spec, output_dir=str(exp_dir)), progress=False)
    assert res["ran"] == ["context_softmax/seed1"]
    again = store(exp_dir)
    assert again["curves"] == expected["curves"] and again["runs"] == expected["runs"]


def test_an_unreadable_store_is_named_with_the_way_out(recorded, tmp_path):
    """A corrupt experiment.sqlite: run, report and copy name it and say what to do; moved aside,
    `experiment run` rebuilds the same store from the runs' folders without training again."""
    src, spec, expected = recorded
    exp_dir = tmp_path / "exp"
    shutil.copytree(src, exp_dir)
    db = exp_dir / "experiment.sqlite"
    for suffix in ("-wal", "-shm"):
        (exp_dir / f"experiment.sqlite{suffix}").unlink(missing_ok=True)
    db.write_bytes(os.urandom(8192))
    message = re.escape(str(db)) + " is not a readable experiment store .*move it aside"
    spec = dict(spec, output_dir=str(exp_dir))
    with pytest.raises(ConfigError, match=message):
        posbias.experiment_run(spec, progress=False)
    with pytest.raises(ConfigError, match=message):
        load_results(exp_dir)
    with pytest.raises(ConfigError, match=message):
        copy_results(exp_dir, tmp_path / "archive")
    with pytest.raises(ConfigError, match=message):
        copy_results(src, exp_dir)
    r = cli_here("experiment", "report", str(exp_dir))
    assert r.returncode == 2 and r.stderr.startswith(f"posbias: error: {db} is not a readable experiment store")
    assert len(r.stderr.strip().splitlines()) == 1

    os.replace(db, exp_dir / "experiment.sqlite.broken")
    res = posbias.experiment_run(spec, progress=False)
    assert sorted(res["ran"]) == sorted(r[0] for r in expected["runs"])
    assert store(exp_dir) == expected
    for name in res["ran"]:
        assert logged_steps(exp_dir, name) == [1, 2, 3]
        info = json.loads((exp_dir / "runs" / name / "run_info.json").read_text(encoding="utf-8"))
        assert info["resumed_at_step"] == 3  # collected from the finished checkpoint, not trained again
