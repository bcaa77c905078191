"""Tagging through the CLI and the API: train -> evaluate -> score -> predict -> export, resume,
data stats, bad input, two processes."""
import json

import pytest
import torch
import yaml
from safetensors.torch import load_file

import posbias
from posbias.config import build_config, config_from

from helpers import INTERRUPT, cli_here, run_cli



@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """`posbias train tagging -c tiny_tagging` on the bundled WNUT-17 slice, through the CLI."""
    out = tmp_path_factory.mktemp("tagging") / "run"
    r = run_cli("train", "tagging", "-c", "tiny_tagging", f"train.output_dir={out}", "train.max_steps=6",
                "train.eval_every=3", "data.max_eval_examples=60", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    return out, json.loads(r.stdout)


def test_train_writes_its_files(trained):
    run, summary = trained
    for f in ["config.yaml", "run_info.json", "train_log.jsonl", "eval_log.jsonl", "data_order/epoch-0.json",
              "position_updates.json", "best/model.safetensors", "best/posbias.yaml", "best/posbias_model.json",
              "best/tokenizer.json", "best/config.json", "checkpoints/last/training_state.safetensors",
              "eval/predictions.conll", "eval/metrics.json"]:
        assert (run / f).is_file(), f
    info = json.loads((run / "run_info.json").read_text(encoding="utf-8"))
    # The model learns IOBES labels (data.label_scheme: bioes, as the authors trained CoNLL) from the
    # IOB2 file, and is scored and writes its predictions in IOB2, the file's scheme.
    assert info["task"] == "tagging" and info["status"] == "finished" and info["scheme"] == "bioes"
    assert info["source_scheme"] == "iob2" and "S-location" in info["labels"]
    assert info["labels"][0] == "O" and "B-location" in info["labels"] and "torch" in info["versions"]
    scored = json.loads((run / "eval" / "metrics.json").read_text(encoding="utf-8"))
    assert scored["scheme"] == "iob2" and scored["label_scheme"] == "bioes"
    rows = [line.split("\t") for line in (run / "eval" / "predictions.conll").read_text(encoding="utf-8").splitlines()]
    assert not any(t[:2] in ("E-", "S-") for row in rows if row != [""] for t in row[1:])
    assert summary["metric"] == "f1" and summary["best_step"] in (3, 6) and "best_f1" in summary
    steps = [json.loads(x)["step"] for x in (run / "eval_log.jsonl").read_text(encoding="utf-8").splitlines()]
    assert steps == [3, 6]
    updates = json.loads((run / "position_updates.json").read_text(encoding="utf-8"))
    assert updates["steps"] == 6 and updates["counts"][0] == 6  # [CLS] at position 0 in every step
    lines = (run / "eval" / "predictions.conll").read_text(encoding="utf-8").split("\n\n")
    assert len([b for b in lines if b.strip()]) == 60


def test_evaluate_score_and_predict(trained, tmp_path):
    run, summary = trained
    r = cli_here("evaluate", "tagging", "--model", str(run / "best"), "--data", "demo:wnut-dev",
                 "--output-dir", str(tmp_path / "ev"), "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(r.stdout)
    assert res["sentences"] == 150 and {"precision", "recall", "f1", "per_class"} <= set(res)
    for f in ("predictions.conll", "metrics.json", "config.yaml", "run_info.json"):
        assert (tmp_path / "ev" / f).is_file(), f
    # Scoring the written predictions without the model gives the same numbers.
    r = cli_here("score", "tagging", "--data", "demo:wnut-dev", "--predictions", str(tmp_path / "ev" / "predictions.conll"))
    assert r.returncode == 0, r.stderr[-2000:]
    scored = json.loads(r.stdout)
    assert scored["f1"] == pytest.approx(res["f1"]) and scored["entities"] == res["entities"]
    # The best checkpoint reproduces the training-time evaluation (on the same 60 sentences).
    again = posbias.evaluate(run / "best", "demo:wnut-dev", overrides=["data.max_eval_examples=60"])
    assert again["f1"] == pytest.approx(summary["best_f1"])

    text = "Yesterday Angela Merkel met Emmanuel Macron in Paris ."
    r = cli_here("predict", "tagging", "--model", str(run / "best"), "--text", text)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["words"][:3] == ["Yesterday", "Angela", "Merkel"] and len(out["tags"]) == len(out["words"])
    for ent in out["entities"]:
        assert text[ent["start_char"]:ent["end_char"]] == ent["text"]
    res = posbias.predict(run / "best", data="demo:wnut-dev", output_dir=tmp_path / "pred")
    assert len(res) == 150 and (tmp_path / "pred" / "predictions.jsonl").is_file()
    first = json.loads((tmp_path / "pred" / "predictions.jsonl").read_text(encoding="utf-8").splitlines()[0])
    assert len(first["words"]) == len(first["tags"])


def test_export_and_wrong_task_errors(trained, tmp_path):
    run, _ = trained
    r = cli_here("export", "--model", str(run / "best"), "--out", str(tmp_path / "hf"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((tmp_path / "hf" / "config.json").read_text(encoding="utf-8"))["architectures"] == [
        "BertForTokenClassification"]
    r = cli_here("evaluate", "qa", "--model", str(run / "best"), "--data", "demo:dev")
    assert r.returncode == 2 and "is a tagging model, not a qa one" in r.stderr
    r = cli_here("train", "qa", "-c", "tiny_tagging")
    assert r.returncode == 2 and "posbias train tagging" in r.stderr
    r = cli_here("predict", "tagging", "--model", str(run / "best"))
    assert r.returncode == 2 and "--text or --data" in r.stderr


def test_data_stats(tmp_path):
    r = cli_here("data", "stats", "--data", "demo:ewt-dev", "demo:wnut-dev", "--output-dir", str(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "150 sentences" in r.stdout and "| NOUN |" in r.stdout and "| location |" in r.stdout
    stats = json.loads((tmp_path / "stats.json").read_text(encoding="utf-8"))
    assert [s["sentences"] for s in stats] == [150, 150] and stats[1]["class_unit"] == "entities"
    assert 0 < stats[0]["length"]["share_le_25"] <= 1
    # §3.1: the length density (Fig. 2) and per-class positions (Figs. 3-5), linked from stats.md
    for name in ("length_density.png", "class_positions_1.png", "class_positions_2.png"):
        assert (tmp_path / name).is_file() and f"({name})" in (tmp_path / "stats.md").read_text(encoding="utf-8")
    pos = stats[1]["class_positions"]["location"]
    assert 0 <= pos["share_first_5"] <= pos["share_first_10"] <= 1


def test_class_positions_by_hand():
    from posbias.tagging.examples import TaggingDataset, TaggingExample
    from posbias.tagging.stats import class_positions

    ner = TaggingDataset("x", "conll", "iob2", [TaggingExample("a", list("abcd"), ["B-PER", "I-PER", "O", "B-LOC"]),
                                                TaggingExample("b", list("ab"), ["O", "B-PER"])])
    assert {k: v.tolist() for k, v in class_positions(ner).items()} == {"LOC": [3], "PER": [0, 1]}
    pos = TaggingDataset("y", "conllu", "none", [TaggingExample("a", list("abc"), ["NOUN", "VERB", "NOUN"])])
    assert {k: v.tolist() for k, v in class_positions(pos).items()} == {"NOUN": [0, 2], "VERB": [1]}


def test_bad_training_file_is_one_line_naming_file_and_line(tmp_path):
    bad = tmp_path / "bad.conll"
    bad.write_text("John B-PER\nlives O\n\nParis Q-LOC\n", encoding="utf-8")
    r = cli_here("train", "tagging", "-c", "tiny_tagging", f"data.train_file={bad}", "data.eval_file=null",
                 f"train.output_dir={tmp_path / 'run'}")
    assert r.returncode == 2 and "bad.conll" in r.stderr and "line 4" in r.stderr and "Traceback" not in r.stderr
    r = cli_here("train", "tagging", "-c", "tiny_tagging", f"data.train_file={bad}", "data.eval_file=null",
                 "data.on_bad_record=skip", f"train.output_dir={tmp_path / 'run2'}", "train.max_steps=1")
    assert r.returncode == 0, r.stderr[-2000:]
    info = json.loads((tmp_path / "run2" / "run_info.json").read_text(encoding="utf-8"))
    assert info["train_skipped_records"] == 1




def test_resume_reproduces_the_uninterrupted_run(tmp_path):
    d = config_from("tiny_tagging").to_dict()
    d["train"].update(output_dir=str(tmp_path / "run"), max_steps=5, save_every=1)
    d["data"]["eval_file"] = None
    d["perturb"] = [{"name": "_test_interrupt"}]
    cfg = build_config(d)
    INTERRUPT.update(at=3, calls=0)
    with pytest.raises(KeyboardInterrupt):
        posbias.train(cfg, progress=False)
    INTERRUPT.update(at=None, calls=0)
    assert posbias.train(cfg, resume="auto", progress=False)["steps"] == 5 and INTERRUPT["calls"] == 3
    d["train"]["output_dir"] = str(tmp_path / "fresh")
    posbias.train(build_config(d), progress=False)
    a = load_file(str(tmp_path / "run" / "best" / "model.safetensors"))
    b = load_file(str(tmp_path / "fresh" / "best" / "model.safetensors"))
    # Same process, one thread, same kernels: a resumed run must match bit for bit.
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)


@pytest.mark.slow
def test_two_process_tagging(tmp_path):
    """`posbias train tagging` as 2 CPU processes of a gloo group, each started as torchrun starts a rank
    (the launcher itself: tests/qa/test_end_to_end.py): both ranks train, rank 0 writes the outputs,
    and the evaluation gathers both ranks' sentences."""
    from helpers.ranks import cli_command, run_ranks

    cfg = config_from("tiny_tagging").to_dict()
    cfg["train"].update(output_dir=str(tmp_path / "run"), max_steps=3, eval_every=3)
    cfg["data"]["max_eval_examples"] = 50
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    for rank in run_ranks(cli_command, 2, ["train", "tagging", "-c", path], timeout=300):
        assert rank["code"] == 0, rank["stderr"][-3000:]
    info = json.loads((tmp_path / "run" / "run_info.json").read_text(encoding="utf-8"))
    assert info["world_size"] == 2 and info["summary"]["steps"] == 3
    metrics = json.loads((tmp_path / "run" / "eval" / "metrics.json").read_text(encoding="utf-8"))
    assert metrics["sentences"] == 50  # both ranks' windows were gathered: every word predicted
    single = posbias.evaluate(tmp_path / "run" / "best", "demo:wnut-dev", overrides=["data.max_eval_examples=50"])
    assert single["f1"] == pytest.approx(metrics["f1"])
