"""Tagging model: an encoder (any local Hugging Face checkpoint or one built from a config, BERT,
ELECTRA, ERNIE, RoBERTa, RoFormer, GPT-2, BLOOM, ...) + a linear token head; loading of Hugging Face
`*ForTokenClassification` folders; export to AutoModelForTokenClassification.

Shape legend: b batch, s sequence, d hidden, c labels.
"""
from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from ..checkpoint import EXPORT_SETTINGS, export_config, load_checkpoint, read_export_settings, write_export_settings
from ..encoders import (EncoderInputs, check_vocab_fits, encoder_from_config, from_pretrained_quietly,
                        hf_prediction_head, hf_task_model, load_encoder, position_ids, quiet_transformers)
from ..errors import ConfigError
from ..parity import check_forwards, check_parity
from ..precision import full_precision, to_float
from .features import IGNORE
from .inputs import tagging_tokenizer


class TaggerModel(nn.Module):
    """encoder + dropout + Linear(d, c); `forward(batch, targets=None)` returns logits (b, s, c) and,
    given targets {"labels": (b, s)}, the mean cross-entropy over labelled tokens (HF's
    *ForTokenClassification loss).

    `prediction_head`: a Hugging Face task model's own module between its encoder and its
    classifier (ModernBERT's dense + GELU + LayerNorm `head`), taken as is from an imported folder
    or a model in memory; posbias's own taggers have none (no state_dict key, as before)."""

    head_name = "linear"
    label_source: str | None = None
    """Where the label names came from, when not from posbias's training (an imported folder's
    config.json): errors about the names point there."""

    def __init__(self, encoder: nn.Module, labels: list[str], scheme: str, dropout: float | None = None,
                 prediction_head: nn.Module | None = None):
        super().__init__()
        self.encoder = encoder
        self.prediction_head = prediction_head
        self.labels = list(labels)
        self.scheme = scheme
        if dropout is None:  # as HF: classifier_dropout if set, else the encoder's hidden dropout
            config = encoder.config
            dropout = getattr(config, "classifier_dropout", None)
            if dropout is None:
                dropout = getattr(config, "hidden_dropout_prob", getattr(config, "hidden_dropout", 0.1))
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(encoder.config.hidden_size, len(labels))
        std = getattr(encoder.config, "initializer_range", None)
        if std is not None:  # as transformers initialises *ForTokenClassification heads
            nn.init.normal_(self.classifier.weight, std=std)
            nn.init.zeros_(self.classifier.bias)
        self._inputs = EncoderInputs(encoder, use_token_types=False)  # one segment: the encoder's default
        self.position_base, self.position_pad = self._inputs.base, self._inputs.pad

    def position_ids(self, attention_mask: torch.Tensor) -> torch.Tensor:
        """(b, s) positions counted over real tokens only, so left padding does not shift them."""
        return position_ids(attention_mask, self.position_base, self.position_pad)

    def forward(self, batch: dict, targets: dict | None = None) -> dict:
        hidden = self._inputs(self.encoder, batch)  # (b, s, d)
        if self.prediction_head is not None:
            hidden = self.prediction_head(hidden)  # (b, s, d)
        # Under autocast only the encoder runs in low precision; the classifier, loss and argmax see
        # fp32 (`posbias.precision`).
        with full_precision(hidden):
            logits = self.classifier(self.dropout(to_float(hidden)))  # (b, s, c)
            out = {"logits": logits}
            if targets is not None:
                out["loss"] = F.cross_entropy(logits.flatten(0, 1), targets["labels"].flatten(), ignore_index=IGNORE)
        return out

    def meta(self) -> dict:
        """What a checkpoint needs, besides the config, to rebuild this model."""
        return {"head": self.head_name, "labels": self.labels, "scheme": self.scheme,
                "dropout": self.dropout.p}


def build_model(mcfg, tokenizer, labels: list[str], scheme: str) -> TaggerModel:
    """A fresh model for training: pretrained encoder weights (or random from `model.encoder`)."""
    encoder = load_encoder(mcfg, tokenizer)
    return TaggerModel(encoder, labels, scheme, dropout=mcfg.head_options.get("dropout"))


def model_from_checkpoint(path: str, cfg, meta: dict):
    """(model with random weights, tokenizer) shaped as the posbias checkpoint in `path`."""
    from transformers import AutoConfig

    tokenizer = tagging_tokenizer(path, as_saved=True)
    encoder = encoder_from_config(AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=False))
    return TaggerModel(encoder, meta["labels"], meta["scheme"], dropout=meta.get("dropout")), tokenizer


_PLACEHOLDER = re.compile(r"LABEL_[0-9]+")


def generic_label_names(labels: list[str]) -> bool:
    """Whether every label is transformers' placeholder `LABEL_<i>`: the id2label of a config that
    never set one, which names no tag (scored on tagged data, every tag would look foreign)."""
    return bool(labels) and all(isinstance(t, str) and _PLACEHOLDER.fullmatch(t) for t in labels)


def scheme_of_labels(labels: list[str]) -> str:
    """`bioes`, `iob2` or `none`, from a label list's prefixes (for Hugging Face folders)."""
    prefixes = {t.split("-", 1)[0] for t in labels if "-" in t and t.split("-", 1)[0] in "BIES"}
    if prefixes & {"E", "S"}:
        return "bioes"
    if prefixes and all(t == "O" or ("-" in t and t[0] in "BI") for t in labels):
        return "iob2"
    return "none"


def load_hf_tagger(path: str, config):
    """A Hugging Face AutoModelForTokenClassification folder as (TaggerModel, tokenizer, run config);
    labels from its config's id2label, the scheme from their prefixes. A few check sentences must
    give the folder's own logits (`check_hf_parity`); else the folder is refused."""
    from transformers import AutoModelForTokenClassification

    hf = from_pretrained_quietly(AutoModelForTokenClassification, path, "checkpoint")
    classifier = getattr(hf, "classifier", None)
    if not isinstance(classifier, nn.Linear):
        raise ConfigError(f"{path}: {type(hf).__name__} has no linear `classifier` layer; only linear token "
                          "heads can be imported")
    labels = [config.id2label[i] for i in range(config.num_labels)]
    source = str(Path(path) / "config.json")
    # A folder posbias exported keeps the model's own label names and scheme (its config.json has
    # HF-groupable names, `hf_label_names`) and its windows (`export_hf`); others get the defaults.
    settings = read_export_settings(path, "tagging")
    saved = settings.get("model", {})
    if "labels" in saved:
        source = str(Path(path) / EXPORT_SETTINGS)
        labels, scheme = saved["labels"], saved.get("scheme")
        named = isinstance(labels, list) and all(isinstance(t, str) for t in labels)
        if not (named and len(labels) == config.num_labels):
            raise ConfigError(f"{source}: model.labels must be a list of {config.num_labels} label names (the "
                              f"classifier's outputs), got {labels!r:.80}")
        if scheme not in ("bioes", "iob2", "none"):
            raise ConfigError(f"{source}: model.scheme must be bioes, iob2 or none, got {scheme!r}")
    else:
        scheme = scheme_of_labels(labels)
    encoder = getattr(hf, hf.base_model_prefix)
    model = TaggerModel(encoder, labels, scheme, prediction_head=hf_prediction_head(hf))
    model.label_source = source
    model.classifier.load_state_dict(classifier.state_dict())
    cfg = export_config(path, "tagging", settings, ("data",))
    tokenizer = tagging_tokenizer(path)
    check_vocab_fits(tokenizer, encoder, path)  # before the check's forwards index the table
    check_hf_parity(model, hf, tokenizer, path)
    return model, tokenizer, cfg


# Check sentences for parity with a Hugging Face token-classification model: short, of different
# lengths, so that the batch holds padding.
PARITY_SENTENCES = (
    ["Ada", "Lovelace", "wrote", "the", "first", "program", "in", "London", "."],
    ["The", "river", "runs", "to", "the", "sea", "."],
    ["Hello"],
)


def check_hf_parity(model: TaggerModel, hf, tokenizer, source, *, exporting: bool = False) -> None:
    """Refuse (`posbias.parity.check_parity`) when `model`'s token logits differ from the Hugging
    Face token-classification model `hf`'s on `PARITY_SENTENCES` (right-padded into one batch), at
    every real token."""
    rows = [tokenizer(words, is_split_into_words=True)["input_ids"] for words in PARITY_SENTENCES]
    s = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), s), tokenizer.pad_token_id, dtype=torch.long)  # (b, s)
    mask = torch.zeros((len(rows), s), dtype=torch.long)  # (b, s)
    for i, r in enumerate(rows):  # right padding: HF's default position ids then equal posbias's
        input_ids[i, :len(r)] = torch.tensor(r)
        mask[i, :len(r)] = 1
    real = mask.bool()
    with check_forwards(source, model, hf):
        ours = model({"input_ids": input_ids, "attention_mask": mask})["logits"]
        theirs = hf(input_ids=input_ids, attention_mask=mask).logits
    check_parity(source, hf, [(ours[real], theirs[real])], exporting=exporting)


def tagger_view(hf_model, labels: list[str] | None = None) -> TaggerModel:
    """A TaggerModel over a Hugging Face *ForTokenClassification model in memory, sharing (not
    copying) its encoder, its pre-classifier head if it has one (ModernBERT) and its linear
    classifier: posbias's evaluations of a model being trained by a user's own Trainer
    (`posbias.hf`). Labels default to the config's id2label."""
    classifier = getattr(hf_model, "classifier", None)
    if not isinstance(classifier, nn.Linear):
        raise ConfigError(f"{type(hf_model).__name__} has no linear `classifier` layer; only linear token heads "
                          "can be evaluated")
    config = hf_model.config
    source = "labels" if labels is not None else "model.config"
    labels = list(labels) if labels is not None else [config.id2label[i] for i in range(config.num_labels)]
    if len(labels) != classifier.out_features:
        raise ConfigError(f"{len(labels)} label names for a classifier of {classifier.out_features} outputs")
    with torch.random.fork_rng(devices=[]):  # building the view must not move the trainer's RNG
        view = TaggerModel(getattr(hf_model, hf_model.base_model_prefix), labels, scheme_of_labels(labels),
                           dropout=0.0, prediction_head=hf_prediction_head(hf_model))
    view.classifier = classifier
    view.label_source = source
    return view


def hf_label_names(labels: list[str], scheme: str) -> list[str]:
    """Label names transformers' entity grouping understands: BIOES's `S-X` becomes `B-X` and `E-X`
    becomes `I-X` (a single-token entity starts and ends at once; an end continues its entity), so
    `pipeline("token-classification", aggregation_strategy="simple")` groups an exported BIOES
    tagger's entities. Every argmax keeps a valid name: only names change, never the outputs."""
    if scheme != "bioes":
        return list(labels)
    rename = {"S": "B", "E": "I"}
    return [f"{rename[t[0]]}{t[1:]}" if t[:2] in ("S-", "E-") else t for t in labels]


EXPORTED_KEYS = {"data": ("max_seq_len", "stride", "label_subtokens", "label_scheme", "tag")}
"""The run config keys an exported folder carries (`posbias.checkpoint.EXPORT_SETTINGS`): its windows,
which sub-token a word's label sits on, the label scheme and the tag column it learned."""


def export_hf(checkpoint, out_dir) -> Path:
    """Turn a posbias tagging checkpoint into an AutoModelForTokenClassification folder: labels in its
    config's id2label / label2id (BIOES names made groupable by `hf_label_names`), the model's own
    label names, scheme and windows (`EXPORTED_KEYS`) in posbias.json, which posbias reads back."""
    from transformers import AutoModelForTokenClassification

    model, tokenizer, cfg = load_checkpoint(checkpoint, task="tagging")
    names = hf_label_names(model.labels, model.scheme)
    label2id = {}
    for i, t in enumerate(names):  # B-X and S-X share a name now: the first id stands for it
        label2id.setdefault(t, i)
    hf = hf_task_model(AutoModelForTokenClassification, model.encoder, checkpoint, num_labels=len(model.labels),
                       id2label=dict(enumerate(names)), label2id=label2id)
    if not isinstance(getattr(hf, "classifier", None), nn.Linear):
        raise ConfigError(f"{type(hf).__name__} has no linear `classifier` layer to take the token head")
    if hf_prediction_head(hf) is not None and model.prediction_head is None:
        raise ConfigError(f"{checkpoint}: {type(hf).__name__} puts its own `head` (dense + norm) between the encoder "
                          "and the classifier, which this tagger was not trained with: it cannot be exported "
                          "(evaluate it with posbias instead)")
    hf.classifier.load_state_dict(model.classifier.state_dict())
    check_hf_parity(model, hf, tokenizer, checkpoint, exporting=True)  # any other difference in the task class
    out = Path(out_dir)
    with quiet_transformers():  # no "Writing model shards" bar
        hf.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    write_export_settings(out, cfg, EXPORTED_KEYS, {"labels": model.labels, "scheme": model.scheme})
    return out
