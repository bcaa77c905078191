"""Conventions users expect from a training loop: trackers (train.report_to), early stopping."""
import json

import pytest

import posbias
from posbias.config import build_config
from posbias.errors import ConfigError

from helpers import cli_here, tiny_config


def test_report_to_tensorboard_writes_event_files(tmp_path):
    pytest.importorskip("tensorboard")
    cfg = build_config(tiny_config(tmp_path, train={"max_steps": 2, "eval_every": 1, "report_to": "tensorboard"}))
    posbias.train(cfg, progress=False)
    events = list((tmp_path / "run" / "tracking").rglob("events.out.tfevents.*"))
    assert events
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = set()
    for e in events:
        acc = EventAccumulator(str(e.parent))
        acc.Reload()
        tags |= set(acc.Tags()["scalars"])
    assert {"train/loss", "train/lr", "eval/f1"} <= tags, tags


def test_report_to_checks_names_and_packages(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="train.report_to: unknown tracker 'tensorbord'"):
        build_config(tiny_config(), ["train.report_to=tensorbord"])
    assert build_config(tiny_config(), ["train.report_to=none"]).train.report_to == []
    assert build_config(tiny_config(), ["train.report_to=[tensorboard, wandb]"]).hash() == build_config(tiny_config()).hash()
    import accelerate.tracking

    monkeypatch.setattr(accelerate.tracking, "get_available_trackers", lambda: [])
    cfg = build_config(tiny_config(tmp_path, train={"max_steps": 1, "report_to": ["wandb"]}))
    with pytest.raises(ConfigError, match="the wandb tracker is not installed"):
        posbias.train(cfg, progress=False)


def test_early_stopping(tmp_path, monkeypatch):
    from posbias.qa.task import QATask

    scores = iter([50.0, 40.0, 45.0, 60.0, 70.0])
    real = QATask.main_metric
    monkeypatch.setattr(QATask, "main_metric", lambda self, m: (real(self, m)[0], next(scores)))
    cfg = build_config(tiny_config(tmp_path, train={"max_steps": 5, "eval_every": 1, "early_stopping_patience": 2}))
    summary = posbias.train(cfg, progress=False)
    assert summary["steps"] == 3 and summary["stopped_early_at"] == 3 and summary["best_step"] == 1
    log = [json.loads(l)["step"] for l in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    assert log == [1, 2, 3]
    with pytest.raises(ConfigError, match="early_stopping_patience needs data.eval_file"):
        posbias.train(build_config(tiny_config(tmp_path / "b", train={"early_stopping_patience": 1},
                                               data={"eval_file": None})), progress=False)
    # resuming a stopped run trains nothing more
    assert posbias.train(cfg, resume="auto", progress=False)["steps"] == 3


def test_label_set_mismatch_is_named_and_mappable(tmp_path):
    from helpers import run_cli

    train = tmp_path / "train.conll"
    train.write_text("Ana B-PER\nwent O\nto O\nOslo B-LOC\n\nBo B-PER\nsmiled O\n", encoding="utf-8")
    other = tmp_path / "other.conll"
    other.write_text("Ana B-person\nwent O\nto O\nOslo B-location\n", encoding="utf-8")
    cfg = build_config({"task": "tagging", "model": {"name_or_path": None, "tokenizer": "tiny", "encoder": {
        "model_type": "bert", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4,
        "intermediate_size": 64}}, "data": {"train_file": str(train), "eval_file": None},
        "train": {"output_dir": str(tmp_path / "run"), "max_steps": 1, "batch_size": 2}})
    posbias.train(cfg, progress=False)
    best = str(tmp_path / "run" / "best")
    with pytest.raises(ConfigError, match=r"the data's entity types \['location', 'person'\] are not among "
                                          r"the model's \['LOC', 'PER'\]"):
        posbias.evaluate(best, str(other), task="tagging", progress=False)
    m = posbias.evaluate(best, str(other), task="tagging", progress=False,
                         overrides=["data.label_map={person: PER, location: LOC}"])
    assert m["entities"] == 2 and set(m["per_class"]) <= {"PER", "LOC"}  # gold mapped onto the model's names
    r = cli_here("evaluate", "tagging", "--model", best, "--data", str(other))
    assert r.returncode == 2 and "data.label_map" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    dropped = posbias.evaluate(best, str(other), task="tagging", progress=False,
                               overrides=["data.label_map={person: PER, location: O}"])
    assert dropped["entities"] == 1  # location dropped to O
    # Some classes in common (a model trained without a rare type): a warning naming the rest.
    with pytest.warns(UserWarning, match=r"cannot predict the data's entity types \['location'\]"):
        posbias.evaluate(best, str(other), task="tagging", progress=False, overrides=["data.label_map={person: PER}"])


def test_progress_in_a_log_file_is_plain_lines_and_quiet_silences_it(tmp_path):
    from helpers import run_cli

    r = run_cli("train", "qa", "-c", "tiny", f"train.output_dir={tmp_path / 'a'}", "train.max_steps=2",
                "train.log_every=1", "data.max_eval_examples=4")  # stderr is a pipe, as in a log file
    assert r.returncode == 0, r.stderr
    assert "\x1b[A" not in r.stderr and "\r" not in r.stderr  # no cursor moves, no carriage returns
    assert [l.split()[2] for l in r.stderr.splitlines() if l.startswith("train step")] == ["1/2", "2/2"]
    q = run_cli("--quiet", "train", "qa", "-c", "tiny", f"train.output_dir={tmp_path / 'b'}", "train.max_steps=2",
                "train.log_every=1", "data.max_eval_examples=4", "--json")
    assert q.returncode == 0 and "train step" not in q.stderr, q.stderr
    assert '"steps": 2' in q.stdout
