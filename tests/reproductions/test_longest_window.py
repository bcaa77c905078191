"""reproductions/longest_window.py: the longest training window of a spec's runs, the number a positive
control's `model.reinit_positions_from` is set to."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import yaml
from transformers import AutoTokenizer

from posbias.config import RESOURCES

from helpers import tiny_config

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("longest_window", ROOT / "reproductions" / "longest_window.py")
lw = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lw)

QUESTIONS = [("q1", "Who wrote the letter?", "The letter was written by Ada in the spring.", "Ada"),
             ("q2", "Where did the long and winding road through the hills finally end up?",
              "It ended at the sea, after many miles of hills and valleys and small towns.", "the sea"),
             ("q3", "When?", "In May.", "May")]


def _squad(path: Path) -> Path:
    paras = [{"context": c, "qas": [{"id": i, "question": q, "answers": [{"text": a, "answer_start": c.index(a)}]}]}
             for i, q, c, a in QUESTIONS]
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": paras}]}), encoding="utf-8")
    return path


def test_it_prints_the_longest_window_the_tokenizer_gives(tmp_path, capsys):
    """Three one-window questions: the longest is [CLS] question [SEP] context [SEP] of the second, as
    the tokenizer itself counts it; the first seed of each method, one line for the shared data."""
    train = _squad(tmp_path / "train.json")
    cfg = tiny_config(tmp_path, data={"train_file": str(train), "eval_file": None})
    spec = {"name": "t", "base": "tiny", "overrides": {"data": cfg["data"], "model": {"reinit_positions_from": 20}},
            "methods": {"baseline": {}, "rp": {"perturb": [{"name": "random_padding"}]}}, "seeds": [1, 2],
            "output_dir": str(tmp_path / "exp")}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    tok = AutoTokenizer.from_pretrained(str(RESOURCES / "tiny_tokenizer"))
    want = max(len(tok(q, c)["input_ids"]) for _, q, c, _ in QUESTIONS)
    assert want == len(tok(QUESTIONS[1][1], QUESTIONS[1][2])["input_ids"]) > 20  # past the spec's own reinit
    assert lw.main([str(path)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [f"baseline/seed1, rp/seed1: 3 training windows, the longest {want} tokens (ids 0-{want - 1}); "
                   + out[0].split("; ", 1)[1]]
    assert lw.main([str(path), "--only", "rp/seed2"]) == 0
    assert capsys.readouterr().out.startswith(f"rp/seed2: 3 training windows, the longest {want} tokens")


def test_train_file_stands_in_for_the_specs(tmp_path, capsys):
    """--train-file: the data pack.sh builds before it is gzipped, read in place of the spec's."""
    paras = [{"context": c, "qas": [{"id": i, "question": q, "answers": [{"text": a, "answer_start": c.index(a)}]}]}
             for i, q, c, a in QUESTIONS[:1]]
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": paras}]}), encoding="utf-8")
    cfg = tiny_config(tmp_path, data={"train_file": str(_squad(tmp_path / "train.json")), "eval_file": None})
    spec = {"name": "t", "base": "tiny", "overrides": {"data": cfg["data"]}, "methods": {"baseline": {}},
            "seeds": [1], "output_dir": str(tmp_path / "exp")}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    tok = AutoTokenizer.from_pretrained(str(RESOURCES / "tiny_tokenizer"))
    want = len(tok(QUESTIONS[0][1], QUESTIONS[0][2])["input_ids"])
    assert lw.main([str(path), "--train-file", str(other)]) == 0
    assert capsys.readouterr().out.startswith(f"baseline/seed1: 1 training window, the longest {want} tokens")
