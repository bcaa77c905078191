"""examples/: the two Hugging Face Trainer scripts run on a tiny random BERT for a few steps, and the
posbias perturbation reaches the model's forward (shifted position ids, packed rows); they take the
CLI's data names, show their whole docstring in --help, and fail on bad input in one line, exit 2."""
import functools
import importlib.util
import json
import re
import warnings
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, BertForQuestionAnswering, BertForTokenClassification

from posbias.config import RESOURCES

from helpers import DEMO_DEV, DEMO_TRAIN

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
WNUT_DEV = str(RESOURCES / "tagging_demo" / "wnut-dev.conll.gz")


def _example(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny_encoder(tiny_bert_folder):
    return tiny_bert_folder


def _record_forward(monkeypatch, cls):
    """Record the inputs every training forward of `cls` receives (signature kept for the Trainer)."""
    seen = []
    original = cls.forward

    @functools.wraps(original)
    def forward(self, *args, **kwargs):
        if self.training:
            seen.append({k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor)})
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, "forward", forward)
    return seen


def _run(main, argv):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return main(argv)


@pytest.mark.parametrize("method", ["rpp", "cp", "none"])
def test_hf_ner_example(tiny_encoder, tmp_path, monkeypatch, method):
    seen = _record_forward(monkeypatch, BertForTokenClassification)
    out = tmp_path / "ner"
    metrics = _run(_example("hf_ner_trainer").main,
                   ["--model", tiny_encoder, "--train", "demo:wnut-train", "--dev", "demo:wnut-dev", "--out", str(out),
                    "--method", method, "--max-steps", "3", "--batch-size", "8", "--k-max", "2", "--max-length", "64"])
    assert len(seen) == 3 and (out / "model.safetensors").is_file()
    assert {"eval_loss", "eval_f1_alpha_1", "dev_f1"} <= set(metrics)
    sep = AutoTokenizer.from_pretrained(tiny_encoder).sep_token_id
    for batch in seen:
        b = batch["input_ids"].shape[0]
        if method == "rpp":  # augment: 8 clean rows at 0.., 8 rows shifted past [CLS]
            pos = batch["position_ids"]
            assert b == 16 and (pos[:8, 1] == 1).all() and (pos[8:, 1] > 1).any()
        elif method == "cp":  # augment: 8 clean rows, then 8 packed rows of several sentences
            assert b == 16 and "position_ids" not in batch
            assert ((batch["input_ids"][8:] == sep).sum(-1) > 1).any()
            # M defaults to 128 tokens (a CPU's length), not the model's 512-position table
            assert batch["attention_mask"][8:].sum(-1).max() <= 128
        else:
            assert b == 8 and "position_ids" not in batch



@pytest.mark.parametrize("authors", [False, True])
def test_hf_ner_example_authors_labels(tiny_encoder, tmp_path, monkeypatch, authors):
    """--bioes --label-all-tokens (the token-classification authors' settings): the model learns IOBES
    labels on every sub-token of a word; without them, IOB2 labels on first sub-tokens only. --k-max 0
    skips F1(alpha)."""
    seen = _record_forward(monkeypatch, BertForTokenClassification)
    out = tmp_path / "ner"
    flags = ["--bioes", "--label-all-tokens"] if authors else []
    metrics = _run(_example("hf_ner_trainer").main,
                   ["--model", tiny_encoder, "--train", "demo:wnut-train", "--dev", "demo:wnut-dev", "--out", str(out),
                    "--method", "none", "--max-steps", "2", "--batch-size", "8", "--k-max", "0", "--max-length", "64"]
                   + flags)
    assert not any("alpha" in k for k in metrics) and "dev_f1" in metrics
    labels = json.loads((out / "config.json").read_text())["id2label"].values()
    assert any(t.startswith(("S-", "E-")) for t in labels) == authors
    tok = AutoTokenizer.from_pretrained(tiny_encoder)
    inner = 0  # sub-tokens after a word's first
    for batch in seen:
        for ids, lab in zip(batch["input_ids"].tolist(), batch["labels"].tolist()):
            pieces = tok.convert_ids_to_tokens(ids)
            for piece, y in zip(pieces, lab):
                if piece.startswith("##"):
                    inner += 1
                    assert (y != -100) == authors, (piece, y)
                elif piece in (tok.cls_token, tok.sep_token, tok.pad_token):
                    assert y == -100
    assert inner > 0

def test_hf_qa_example(tiny_encoder, tmp_path, monkeypatch):
    seen = _record_forward(monkeypatch, BertForQuestionAnswering)
    out = tmp_path / "qa"
    metrics = _run(_example("hf_qa_trainer").main,
                   ["--model", tiny_encoder, "--train", DEMO_TRAIN, "--dev", DEMO_DEV, "--out", str(out),
                    "--max-steps", "3", "--batch-size", "4", "--max-length", "128", "--stride", "32"])
    assert len(seen) == 3 and 0 <= metrics["f1"] <= 100
    for batch in seen:  # Random Padding: every token after [CLS] moved by k ~ U{0 .. 128 - m}
        pos, mask = batch["position_ids"], batch["attention_mask"]
        assert (pos[:, 0] == 0).all() and (pos[:, 1] >= 1).all() and int(pos.max()) < 128
        assert batch["start_positions"].shape == (4,)
    assert any((b["position_ids"][:, 1] > 1).any() for b in seen)
    diagnosis = json.loads((out / "diagnosis" / "diagnosis.json").read_text(encoding="utf-8"))
    assert diagnosis


@pytest.mark.parametrize("name", ["hf_ner_trainer", "hf_qa_trainer"])
def test_example_help_shows_the_whole_docstring(name, capsys):
    module = _example(name)
    with pytest.raises(SystemExit) as done:
        module.main(["--help"])
    assert done.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())
    for line in module.__doc__.strip().splitlines():  # every line, the usage's shell continuations too
        assert " ".join(line.split()) in shown
    for option in re.findall(r"add_argument\(\"(--[\w-]+)\"[^)]*\bhelp=", Path(module.__file__).read_text()):
        assert option in shown


@pytest.mark.parametrize("name,argv,said", [
    ("hf_ner_trainer", ["--train", "missing.conll"], "missing.conll: cannot read file"),
    ("hf_ner_trainer", ["--dev", "demo:wnut-tset"], "no bundled data set 'demo:wnut-tset'"),
    ("hf_ner_trainer", ["--model", "no/such/folder"], "--model: 'no/such/folder' is not a model folder"),
    ("hf_qa_trainer", ["--dev", "missing.json"], "missing.json: cannot read file"),
    ("hf_qa_trainer", ["--model", "EMPTY"], "holds no config.json"),
])
def test_example_bad_input_is_one_line_exit_2(name, argv, said, tiny_encoder, tmp_path, capsys):
    """Checked before any training: a missing file, an unknown bundled name, a folder without a model."""
    data = {"hf_ner_trainer": ("demo:wnut-train", "demo:wnut-dev"), "hf_qa_trainer": ("demo:train", "demo:dev")}[name]
    args = {"--model": tiny_encoder, "--train": data[0], "--dev": data[1], "--out": str(tmp_path / "out")}
    args.update(zip(argv[::2], argv[1::2]))
    if args["--model"] == "EMPTY":
        args["--model"] = str(tmp_path)
    rc = _example(name).run([x for kv in args.items() for x in kv] + ["--max-steps", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith(f"{name}.py: error: ") and said in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()
