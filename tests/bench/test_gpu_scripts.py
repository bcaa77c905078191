"""The bench/gpu scripts, on the CPU with tiny encoders: throughput.py measures every row (posbias
train, HF Trainer, the bare encoder, evaluation) and writes throughput.json with positive throughput
and the Markdown table; lanes.py runs a grid as concurrent processes, archives the finished runs'
store and small files, and stops what cannot finish by its deadline."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from posbias.config import RESOURCES

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu" / "throughput.py"
LANES = SCRIPT.with_name("lanes.py")
SMOKE = RESOURCES.parent / "configs" / "experiments" / "smoke.yaml"  # 2 methods x 2 seeds, 6 steps


@pytest.mark.slow
def test_throughput_script_measures_every_row_on_cpu(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--tiny", "--steps", "2",
                        "--precisions", "fp32", "--dev", "8", "--eval-passes", "1", "--max-seconds", "600",
                        "--tokenizer", str(RESOURCES / "tiny_tokenizer"), "--out", str(tmp_path)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((tmp_path / "throughput.json").read_text(encoding="utf-8"))
    rows = {x["row"]: x for x in res["rows"]}
    assert {"posbias train", "HF Trainer", "bare train (padded)", "bare train (posbias batches)", "bare forward",
            "posbias evaluate (loop)", "posbias evaluate (call)"} <= set(rows), sorted(rows)
    for name, row in rows.items():
        assert not row.get("error"), (name, row.get("error"))
        assert row["precision"] == "fp32"
        for key in ("tokens_per_s", "padded_tokens_per_s", "steps_per_s"):
            assert row[key] > 0, (name, key, row[key])
        assert row["padded_tokens_per_s"] >= row["tokens_per_s"]  # padding only adds tokens
    assert rows["posbias train"]["vs_bare"] > 0 and rows["posbias evaluate (loop)"]["ref"] == "bare forward"
    assert rows["posbias evaluate (loop)"]["same_windows_as_bare"]
    assert res["skipped"] == [] and res["hardware"]["device"] == "cpu" and res["config"]["tiny"]
    assert "| posbias train | fp32 |" in r.stdout


def _lanes(tmp_path, deadline, *groups, lanes=2):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    r = subprocess.run([sys.executable, str(LANES), str(SMOKE), "--device", "cpu", "--lanes", str(lanes), "--poll", "1",
                        "--threads", "1", "--deadline", str(deadline), "--output-dir", str(tmp_path / "exp"),
                        "--archive", str(tmp_path / "archive"), "--runs", *groups],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return json.loads((tmp_path / "archive" / "lanes.json").read_text(encoding="utf-8"))


@pytest.mark.slow
def test_lanes_run_a_seed_and_archive_its_runs(tmp_path):
    status = _lanes(tmp_path, 600, "context_softmax/seed1,all_token_softmax/seed1")
    assert {name: run["outcome"] for name, run in status["runs"].items()} == {
        "context_softmax/seed1": "finished", "all_token_softmax/seed1": "finished"}
    assert status["copy"]["returncode"] == 0 and status["not_started"] == []
    import sqlite3

    with sqlite3.connect(tmp_path / "archive" / "store" / "experiment.sqlite") as db:
        rows = db.execute("SELECT name, status FROM runs ORDER BY name").fetchall()
    assert rows == [("all_token_softmax/seed1", "finished"), ("context_softmax/seed1", "finished")]
    for run in ("context_softmax/seed1", "all_token_softmax/seed1"):
        folder = tmp_path / "archive" / "runs" / run
        assert (folder / "run_info.json").is_file() and (folder / "evals" / "test" / "metrics.json").is_file()
        assert not list(folder.rglob("*.safetensors"))  # results travel, checkpoints stay


def test_lanes_stop_what_cannot_finish_by_the_deadline(tmp_path):
    # One lane, a 2-second deadline: the first seed is still loading when it comes; the second never starts.
    status = _lanes(tmp_path, 2, "context_softmax/seed1", "context_softmax/seed2", lanes=1)
    assert status["runs"]["context_softmax/seed1"]["outcome"] == "stopped at the deadline"
    assert status["not_started"] == ["context_softmax/seed2"]


@pytest.mark.parametrize("spec", sorted(LANES.parent.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_gpu_queue_spec_builds_its_grid(spec, tmp_path):
    """The queue items' specs load as `experiment run` reads them (no data needed to build the grid):
    five seeds each, and map_full's forward-only scoring of every MaP_E run is a decode of its own seed."""
    from posbias.experiment import load_experiment

    exp = load_experiment(str(spec), output_dir=str(tmp_path / "exp"))
    seeds = {r.seed for r in exp.runs}
    assert len(seeds) == 5 and len(exp.runs) == 5 * len(exp.methods)
    for run in exp.runs:
        if run.method == "map_e_forward":
            assert run.checkpoint == str(tmp_path / "exp" / "runs" / "map_e" / f"seed{run.seed}" / "best")
            assert run.decode == {"ensemble": False}
