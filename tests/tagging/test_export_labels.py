"""An exported BIOES tagger: label names Hugging Face's entity grouping understands, while posbias
reading the folder back still knows the model's own names and scheme."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import posbias
from posbias.config import build_config
from posbias.tagging.model import hf_label_names

WORDS = ["Ada", "Lovelace", "wrote", "in", "London"]
WANTED = ["B-person", "E-person", "O", "O", "S-location"]  # the model's own (BIOES) tags


def test_hf_label_names_rename_only_bioes_singles_and_ends():
    bioes = ["O", "B-PER", "I-PER", "E-PER", "S-PER", "S-LOC"]
    assert hf_label_names(bioes, "bioes") == ["O", "B-PER", "I-PER", "I-PER", "B-PER", "B-LOC"]
    assert hf_label_names(["O", "B-X", "I-X"], "iob2") == ["O", "B-X", "I-X"]
    assert hf_label_names(["NOUN", "S-VERB"], "none") == ["NOUN", "S-VERB"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny BIOES tagger trained one step, exported, its classifier then set (least squares on the
    folder's own hidden states) to tag WORDS as WANTED."""
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    root = tmp_path_factory.mktemp("bioes")
    cfg = build_config({"task": "tagging",
                        "model": {"name_or_path": None, "tokenizer": "tiny",
                                  "encoder": {"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 2,
                                              "num_attention_heads": 4, "intermediate_size": 64}},
                        "data": {"train_file": "demo:wnut-train", "eval_file": "demo:wnut-dev", "max_seq_len": 64,
                                 "stride": 16, "max_train_examples": 16, "max_eval_examples": 8,
                                 "label_scheme": "bioes"},
                        "train": {"output_dir": str(root / "run"), "max_steps": 1, "batch_size": 8,
                                  "eval_batch_size": 8, "device": "cpu"}})
    posbias.train(cfg, progress=False)
    out = posbias.export(root / "run" / "best", root / "hf")
    settings = json.loads((out / "posbias.json").read_text(encoding="utf-8"))
    labels = settings["model"]["labels"]
    tok = AutoTokenizer.from_pretrained(str(out))
    hf = AutoModelForTokenClassification.from_pretrained(str(out)).eval()
    enc = tok(" ".join(WORDS), return_tensors="pt")  # as the pipeline tokenizes the text
    with torch.no_grad():
        hidden = hf.bert(**enc).last_hidden_state[0].double()  # (s, d)
    target = torch.full((hidden.shape[0], len(labels)), -10.0, dtype=torch.float64)  # (s, c)
    previous = None
    for i, word in enumerate(enc.word_ids()):
        tag = "O" if word is None else WANTED[word]
        if word is not None and word == previous and tag != "O":  # a word's later sub-tokens continue it
            tag = "I-" + tag.split("-", 1)[1]
        target[i, labels.index(tag)] = 10.0
        previous = word
    ones = torch.ones(hidden.shape[0], 1, dtype=torch.float64)
    w = torch.linalg.lstsq(torch.cat([hidden, ones], 1), target).solution  # (d + 1, c)
    weights = load_file(str(out / "model.safetensors"))
    weights["classifier.weight"] = w[:-1].T.float().contiguous()
    weights["classifier.bias"] = w[-1].float().contiguous()
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out, settings


def test_the_exported_names_group_in_the_token_classification_pipeline(exported):
    from transformers import pipeline

    out, settings = exported
    assert settings["model"]["scheme"] == "bioes" and "S-location" in settings["model"]["labels"]
    config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    assert not any(t.startswith(("S-", "E-")) for t in config["id2label"].values())
    tagger = pipeline("token-classification", model=str(out), aggregation_strategy="simple")
    text = " ".join(WORDS)
    got = [(e["entity_group"], text[e["start"]:e["end"]]) for e in tagger(text)]
    assert got == [("person", "Ada Lovelace"), ("location", "London")]


def test_posbias_reads_the_exported_folder_back_as_bioes(exported):
    out, _ = exported
    res = posbias.predict(out, text=" ".join(WORDS))
    (first,) = res.values()
    assert first["tags"] == WANTED
    assert [(e["type"], e["text"]) for e in first["entities"]] == [("person", "Ada Lovelace"), ("location", "London")]
