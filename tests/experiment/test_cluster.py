"""A grid on a cluster or several GPUs: the jobs `--dry-run` prints take their run's lock and leave
the store to `experiment collect` (which never trains and lists what is unfinished), submitit jobs
(its local executor), one lane per GPU (`--gpus`) on one store, and the lane scheduler under the
lanes (`run_queue`: groups, exit codes, the deadline and the projection past it)."""
import json
import os
import shlex
import sqlite3
import subprocess
import sys

import pytest
import torch
import yaml

import posbias
import posbias.experiment.cluster as cluster
from posbias import cli
from posbias.config import PRESETS
from posbias.errors import ConfigError

from helpers import CPU_ONLY_ENV

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="the tests hold locks with POSIX processes")

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **CPU_ONLY_ENV}


def tiny_spec(tmp_path, **changes) -> dict:
    """The smoke experiment cut to seconds: 3 steps, 2 methods x 1 seed, no eval sets or segments."""
    spec = yaml.safe_load((PRESETS / "experiments" / "smoke.yaml").read_text(encoding="utf-8"))
    spec.update(overrides={"train": {"max_steps": 3, "eval_every": 3, "log_every": 1, "device": "cpu"},
                           "data": {"max_train_examples": 24, "max_eval_examples": 16, "max_seq_len": 128,
                                    "stride": 48}},
                seeds=[1], eval_sets={}, segments=[], output_dir=str(tmp_path / "exp"))
    spec.update(changes)
    return spec


def hold(exp_dir, run: str) -> subprocess.Popen:
    """Another process holding `run`'s lock (as a job training it would) until it is killed."""
    code = ("import sys, time; from posbias.experiment import claim\n"
            "fd = claim(sys.argv[1], sys.argv[2]); print('held' if fd is not None else 'busy', flush=True)\n"
            "time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(exp_dir), run], env=ENV, text=True,
                            stdout=subprocess.PIPE)
    if (line := proc.stdout.readline().strip()) != "held":
        proc.kill()
        proc.wait()
        raise AssertionError(f"the holder process could not take the lock of {run}: {line!r}")
    return proc


def cli_main(argv, capsys) -> tuple[int, str, str]:
    code = cli.main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def recorded(exp_dir) -> dict:
    if not (exp_dir / "experiment.sqlite").is_file():
        return {}
    with sqlite3.connect(exp_dir / "experiment.sqlite") as conn:
        return dict(conn.execute("SELECT name, status FROM runs"))


def logged_steps(exp_dir, run: str) -> list[int]:
    log = (exp_dir / "runs" / run / "train_log.jsonl").read_text(encoding="utf-8")
    return [json.loads(line)["step"] for line in log.splitlines()]


def test_dry_run_jobs_hold_their_run_and_collect_records_them_without_training(tmp_path, capsys):
    """The printed job commands take their run's lock (a held run is left alone), train and score
    it in its folder without the store; `experiment collect` records the finished run, lists the held
    one with its holder (exit 3), and touches neither; once free, `experiment run` trains it."""
    spec = tiny_spec(tmp_path, eval_sets={"test": "demo:dev"})
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    exp_dir = tmp_path / "exp"
    code, out, _ = cli_main(["experiment", "run", str(spec_file), "--dry-run"], capsys)
    assert code == 0
    commands = {line.split("\t")[0]: line.split("\t")[2] for line in out.strip().splitlines()}
    assert set(commands) == {"context_softmax/seed1", "all_token_softmax/seed1"}
    held_name, job_name = "context_softmax/seed1", "all_token_softmax/seed1"
    for cmd in commands.values():
        assert cmd.startswith("posbias experiment run ") and "--no-store" in cmd

    holder = hold(exp_dir, held_name)
    try:
        # The job of a run another process holds leaves it alone (today's `posbias train` would train it).
        code, _, err = cli_main(shlex.split(commands[held_name])[1:], capsys)
        assert code == 0 and f"{held_name}: held by pid {holder.pid}" in err
        assert not (exp_dir / "runs" / held_name / "run_info.json").exists()
        # The other job trains its run and scores its eval set, in its folder; the store is not written.
        code, _, _ = cli_main(["-q", *shlex.split(commands[job_name])[1:]], capsys)
        assert code == 0
        info = json.loads((exp_dir / "runs" / job_name / "run_info.json").read_text(encoding="utf-8"))
        assert info["status"] == "finished" and logged_steps(exp_dir, job_name) == [1, 2, 3]
        assert (exp_dir / "runs" / job_name / "evals" / "test" / "metrics.json").is_file()
        assert recorded(exp_dir) == {}
        # A second run of the same job finds the run trained: nothing is trained again.
        res = posbias.experiment_run(str(exp_dir / "experiment.yaml"), str(exp_dir), only=[job_name],
                                     record=False, wait=False, progress=False)
        assert res["skipped_finished"] == [job_name] and res["ran"] == []
        assert logged_steps(exp_dir, job_name) == [1, 2, 3]

        # collect: records the finished run, lists the held one with its holder, exit 3.
        code, out, _ = cli_main(["experiment", "collect", str(exp_dir)], capsys)
        assert code == cli.COLLECT_UNFINISHED == 3
        assert "1 run(s) finished (1 recorded now), 1 unfinished" in out
        assert f"{held_name}\trunning\tpid {holder.pid} on " in out
        assert recorded(exp_dir) == {job_name: "finished"}
        assert not (exp_dir / "runs" / held_name / "run_info.json").exists()
        info_again = json.loads((exp_dir / "runs" / job_name / "run_info.json").read_text(encoding="utf-8"))
        assert info_again == info  # collected from its folder: not resumed, not trained
        # `experiment run` leaves the held run to its holder as well.
        res = posbias.experiment_run(spec, progress=False, wait=False)
        assert res["left_to_others"] == [held_name] and res["skipped_finished"] == [job_name]
        assert not (exp_dir / "runs" / held_name / "run_info.json").exists()
    finally:
        holder.kill()
        holder.wait()
    code, out, _ = cli_main(["experiment", "collect", str(spec_file)], capsys)
    assert code == 3 and f"{held_name}\tnot started" in out
    res = posbias.experiment_run(spec, progress=False)
    assert res["ran"] == [held_name]
    code, out, _ = cli_main(["experiment", "collect", str(exp_dir)], capsys)
    assert code == 0 and "2 run(s) finished (0 recorded now), 0 unfinished" in out
    with sqlite3.connect(exp_dir / "experiment.sqlite") as conn:
        metrics = dict(conn.execute("SELECT name, metrics_json FROM runs"))
    assert all(set(json.loads(m)) == {"val", "test"} for m in metrics.values())


def test_collect_names_a_folder_without_a_spec(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    code, _, err = cli_main(["experiment", "collect", str(tmp_path / "empty")], capsys)
    assert code == 2 and err.count("\n") == 1 and "holds no experiment.yaml" in err


@pytest.mark.slow  # a process per job, each importing torch: ~20 s on 2 shared cores
def test_submitit_jobs_run_the_grid_and_the_store_records_them(tmp_path, monkeypatch):
    """`--launcher submitit` through submitit's local executor: one job per run, each trained under
    its lock; the submitting process records them, and a second `experiment run` skips them all."""
    pytest.importorskip("submitit")
    for k, v in {**CPU_ONLY_ENV, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}.items():
        monkeypatch.setenv(k, v)  # the local jobs inherit this environment: CPU only, one thread
    spec = tiny_spec(tmp_path)
    exp_dir = tmp_path / "exp"
    res = posbias.experiment_run(spec, launcher="submitit", launcher_options={"cluster": "local", "timeout_min": 10})
    names = ["context_softmax/seed1", "all_token_softmax/seed1"]
    assert sorted(res["submitted"]) == sorted(names) and res["failed"] == {}, res
    assert sorted(res["collected"]) == sorted(names) and res["unfinished"] == []
    assert recorded(exp_dir) == {n: "finished" for n in names}
    for name in names:
        assert logged_steps(exp_dir, name) == [1, 2, 3]
    assert list((exp_dir / "submitit").glob("*_log.out"))  # the jobs' logs
    again = posbias.experiment_run(spec, progress=False)
    assert again["ran"] == [] and sorted(again["skipped_finished"]) == sorted(names)
    res = posbias.experiment_run(spec, launcher="submitit", launcher_options={"cluster": "local"})
    assert res["submitted"] == {} and sorted(res["finished"]) == sorted(names)


def test_submitit_launcher_without_submitit_names_the_extra(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "submitit", None)  # `import submitit` raises ImportError
    with pytest.raises(ConfigError, match=r"pip install 'posbias\[cluster\]'"):
        posbias.experiment_run(tiny_spec(tmp_path), launcher="submitit")
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(tiny_spec(tmp_path), sort_keys=False))
    code, _, err = cli_main(["experiment", "run", str(spec_file), "--launcher", "submitit"], capsys)
    assert code == 2 and err.count("\n") == 1 and "posbias[cluster]" in err


def test_bad_submitit_options_are_one_named_error(tmp_path):
    pytest.importorskip("submitit")
    with pytest.raises(ConfigError, match="--submitit colour=red"):
        posbias.experiment_run(tiny_spec(tmp_path), launcher="submitit",
                               launcher_options={"cluster": "local", "colour": "red"})
    with pytest.raises(ConfigError, match="--submitit takes KEY=VALUE"):
        cluster.parse_options(["timeout_min"])
    assert cluster.parse_options(["timeout_min=60", "slurm_partition=gpu"]) == {"timeout_min": 60,
                                                                                "slurm_partition": "gpu"}


def test_gpus_are_parsed_and_checked():
    assert cluster.parse_gpus("0,1,2,3") == ["0", "1", "2", "3"] and cluster.parse_gpus("3") == ["3"]
    for bad in ("", "0,0", "a", "cuda:0", "0,,1"):
        with pytest.raises(ConfigError, match="--gpus"):
            cluster.parse_gpus(bad)


def test_gpus_with_one_named_gpu_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="--device cuda:1 names one GPU"):
        posbias.experiment_run(tiny_spec(tmp_path), gpus="0,1", device="cuda:1")


@pytest.mark.slow  # a process per lane, each importing torch: ~20 s on 2 shared cores
def test_gpu_lanes_split_the_grid_each_seeing_its_own_gpu(tmp_path, monkeypatch, capsys):
    """`--gpus 0,1`: two lane processes, CUDA_VISIBLE_DEVICES 0 and 1, on one store; each run trained
    once, by one lane (here on the CPU: `--device cpu` goes to the lanes)."""
    started = []
    real = subprocess.Popen

    def popen(cmd, **kw):
        started.append((cmd, kw["env"]["CUDA_VISIBLE_DEVICES"]))
        kw["env"] = {**kw["env"], "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
        return real(cmd, **kw)

    monkeypatch.setattr(cluster.subprocess, "Popen", popen)
    spec = tiny_spec(tmp_path)
    res = posbias.experiment_run(spec, gpus="0,1", device="cpu", progress=False)
    assert [gpu for _, gpu in started] == ["0", "1"]
    assert all(cmd[cmd.index("--device") + 1] == "cpu" for cmd, _ in started)
    names = ["context_softmax/seed1", "all_token_softmax/seed1"]
    assert res["lanes"] == {"0": 0, "1": 0} and sorted(res["ran"]) == sorted(names) and res["left_to_others"] == []
    assert recorded(tmp_path / "exp") == {n: "finished" for n in names}
    for name in names:
        assert logged_steps(tmp_path / "exp", name) == [1, 2, 3]  # trained once, by one lane
    err = capsys.readouterr().err
    assert "[gpu 0] " in err and "[gpu 1] " in err
    again = posbias.experiment_run(spec, progress=False)
    assert again["ran"] == [] and sorted(again["skipped_finished"]) == sorted(names)


@pytest.mark.gpu
def test_gpu_lanes_train_on_their_gpus(tmp_path):
    """On a GPU box: `--gpus` with every visible GPU (at most 2); each run's run_info says cuda."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU: torch sees none")
    gpus = ",".join(str(i) for i in range(min(torch.cuda.device_count(), 2)))
    spec = tiny_spec(tmp_path)
    spec["overrides"]["train"].pop("device")
    res = posbias.experiment_run(spec, gpus=gpus, progress=False)
    assert len(res["ran"]) == 2 and set(res["lanes"].values()) == {0}
    for name in res["ran"]:
        info = json.loads((tmp_path / "exp" / "runs" / name / "run_info.json").read_text(encoding="utf-8"))
        assert info["hardware"]["device"].startswith("cuda"), info["hardware"]


# -- the lane scheduler (run_queue), on plain Python commands -------------------------------------

def _job(name, code="", group=0, **kw):
    return cluster.LaneJob(name, [sys.executable, "-c", code], group=group, env=ENV, **kw)


def _steps(total, n, pause):
    """A stand-in for a training run: run_info.json's total_steps, then `n` steps logged `pause` apart."""
    return ("import json, pathlib, sys, time\nd = pathlib.Path(sys.argv[1]); d.mkdir(parents=True, exist_ok=True)\n"
            f"(d / 'run_info.json').write_text(json.dumps({{'total_steps': {total}}}))\n"
            f"for i in range(1, {n} + 1):\n"
            "    with open(d / 'train_log.jsonl', 'a') as f: f.write(json.dumps({'step': i}) + '\\n')\n"
            f"    time.sleep({pause})\n")


def test_run_family_times_a_queued_run():
    assert cluster.family("n128/mean/seed1") == "n128" and cluster.family("baseline/seed1") == ""
    assert cluster.expected_seconds({}, "n16/mean/seed1") is None
    assert cluster.expected_seconds({"n16": 150.0, "full": 480.0}, "n1024/max/seed2") == 150.0
    assert cluster.last_step(None) == (0, None)


def test_run_queue_starts_a_group_whole_and_reports_each_exit(tmp_path, capsys):
    """Two lanes: group 0 (two jobs) fills them; group 1 starts once a lane is free. Output goes to a
    job's log file, or to stderr behind its prefix; a failed job is reported with its exit code."""
    jobs = [_job("a", "print('to the log')", log=tmp_path / "a.log"),
            _job("b", "import sys; print('piped'); sys.exit(3)", prefix="[b] "),
            _job("c", "pass", group=1)]
    res = cluster.run_queue(jobs, lanes=2, poll=0.05)
    starts = [e.split("] ", 1)[1] for e in res["events"] if e.split("] ", 1)[1].startswith("start")]
    assert starts == ["start a", "start b", "start c"]
    assert {n: (r["outcome"], r["returncode"]) for n, r in res["runs"].items()} == {
        "a": ("finished", 0), "b": ("failed rc=3", 3), "c": ("finished", 0)}
    assert res["not_started"] == [] and (tmp_path / "a.log").read_text().strip() == "to the log"
    assert "[b] piped" in capsys.readouterr().err


def test_run_queue_stops_what_the_deadline_cuts_off(tmp_path):
    jobs = [_job("slow", "import time; time.sleep(60)"), _job("next", "pass", group=1)]
    res = cluster.run_queue(jobs, lanes=1, deadline_s=1.0, poll=0.1)
    assert res["runs"]["slow"]["outcome"] == "stopped at the deadline" and res["not_started"] == ["next"]
    assert res["wall_s"] < 30


def test_run_queue_stops_the_lowest_group_projected_past_the_deadline(tmp_path):
    """Group 1's run would take hours at its measured rate: it is stopped; group 0's (2 s) finishes."""
    quick, slow = tmp_path / "quick", tmp_path / "slow"
    jobs = [cluster.LaneJob("quick", [sys.executable, "-c", _steps(100, 100, 0.02), str(quick)], env=ENV,
                            run_dir=quick),
            cluster.LaneJob("slow", [sys.executable, "-c", _steps(10**6, 10**6, 0.05), str(slow)], group=1, env=ENV,
                            run_dir=slow, new_session=True)]
    res = cluster.run_queue(jobs, lanes=2, deadline_s=60, tail=0, observe=0.3, poll=0.1)
    assert res["runs"]["slow"]["outcome"] == "stopped: projected past the deadline"
    assert res["runs"]["quick"]["outcome"] == "finished" and res["runs"]["quick"]["last_step"] == 100
    assert 0 < res["runs"]["slow"]["last_step"] < 10**6 and res["runs"]["slow"]["total_steps"] == 10**6
