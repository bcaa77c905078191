"""Run a tagger over windows, read each word's prediction at its first sub-token, score, write files.

Used by training (periodic evaluation, through `posbias.tagging.task`) and by
`posbias evaluate/predict tagging`.
"""
from __future__ import annotations

import json
import re
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from ..batching import eval_batches, move
from ..config import resolve_path
from ..errors import ConfigError, DataError
from ..evaluation import evaluate_file, opened_for_eval, write_run_meta
from ..hf_datasets import is_hf_dataset
from ..outputs import staged_output
from ..utils import atomic_write_json, atomic_write_text, interactive
from . import columns, metrics
from .collate import collate
from .conll import read_conll, word_rows
from .examples import TaggingDataset, TaggingExample
from .features import TaggingFeatures, build_tagging_features, learns_word_labels
from .inputs import read_for
from .model import generic_label_names
from .schemes import convert, parse_tag

# What a NaN-logits error calls a model evaluated without a path (training's periodic evaluation).
MODEL_NAME = "the model being evaluated"
WORD = re.compile(r"\w+|[^\w\s]", re.UNICODE)  # raw text -> words (runs of word characters, or punctuation)


def eval_features(examples: list[TaggingExample], tokenizer, cfg, source: str) -> TaggingFeatures:
    d = cfg.data
    return build_tagging_features(examples, tokenizer, labels=None, max_seq_len=d.max_seq_len, stride=d.stride,
                                  source=source)


def _unwrap(model):
    return getattr(model, "module", model)


def run_windows(model, features: TaggingFeatures, n_words: np.ndarray, *, pad_id: int, padding_side: str,
                batch_size: int, max_tokens: int | None = None, accelerator=None,
                progress: bool = True, subtokens: bool = False, model_name: str = MODEL_NAME):
    """Predicted label id of every word, as one flat array over the sentences' words in order.

    With an accelerator the windows are split across processes and the predictions gathered on
    every process. Each word is predicted by exactly one window (`features.predict`).
    `subtokens`: also return the predictions at every sub-token of each word in that window, as
    (word (T,), label id (T,)): T sub-tokens sorted by their flat word index, in text order.
    Logits with NaN or inf are refused in one line naming `model_name`: argmax would still pick a
    label for every word, and the F1 of a model of NaN weights would look like a finding.
    """
    rank, world = (accelerator.process_index, accelerator.num_processes) if accelerator else (0, 1)
    device = accelerator.device if accelerator else next(model.parameters()).device
    offsets = np.r_[0, np.cumsum(n_words)[:-1]]  # first flat index of each sentence's words
    out = np.full(int(n_words.sum()), -1, dtype=np.int64)
    # Longest first: similar lengths share a batch, so dynamic padding wastes little.
    order = np.argsort(-features.lengths, kind="stable")[rank::world]
    was_training = model.training
    model.eval()
    flat, labels, sub_flat, sub_labels = [], [], [], []
    with torch.inference_mode():
        for idx in tqdm(eval_batches(order, features.lengths, batch_size, max_tokens), desc="eval", leave=False,
                        disable=not progress or rank != 0 or not interactive()):
            batch = collate(features, idx, pad_id=pad_id, padding_side=padding_side)
            pick = batch["predict"]  # (b, s) bool
            # The model itself, not its DDP wrapper: a DDP forward syncs buffers with the other
            # processes, which run other numbers of batches here (none with fewer windows than processes).
            logits = _unwrap(model)(move(batch, device))["logits"]  # (b, s, c)
            if not bool(torch.isfinite(logits).all()):  # one reduction and one host sync per batch
                raise ConfigError(f"{model_name}: the model's logits are NaN or infinite (its weights hold NaN/inf, "
                                  "or its precision overflows); posbias does not decode them")
            label = logits[pick.to(device)].argmax(-1).cpu().numpy()  # (words in batch,)
            rows = np.nonzero(pick.numpy())[0]
            sent = features.example_index[idx[rows]]
            flat.append(offsets[sent] + batch["word_index"][pick].numpy())
            labels.append(label)
            if subtokens:  # every sub-token of the words this window predicts
                word, first = batch["word_index"].numpy(), pick.numpy()  # (b, s)
                own = np.stack([np.isin(w, w[f]) for w, f in zip(word, first)]) & (word >= 0)  # (b, s)
                r, c = np.nonzero(own)  # row-major: each row's tokens in text order
                sub_flat.append(offsets[features.example_index[idx[r]]] + word[r, c])
                sub_labels.append(logits.argmax(-1).cpu().numpy()[r, c])
    model.train(was_training)

    def joined(parts):
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    mine = [(joined(flat), joined(labels))] + ([(joined(sub_flat), joined(sub_labels))] if subtokens else [])
    if world > 1:
        from accelerate.utils import gather_object

        everyone = gather_object([mine])
    else:
        everyone = [mine]
    for f, lab in (m[0] for m in everyone):
        out[f] = lab
    if (out < 0).any():
        raise RuntimeError(f"{int((out < 0).sum())} words got no prediction: a windowing bug")
    if not subtokens:
        return out
    word, lab = (np.concatenate(x) for x in zip(*(m[1] for m in everyone)))
    keep = np.argsort(word, kind="stable")  # a word's sub-tokens all come from one row, in text order
    return out, (word[keep], lab[keep])


def predict_examples(model, tokenizer, cfg, examples: list[TaggingExample], *, source: str, accelerator=None,
                     progress: bool = True, subtokens: bool = False, model_name: str = MODEL_NAME):
    """Predicted tags of every sentence. `subtokens`: also, per sentence, the predicted tag at every
    sub-token and (W,) the sub-tokens of each word (`subtoken_predictions`)."""
    feats = eval_features(examples, tokenizer, cfg, source)
    n_words = np.array([len(e.words) for e in examples], dtype=np.int64)
    ran = run_windows(model, feats, n_words, pad_id=tokenizer.pad_token_id, padding_side=tokenizer.padding_side,
                      batch_size=cfg.train.eval_batch_size, max_tokens=cfg.train.eval_batch_tokens,
                      accelerator=accelerator, progress=progress, subtokens=subtokens, model_name=model_name)
    ids, (sub_word, sub_ids) = ran if subtokens else (ran, (None, None))
    names = np.array(_unwrap(model).labels, dtype=object)
    bounds = np.cumsum(n_words)[:-1]
    preds = [list(x) for x in np.split(names[ids], bounds)]
    if not subtokens:
        return preds
    counts = np.bincount(sub_word, minlength=int(n_words.sum()))  # (all words,) sub-tokens of each
    sub_bounds = np.cumsum(counts)[bounds - 1]  # sub-tokens up to each sentence's last word
    sub = [list(x) for x in np.split(names[sub_ids], sub_bounds)]
    return preds, (sub, np.split(counts, bounds))


def evaluate_dataset(model, tokenizer, cfg, dataset: TaggingDataset, out_dir=None, *, accelerator=None,
                     progress: bool = True, model_name: str = MODEL_NAME) -> dict:
    """Predict, score and (main process) write predictions.conll (word, gold, predicted) and metrics.json.

    Entities are scored in the data's own scheme (`metrics.scoring_schemes`): a BIOES model on an
    IOB2 file is scored, and its predictions written, in IOB2. Results also carry the authors' F1
    over sub-tokens (`metrics.seqeval_subtoken_f1`, seqeval's lenient mode; NER in the model's own
    label scheme, as they trained and scored IOBES): each sub-token's own prediction when the model
    learned its word's label on every sub-token (`data.label_subtokens: copy`, as the authors'; `all`
    for POS), else its word's (`features.learns_word_labels`)."""
    net = _unwrap(model)
    if (dataset.scheme == "none") != (net.scheme == "none"):
        raise ConfigError(columns.scheme_mismatch(dataset, net.labels, net.scheme))
    pos = net.scheme == "none"
    preds, (sub_preds, counts) = predict_examples(model, tokenizer, cfg, dataset.examples, source=dataset.path,
                                                  accelerator=accelerator, progress=progress, subtokens=True,
                                                  model_name=model_name)
    model_preds = preds  # in the model's labels: the sub-token F1 scores them as they are
    examples, model_gold = dataset.examples, [e.tags for e in dataset.examples]
    if not pos:
        data_scheme = dataset.file_scheme
        gold = [convert(t, dataset.scheme, data_scheme) if dataset.scheme != data_scheme else t for t in model_gold]
        if dataset.scheme != net.scheme:  # what the model was asked to predict, for the check below
            model_gold = [convert(t, dataset.scheme, net.scheme) for t in model_gold]
        gold, preds, scheme = metrics.in_scoring_scheme(gold, preds, data_scheme, net.scheme)
        examples = [TaggingExample(e.id, e.words, g, e.meta) for e, g in zip(examples, gold)]
    else:
        gold, scheme = model_gold, "none"
    result = metrics.score(gold, preds, scheme)
    if scheme != net.scheme:
        result["label_scheme"] = net.scheme  # the model's labels, mapped back for scoring
    sub_gold = metrics.subtoken_sequences(model_gold, counts)
    own = learns_word_labels(getattr(getattr(cfg, "data", None), "label_subtokens", "first"), net.scheme)
    result[metrics.SUBTOKEN_F1] = metrics.seqeval_subtoken_f1(
        sub_gold, sub_preds if own else metrics.subtoken_sequences(model_preds, counts), net.scheme)
    result["subtoken_predictions"] = "own" if own else "word"
    result["subtokens"] = int(sum(len(s) for s in sub_gold))
    if not pos:
        result["subtoken_scheme"] = net.scheme
    result["skipped_records"] = len(dataset.skipped)
    unknown = sorted({t for s in model_gold for t in s} - set(net.labels))
    if unknown:
        result["gold_tags_unknown_to_model"] = unknown
    metrics.check_ranges(result)
    if out_dir is not None and (accelerator is None or accelerator.is_main_process):
        write_predictions(out_dir, examples, preds)
        atomic_write_json(Path(out_dir) / "metrics.json", result)
    return result


def write_predictions(out_dir, examples: list[TaggingExample], preds: list[list[str]]) -> None:
    """predictions.conll: `word gold predicted` per line (or `word predicted` without gold), a blank
    line between sentences — `posbias score tagging` reads it back."""
    lines = []
    for e, p in zip(examples, preds):
        for k, (w, t) in enumerate(zip(e.words, p)):
            lines.append(f"{w}\t{e.tags[k]}\t{t}" if e.tags is not None else f"{w}\t{t}")
        lines.append("")
    atomic_write_text(Path(out_dir) / "predictions.conll", "\n".join(lines) + "\n")


def _generic_names(dataset, labels, scheme, label_map, label_source, front) -> str | None:
    """The error for a model whose labels are transformers' placeholders (LABEL_0, ...) on data
    whose tags they cannot name, or None."""
    if not generic_label_names(labels):
        return None
    data_tags = set(columns.file_tags(dataset))
    per_word = dataset.scheme == "none"
    if per_word and {str((label_map or {}).get(t, t)) for t in data_tags} <= set(labels):
        return None  # POS tags mapped onto the placeholders by label_map, or data named LABEL_k itself
    how = front["labels"]
    if per_word:  # a per-word tag can be mapped to a placeholder; an entity tag's prefix cannot
        first = sorted(data_tags)[0] if data_tags else "NOUN"
        how += f", or map the data's tags onto them with {front['label_map']}='{{{first}: {labels[0]}, ...}}'"
    return (f"{label_source or 'the model config'}: the label names (id2label) are generic, {labels[0]}.."
            f"{labels[-1]} (transformers' default when a config sets none), so posbias cannot match them to the "
            f"{columns.tags_kind(columns.file_tags(dataset), dataset.scheme)} of {dataset.path}; {how}")


def align_labels(dataset: TaggingDataset, labels: list[str], scheme: str, label_map: dict | None, *,
                 label_source: str | None = None, front: dict = columns.CONFIG_FRONT) -> TaggingDataset:
    """`dataset` with its classes renamed by `label_map` (data entity type or POS tag -> the model's;
    `O` drops an entity type), checked against the model's `labels`: a data class the model cannot
    predict is a warning, and with no class in common (PER vs person) a ConfigError naming both sets
    instead of a silent F1 of 0.

    The errors name the real cause where it can be found: label names left at transformers'
    LABEL_k (`label_source`: where they came from, e.g. the folder's config.json), or another
    column of the file holding the model's tags (`posbias.tagging.columns`). `front`: how the
    caller's user sets things (`columns.CONFIG_FRONT`: config keys)."""
    def kind(tag):  # the class a tag names: its entity type, or the whole tag (POS)
        return parse_tag(tag)[1] if scheme != "none" else tag

    def rename(tag):
        if not label_map or tag == "O":
            return tag
        if scheme == "none":
            return str(label_map.get(tag, tag))
        prefix, typ = parse_tag(tag)
        new = label_map.get(typ, typ)
        return "O" if new == "O" else f"{prefix}-{new}"

    def other_column(what: str = "the model's tags") -> str:
        col = columns.matching_column(dataset, labels, scheme, label_map)
        return f"; {columns.hint(col, front, what)}" if col is not None else ""

    generic = _generic_names(dataset, labels, scheme, label_map, label_source, front)
    if generic:
        raise ConfigError(generic)
    if (dataset.scheme == "none") != (scheme == "none"):  # POS data for an NER model or the reverse
        raise ConfigError(columns.scheme_mismatch(dataset, labels, scheme) + other_column())
    if label_map:
        from dataclasses import replace

        dataset = replace(dataset, examples=[TaggingExample(e.id, e.words, [rename(t) for t in e.tags], e.meta)
                                             for e in dataset.examples])
    model_classes = {kind(t) for t in labels if t != "O"} if scheme != "none" else set(labels)
    data_classes = {kind(t) for e in dataset.examples if e.tags for t in e.tags if t != "O" or scheme == "none"}
    unknown = sorted(data_classes - model_classes)
    what = "entity types" if scheme != "none" else "tags"
    if unknown and data_classes & model_classes:  # a model trained without some rare classes
        share = columns.known_share([t for e in dataset.examples for t in e.tags or []], labels, scheme)
        better = other_column() if share < columns.MIN_SHARE else ""
        if better:  # most of the column is foreign to the model, and another column is not: the wrong one
            raise ConfigError(f"{dataset.path}: the model can predict only {share:.1%} of the data's {what} (not "
                              f"{', '.join(unknown[:4])}{', ...' if len(unknown) > 4 else ''}){better}")
        import warnings

        warnings.warn(f"{dataset.path}: the model cannot predict the data's {what} {unknown} (it knows "
                      f"{sorted(model_classes)}); they count as misses", stacklevel=3)
    elif unknown:  # nothing in common: another column, or the label names differ (PER vs person)
        example = f"{unknown[0]}: {sorted(model_classes)[0] if model_classes else 'O'}"
        raise ConfigError(f"{dataset.path}: the data's {what} {unknown} are not among the model's "
                          f"{sorted(model_classes)}" + (other_column() or
                          f"; map them with {front['label_map']} (e.g. {front['label_map']}='{{{example}}}', "
                          "O drops a type)"))
    return dataset


def _evaluate_aligned(model, tokenizer, cfg, dataset, out_dir=None, *, progress: bool = True,
                      model_name: str = MODEL_NAME) -> dict:
    net = _unwrap(model)
    aligned = align_labels(dataset, net.labels, net.scheme, cfg.data.label_map,
                           label_source=getattr(net, "label_source", None))
    return evaluate_dataset(model, tokenizer, cfg, aligned, out_dir, progress=progress, model_name=model_name)


def evaluate_checkpoint(model, data, output_dir=None, overrides=None, progress: bool = True) -> dict:
    """Score a checkpoint (posbias or Hugging Face token-classification folder) on a tagging file;
    writes predictions, metrics and the run's config/versions into `output_dir` when given."""
    return evaluate_file(model, data, output_dir, overrides, "tagging",
                         partial(_evaluate_aligned, model_name=str(model)), progress=progress)


def split_words(text: str) -> tuple[list[str], list[tuple[int, int]]]:
    """Raw text -> words and their character spans."""
    spans = [m.span() for m in WORD.finditer(text)]
    return [text[a:b] for a, b in spans], spans


def _read_unlabelled_too(data, cfg):
    """The sentences to tag: the file as the config reads it, or, when it has only its words (one column of
    a CoNLL file: predicting needs no tags), its words alone."""
    try:
        return read_for(data, cfg)
    except (DataError, ValueError) as first:
        if cfg.data.format not in ("auto", "conll") or isinstance(data, (list, tuple)) or is_hf_dataset(data):
            raise
        try:
            width, _ = word_rows(resolve_path(data), cfg.data.word_column)
        except (DataError, ValueError, OSError):
            raise first from None
        if width != 1:
            raise
        ds = read_conll(resolve_path(data), word_column=cfg.data.word_column, tag_column=None,
                        on_bad_record=cfg.data.on_bad_record)
        return ds


def predict_checkpoint(model, text: str | None = None, data=None, output_dir=None, overrides=None,
                       progress: bool = False) -> dict:
    """Tag raw `text` or every sentence of `data`.

    Returns id -> {"words", "tags", "entities"}; for text (id "text") each entity is
    {"type", "start_char", "end_char", "text", "words": [first, last + 1]}. With `output_dir`, also
    writes predictions.conll and predictions.jsonl.
    """
    if (text is None) == (data is None):
        raise ConfigError("predict tagging needs either text or data")
    with staged_output(output_dir) as out, opened_for_eval(model, overrides, "tagging") as (net, tokenizer, cfg):
        if generic_label_names(net.labels):  # the predictions still come out, under names that say nothing
            import warnings

            warnings.warn(f"{net.label_source or model}: the label names (id2label) are generic, {net.labels[0]}.."
                          f"{net.labels[-1]} (transformers' default when a config sets none), so the predicted "
                          "tags are these names and no entities are found; set id2label and label2id there to "
                          "the tag names the model was trained with", stacklevel=2)
        t0 = time.time()
        spans, skipped = None, []
        if data is not None:
            ds = _read_unlabelled_too(data, cfg)
            examples, source, skipped = ds.examples, ds.path, ds.skipped
        else:
            words, spans = split_words(text)
            if not words:
                raise ConfigError("text has no words to tag")
            examples, source = [TaggingExample("text", words)], "<command line>"
        preds = predict_examples(net, tokenizer, cfg, examples, source=source, progress=progress,
                                 model_name=str(model))
        scheme = net.scheme
        if data is not None and net.scheme != "none" and ds.scheme != "none":
            # Tags written in the data's own scheme, as evaluate writes and scores them (a BIOES
            # model's predictions of an IOB2 file mapped back to IOB2).
            _, preds, scheme = metrics.in_scoring_scheme([], preds, ds.file_scheme, net.scheme)
        result = {}
        for e, p in zip(examples, preds):
            ents = metrics.entities([p], scheme)[0] if scheme != "none" else []
            items = [{"type": t, "words": [a, b], "text": " ".join(e.words[a:b])} for t, a, b in ents]
            if spans is not None:
                for item, (t, a, b) in zip(items, ents):
                    item.update(start_char=spans[a][0], end_char=spans[b - 1][1],
                                text=text[spans[a][0]:spans[b - 1][1]])
            result[e.id] = {"words": e.words, "tags": p, "entities": items}
        if out is not None:
            write_predictions(out, [TaggingExample(e.id, e.words) for e in examples], preds)
            atomic_write_text(out / "predictions.jsonl", "".join(json.dumps({"id": k, **v}, ensure_ascii=False) + "\n"
                                                                for k, v in result.items()))
            write_run_meta(out, cfg, "predict", model, source, t0, skipped=skipped)
    return result
