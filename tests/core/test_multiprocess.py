"""What posbias does with several processes (torchrun, `accelerate launch`), on CPUs in a gloo group:
the training loop's position-update counts and perturbation draws (one process with gradient
accumulation N = N processes over the same global batches), evaluation with fewer windows than
processes, the F1(alpha) callback's metrics on every process, and the commands and engines that
refuse to run as several processes."""
import json
import os

import pytest
import yaml
from safetensors.torch import load_file

import posbias
from posbias.config import build_config
from posbias.errors import ConfigError

from helpers import DEMO_DEV, assert_close_to_scale, run_cli, tiny_config
from helpers.hf import SENTENCES
from helpers.ranks import (callback_metrics, cli_command, evaluate_few_windows, merged_update_counts,
                           process_group_lifetime, run_ranks)


def test_position_updates_count_a_step_once_when_any_process_saw_the_position():
    """Per step, position 2 seen by both processes counts once; every other position by one of
    them counts too; both processes end with the same counts."""
    seen = [[[1, 2], [3]],  # rank 0: step 0 saw ids 1 and 2, step 1 saw 3
            [[2, 5], [7, 8]]]  # rank 1
    a, b = run_ranks(merged_update_counts, 2, seen, timeout=120)
    assert a["own"][2] == b["own"][2] == 1 and a["own"][5] == 0  # before: each its own batches only
    expect = [0] * 16
    for i in (1, 2, 3, 5, 7, 8):
        expect[i] = 1
    assert a["merged"] == b["merged"] == {"steps": 2, "counts": expect}


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through Linux's /proc")
def test_the_process_group_outlives_api_runs_and_the_cli_ends_it(tmp_path):
    """posbias.train() under a launcher leaves the group to its caller (before, accelerate's
    end_training destroyed it, so a second run in the process could not train as 2 processes);
    `posbias train` ends it, and no gloo thread is left for interpreter exit, where one finishing a
    collective's clean-up aborted the process ("terminate called without an active exception",
    about 1 run in 8 of a busy 2-process run)."""
    def config(name):
        return tiny_config(tmp_path, data={"eval_file": None},
                           train={"output_dir": str(tmp_path / name), "max_steps": 2, "batch_size": 4})

    path = tmp_path / "cli.yaml"
    path.write_text(yaml.safe_dump(config("cli")))
    a, b = run_ranks(process_group_lifetime, 2, config("first"), config("second"), str(path), timeout=300)
    for r in (a, b):
        assert r["after_first"] and r["after_second"] and r["second_steps"] == 2
        assert r["threads_before"]  # the group's threads ran: the check below can see them
        assert r["cli_code"] == 0 and not r["after_cli"] and r["threads_after"] == []
    assert json.loads((tmp_path / "second" / "run_info.json").read_text(encoding="utf-8"))["world_size"] == 2


def test_two_processes_train_as_one_with_gradient_accumulation(tmp_path):
    """`posbias train` as 2 CPU processes (gloo, each started as torchrun starts a rank), train.grad_accum
    1 vs one process with grad_accum 2: the same global batches per step, so the same RPP shifts (the
    draws are the global batch's, not the step's or the process's) and the same position_updates.json
    (every process's batches counted)."""
    def config(name, accum):
        cfg = tiny_config(tmp_path, data={"eval_file": None},
                          train={"output_dir": str(tmp_path / name), "max_steps": 3, "grad_accum": accum,
                                 "batch_size": 4})
        # No dropout: its masks come from each process's own generator, as in any DDP run.
        cfg["model"]["encoder"].update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        return {**cfg, "perturb": [{"name": "rpp", "mode": "replace"}]}

    posbias.train(build_config(config("one", 2)), progress=False)
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(config("two", 1)))
    for rank in run_ranks(cli_command, 2, ["train", "qa", "-c", path], timeout=300):
        assert rank["code"] == 0, rank["stderr"][-3000:]

    def read(name, file):
        return json.loads((tmp_path / name / file).read_text(encoding="utf-8"))

    assert read("two", "run_info.json")["world_size"] == 2
    assert read("two", "data_order/epoch-0.json")["batches"] == read("one", "data_order/epoch-0.json")["batches"]
    one, two = read("one", "position_updates.json"), read("two", "position_updates.json")
    assert one["steps"] == two["steps"] == 3
    assert sum(one["counts"][128:]) > 0  # the shifts reach past the 128-token windows: the draws matter
    assert two["counts"] == one["counts"]
    # The same shifts, so the same gradients: the weights agree up to the order of float sums (the
    # mean over processes vs over accumulated micro-batches), not up to another draw's difference.
    a, b = (load_file(str(tmp_path / name / "best" / "model.safetensors")) for name in ("one", "two"))
    for k in a:
        assert_close_to_scale(b[k], a[k], 1e-3, k)


def test_evaluation_with_fewer_windows_than_processes_finishes():
    """One question, one window, two processes with a DDP-wrapped model (as training evaluates):
    the process without a window neither waits for the other's forward nor loses the result."""
    a, b = run_ranks(evaluate_few_windows, 2, 1, timeout=120)
    assert a["windows"] == 1
    assert a == b and a["total"] == 1


def test_f1_alpha_callback_metrics_are_on_every_process_and_equal(tmp_path):
    """PositionBiasCallback under 2 processes: the F1(alpha) metrics are in every process's metrics
    (best-model selection reads them there), and they are the first process's numbers."""
    conll = tmp_path / "dev.conll"
    conll.write_text("\n\n".join("\n".join(f"{w} {t}" for w, t in zip(*s)) for s in SENTENCES * 3) + "\n",
                     encoding="utf-8")
    a, b = run_ranks(callback_metrics, 2, str(conll), timeout=120)
    keys = {"eval_f1_alpha_1", "eval_f1_alpha_3"}
    assert keys <= set(a["metrics"]) and keys <= set(b["metrics"])
    assert a["metrics"] == b["metrics"] == {"eval_loss": 1.0, **a["own"]}


@pytest.mark.parametrize("command", ["evaluate", "predict", "diagnose"])
def test_commands_that_run_in_one_process_refuse_several(monkeypatch, command):
    """Under torchrun every process would run the whole command and write the same folder."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    call = {"evaluate": lambda: posbias.api.evaluate("m", DEMO_DEV, "out"),
            "predict": lambda: posbias.api.predict("m", data=DEMO_DEV, output_dir="out"),
            "diagnose": lambda: posbias.api.diagnose("m", DEMO_DEV, "out")}[command]
    with pytest.raises(ConfigError, match=rf"^posbias {command} runs in one process, but it was started as one "
                                          r"of 2 \(WORLD_SIZE=2: torchrun"):
        call()


def test_evaluate_under_torchrun_is_one_line_and_exit_2(tmp_path):
    r = run_cli("evaluate", "qa", "--model", str(tmp_path / "m"), "--data", DEMO_DEV, "--output-dir",
                str(tmp_path / "out"), env={"WORLD_SIZE": "2", "RANK": "1"})
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "posbias: error: posbias evaluate runs in one process, but it was started as one of 2 (WORLD_SIZE=2: "
        "torchrun or accelerate launch), and every process would write the same output folder; run it without "
        "the launcher (pick its GPU with --device cuda:N)"]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("var, engine", [("ACCELERATE_USE_FSDP", "FSDP"), ("ACCELERATE_USE_DEEPSPEED", "DeepSpeed")])
def test_training_refuses_sharded_engines_by_name(tmp_path, monkeypatch, var, engine):
    """accelerate launch --use_fsdp / --use_deepspeed (or a config with that distributed_type) sets
    the variable: refused before anything is built, naming the engine and the variable."""
    monkeypatch.setenv(var, "true")
    with pytest.raises(ConfigError, match=rf"^train: {engine} \({var}=true, .* not supported by posbias training"):
        posbias.train(build_config(tiny_config(tmp_path)), progress=False)
    assert not (tmp_path / "run" / "run_info.json").exists()
