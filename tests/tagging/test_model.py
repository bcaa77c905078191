"""The tagger on every listed architecture: trains two steps, evaluates, saves, reloads, exports."""
import json

import numpy as np
import pytest
import torch

import posbias
from posbias.config import build_config

from helpers import relative_error

# Tiny configs of the paper's encoders (APE: BERT, ELECTRA, ERNIE, RoBERTa, GPT-2; RoPE: RoFormer;
# ALiBi: BLOOM), each with a tokenizer whose vocabulary it fits.
SMALL = {"num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64}
ARCHITECTURES = {
    "bert": ("tiny", {"model_type": "bert", "hidden_size": 32, **SMALL}),
    "electra": ("tiny", {"model_type": "electra", "hidden_size": 32, "embedding_size": 32, **SMALL}),
    "ernie": ("tiny", {"model_type": "ernie", "hidden_size": 32, **SMALL}),
    "roformer": ("tiny", {"model_type": "roformer", "hidden_size": 32, **SMALL}),
    "roberta": ("tiny-bpe-roberta", {"model_type": "roberta", "hidden_size": 32, "max_position_embeddings": 514,
                                     **SMALL}),
    "gpt2": ("tiny-bpe-gpt2", {"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 4, "bos_token_id": 0,
                               "eos_token_id": 0}),
    "bloom": ("tiny-bpe-gpt2", {"model_type": "bloom", "hidden_size": 32, "n_layer": 2, "n_head": 4,
                                "bos_token_id": 0, "eos_token_id": 0}),
}


def tagging_config(tmp_path, arch="bert", **sections):
    tok, enc = ARCHITECTURES[arch]
    d = {"task": "tagging",
         "model": {"name_or_path": None, "tokenizer": tok, "encoder": dict(enc)},
         "data": {"train_file": "demo:wnut-train", "eval_file": "demo:wnut-dev", "max_seq_len": 64, "stride": 16,
                  "max_train_examples": 64, "max_eval_examples": 40},
         "train": {"output_dir": str(tmp_path / "run"), "max_steps": 2, "batch_size": 16, "lr": 1e-3,
                   "log_every": 1, "eval_batch_size": 32}}
    for k, v in sections.items():
        d[k] = {**d.get(k, {}), **v}
    return build_config(d)


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_each_architecture_trains_two_steps_and_evaluates(tmp_path, arch):
    summary = posbias.train(tagging_config(tmp_path, arch), progress=False)
    assert summary["steps"] == 2 and summary["metric"] == "f1"
    ev = summary["eval"]
    assert ev["sentences"] == 40 and ev["scheme"] == "iob2" and 0 <= ev["f1"] <= 100
    log = [json.loads(x) for x in (tmp_path / "run" / "train_log.jsonl").read_text(encoding="utf-8").splitlines()]
    assert all(np.isfinite(r["loss"]) for r in log)
    # The saved checkpoint reloads and scores the same numbers.
    again = posbias.evaluate(tmp_path / "run" / "best", "demo:wnut-dev", overrides=["data.max_eval_examples=40"])
    assert again["f1"] == pytest.approx(ev["f1"]) and again["predicted_entities"] == ev["predicted_entities"]


def test_pos_tagging_on_ud_ewt(tmp_path):
    cfg = tagging_config(tmp_path, data={"train_file": "demo:ewt-train", "eval_file": "demo:ewt-dev"})
    summary = posbias.train(cfg, progress=False)
    ev = summary["eval"]
    assert summary["metric"] == "accuracy" and ev["scheme"] == "none" and 0 <= ev["accuracy"] <= 100
    assert "NOUN" in ev["per_class"] and "macro_f1" in ev
    info = json.loads((tmp_path / "run" / "run_info.json").read_text(encoding="utf-8"))
    assert "NOUN" in info["labels"] and "O" not in info["labels"]


@pytest.mark.parametrize("kind", ["relative_key", "relative_key_query"])
def test_relative_position_encoders_train_and_reload(tmp_path, kind):
    cfg = tagging_config(tmp_path, model={"position_embedding_type": kind})
    summary = posbias.train(cfg, progress=False)
    from posbias.checkpoint import load_checkpoint

    model, _, _ = load_checkpoint(tmp_path / "run" / "best")
    assert model.encoder.config.position_embedding_type == kind
    assert any("distance_embedding" in k for k in model.state_dict())
    again = posbias.evaluate(tmp_path / "run" / "best", "demo:wnut-dev", overrides=["data.max_eval_examples=40"])
    assert again["f1"] == pytest.approx(summary["eval"]["f1"])
    with pytest.raises(posbias.errors.ConfigError, match="cannot be exported"):
        posbias.export(tmp_path / "run" / "best", tmp_path / "hf")


def _logits_error(ours, theirs, batch, **kw) -> float:
    with torch.no_grad():
        mine = ours(batch)["logits"]
        hf = theirs(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], **kw).logits
    real = batch["attention_mask"].bool()
    return relative_error(mine[real], hf[real])


@pytest.mark.parametrize("arch", ["bert", "roberta", "gpt2"])
def test_export_round_trip(tmp_path, arch):
    """posbias checkpoint -> AutoModelForTokenClassification: same logits (float64), labels in the
    config; the exported folder evaluates in posbias to the same metrics."""
    from transformers import AutoModelForTokenClassification

    from posbias.checkpoint import load_checkpoint
    from posbias.tagging.collate import collate
    from posbias.tagging.evaluate import eval_features
    from posbias.tagging.inputs import read_for
    from posbias.tagging.model import hf_label_names

    cfg = tagging_config(tmp_path, arch)
    summary = posbias.train(cfg, progress=False)
    out = posbias.export(tmp_path / "run" / "best", tmp_path / "hf")
    hf, info = AutoModelForTokenClassification.from_pretrained(str(out), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    ours, tok, mcfg = load_checkpoint(tmp_path / "run" / "best")
    # BIOES names made groupable by HF's pipelines (S- -> B-, E- -> I-); posbias.json keeps the model's own
    assert [hf.config.id2label[i] for i in range(hf.config.num_labels)] == hf_label_names(ours.labels, ours.scheme)
    ds = read_for("demo:wnut-dev", mcfg)
    feats = eval_features(ds.examples[:12], tok, mcfg, ds.path)
    batch = collate(feats, np.arange(len(feats)), pad_id=tok.pad_token_id, padding_side=tok.padding_side)
    ours.eval().double()
    hf.eval().double()
    assert _logits_error(ours, hf, batch) < 1e-10
    # The comparison can fail: a classifier off by a little is caught.
    with torch.no_grad():
        hf.classifier.bias += 1e-3
    assert _logits_error(ours, hf, batch) > 1e-6
    # (A Hugging Face folder carries no window settings: give it the run's.)
    again = posbias.evaluate(out, "demo:wnut-dev", overrides=["data.max_eval_examples=40", "data.max_seq_len=64",
                                                              "data.stride=16"])
    assert again["f1"] == pytest.approx(summary["eval"]["f1"])


def test_hf_folder_loads_as_a_tagger(tmp_path):
    """Any Hugging Face *ForTokenClassification folder evaluates here; its labels come from id2label."""
    from transformers import AutoConfig, AutoModelForTokenClassification, AutoTokenizer

    from posbias.config import RESOURCES

    labels = ["O", "B-person", "I-person", "B-location", "I-location"]
    config = AutoConfig.for_model("bert", vocab_size=4994, hidden_size=32, **SMALL,
                                  id2label=dict(enumerate(labels)), label2id={t: i for i, t in enumerate(labels)})
    torch.manual_seed(0)
    AutoModelForTokenClassification.from_config(config).save_pretrained(str(tmp_path / "hf"))
    AutoTokenizer.from_pretrained(str(RESOURCES / "tiny_tokenizer")).save_pretrained(str(tmp_path / "hf"))
    res = posbias.evaluate(tmp_path / "hf", "demo:wnut-dev", tmp_path / "ev")
    assert res["scheme"] == "iob2" and res["sentences"] == 150
    assert (tmp_path / "ev" / "predictions.conll").is_file() and (tmp_path / "ev" / "run_info.json").is_file()
