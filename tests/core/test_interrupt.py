"""SIGTERM and SIGINT end a run `interrupted` (posbias/interrupt.py, the training loop, the experiment
store): exit 143 / 130, the resume state saved at the step the signal came in, and a resumed run
ending where the uninterrupted one ends. The handlers exist only while a run is in progress."""
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

import helpers.slow  # noqa: F401  (registers _test_slow)
import posbias
from helpers import CPU_ONLY_ENV, tiny_config
from posbias.config import build_config
from posbias.interrupt import Interrupted, stop_on_signals

# The child runs the CLI as the `posbias` command does, with the perturbation `_test_slow`
# (helpers.slow, imported here too for the runs resumed in this process) registered first.
CHILD = ("import sys\nsys.path.insert(0, sys.argv.pop(1))\nimport helpers.slow\nfrom posbias.cli import main\n"
         "sys.exit(main(sys.argv[1:]))\n")
TESTS = str(Path(__file__).resolve().parents[1])
STEPS = 40


def _start(tmp_path, *args):
    """The CLI with the slow perturbation registered, one thread, SIGINT at its default (a suite
    started in the background from a non-interactive shell inherits SIGINT ignored, which posbias
    leaves ignored)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **CPU_ONLY_ENV}
    return subprocess.Popen([sys.executable, "-c", CHILD, TESTS, *args], env=env, cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _signal_when_training(proc, log, signum, at_step: int = 2) -> None:
    """Send `signum` once `log` (a train_log.jsonl) has the line of step `at_step`."""
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if log.is_file() and len(log.read_text(encoding="utf-8").splitlines()) >= at_step:
            break
        time.sleep(0.02)
    assert proc.poll() is None, f"the run ended before it could be interrupted: {proc.stderr.read()[-2000:]}"
    proc.send_signal(signum)


def _ended(proc) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"the run did not stop on its signal: {err[-2000:]}")
    return proc.returncode, err


def _json(path):
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"])
def test_a_signalled_train_saves_its_step_and_resumes_to_the_uninterrupted_result(tmp_path, signum, code,
                                                                                   monkeypatch):
    # No train.save_every: the checkpoint at the interruption is the only one before the end.
    d = tiny_config(tmp_path, train={"max_steps": STEPS}, data={"eval_file": None})
    d["perturb"] = [{"name": "_test_slow"}]
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(d), encoding="utf-8")
    run = tmp_path / "run"
    proc = _start(tmp_path, "train", "qa", "-c", str(tmp_path / "run.yaml"))
    _signal_when_training(proc, run / "train_log.jsonl", signum)
    rc, err = _ended(proc)
    assert rc == code, err
    assert err.strip().splitlines()[-1] == f"posbias: interrupted ({signal.Signals(signum).name})"
    info = _json(run / "run_info.json")
    assert info["status"] == "interrupted" and info["finished"], info
    assert info["error"] == f"interrupted ({signal.Signals(signum).name})"
    # The resume state of the step the run stopped at: the last one it logged (log_every 1), mid-run.
    stopped = _json(run / "checkpoints" / "last" / "trainer_state.json")["global_step"]
    logged = [json.loads(line)["step"] for line in (run / "train_log.jsonl").read_text(encoding="utf-8").splitlines()]
    assert 2 <= stopped == logged[-1] < STEPS
    assert f"posbias: {signal.Signals(signum).name}: the run stopped at step {stopped}/{STEPS}" in err
    assert not (run / "best").exists() and not (run / "checkpoints" / "last.tmp").exists()

    monkeypatch.setattr(helpers.slow, "WAIT_S", 0.0)  # the runs in this process: nothing signals them
    cfg = build_config(d)
    summary = posbias.train(cfg, resume="auto", progress=False)
    assert summary["steps"] == STEPS and _json(run / "run_info.json")["status"] == "finished"
    assert _json(run / "run_info.json")["resumed_at_step"] == stopped
    # Nothing was lost: the resumed run ends bit for bit where an uninterrupted one ends (one process,
    # one thread, the same kernels; the resume test of test_end_to_end says why exact is portable).
    fresh = build_config(d | {"train": {**d["train"], "output_dir": str(tmp_path / "fresh")}})
    posbias.train(fresh, progress=False)
    a = load_file(str(run / "best" / "model.safetensors"))
    b = load_file(str(tmp_path / "fresh" / "best" / "model.safetensors"))
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)


def test_a_signalled_experiment_run_is_interrupted_in_its_store(tmp_path, monkeypatch):
    spec = {"name": "sig", "base": "tiny", "seeds": [1], "eval_sets": {}, "output_dir": str(tmp_path / "exp"),
            "overrides": {"train": {"max_steps": STEPS, "log_every": 1}, "perturb": [{"name": "_test_slow"}],
                          "data": {"eval_file": None, "max_train_examples": 48, "max_seq_len": 128, "stride": 48}},
            "methods": {"slow": {}}}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec), encoding="utf-8")
    run = tmp_path / "exp" / "runs" / "slow" / "seed1"
    proc = _start(tmp_path, "experiment", "run", str(tmp_path / "spec.yaml"))
    _signal_when_training(proc, run / "train_log.jsonl", signal.SIGTERM)
    rc, err = _ended(proc)
    assert rc == 143, err
    with sqlite3.connect(tmp_path / "exp" / "experiment.sqlite") as conn:
        assert dict(conn.execute("SELECT name, status FROM runs")) == {"slow/seed1": "interrupted"}
    assert _json(run / "run_info.json")["status"] == "interrupted"
    stopped = _json(run / "checkpoints" / "last" / "trainer_state.json")["global_step"]
    assert 2 <= stopped < STEPS

    monkeypatch.setattr(helpers.slow, "WAIT_S", 0.0)  # the run resumed in this process: nothing signals it
    resumed = posbias.experiment_run(tmp_path / "spec.yaml", progress=False)  # continues the interrupted run
    assert resumed["ran"] == ["slow/seed1"] and _json(run / "run_info.json")["resumed_at_step"] == stopped
    with sqlite3.connect(tmp_path / "exp" / "experiment.sqlite") as conn:
        assert dict(conn.execute("SELECT name, status FROM runs")) == {"slow/seed1": "finished"}


# ---- the handlers: only while a run is in progress, the caller's own ones back after it


def test_importing_posbias_installs_no_handler():
    code = ("import signal, posbias, posbias.training, posbias.experiment.run, posbias.cli\n"
            "assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL\n"
            "assert signal.getsignal(signal.SIGINT) is signal.default_int_handler\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "OMP_NUM_THREADS": "1"},
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert r.returncode == 0, r.stderr


def test_a_library_caller_gets_its_handlers_back(tmp_path):
    def mine(signum, frame):
        pass

    old = signal.signal(signal.SIGTERM, mine)
    try:
        posbias.train(build_config(tiny_config(tmp_path, train={"max_steps": 1}, data={"eval_file": None})),
                      progress=False)
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, old)


def test_a_first_signal_waits_for_the_loop_and_a_second_one_does_not():
    def mine(signum, frame):
        pass

    old = signal.signal(signal.SIGTERM, mine)
    # SIGINT as an interactive Python has it: a suite started in the background from a non-interactive
    # shell (`make test &`) inherits it ignored, and an ignored signal stays ignored (the next test).
    old_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with stop_on_signals() as stop:
            with pytest.raises(Interrupted) as now:  # outside `deferred` (a run's setup): at once
                signal.raise_signal(signal.SIGTERM)
            assert now.value.exit_code == 143 and not stop.requested
            with pytest.raises(Interrupted) as second, stop.deferred():
                signal.raise_signal(signal.SIGINT)  # waits for the loop's next look
                assert stop.requested and stop.name == "SIGINT"
                signal.raise_signal(signal.SIGTERM)  # a second signal: at once
                raise AssertionError("the second signal did not raise")
            assert second.value.exit_code == 143
        with stop_on_signals() as stop:
            with pytest.raises(Interrupted) as late, stop.deferred():  # after the loop's last look: at its end
                signal.raise_signal(signal.SIGINT)
            assert late.value.exit_code == 130
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, old)
        signal.signal(signal.SIGINT, old_int)


def test_an_ignored_signal_stays_ignored():
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with stop_on_signals():
            assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN, None)
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, old)
