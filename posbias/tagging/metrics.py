"""Tagging metrics: entity-level P/R/F1 (seqeval, strict mode) for NER, accuracy and per-tag F1 for POS.

NER is scored at word level (each word's prediction is read at its first sub-token) with seqeval's
**strict** mode on the declared scheme (IOB2 or BIOES): an entity counts only when its type and
both boundaries match and its tag sequence is well formed (a predicted `I-PER` after `O` is not
an entity). seqeval's default mode is conlleval's lenient one, which repairs such sequences; the
token-positional-bias authors used it, and scored every sub-token. posbias reports the strict
numbers (`docs/tagging.md` says where this differs from the paper's code). A model trained on
BIOES labels is scored on an IOB2 file in IOB2, its predictions mapped back (`scoring_schemes`).

POS (scheme "none"): accuracy over words, and per-tag precision/recall/F1 with their macro mean;
beside them the authors' POS "F1" (`seqeval_subtoken_f1`: seqeval's default mode over sub-tokens).
All numbers are percentages.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import DataError
from .readers import read_tagging
from .schemes import convert, parse_tag, to_iob2_prefixes

ENTITY_SCHEMES = ("iob2", "bioes")


def _seqeval_scheme(scheme: str):
    from seqeval.scheme import IOB2, IOBES

    try:
        return {"iob2": IOB2, "bioes": IOBES}[scheme]
    except KeyError:
        raise ValueError(f"no entity scheme {scheme!r}; choose one of {ENTITY_SCHEMES}") from None


def entities(sequences: list[list[str]], scheme: str) -> list[list[tuple[str, int, int]]]:
    """Per sentence, its strict entities as (type, start word, end word exclusive)."""
    from seqeval.scheme import Entities

    found = Entities(sequences, _seqeval_scheme(scheme), suffix=False).entities
    return [[(e.tag, e.start, e.end) for e in sent] for sent in found]


def entity_scores(gold: list[list[str]], pred: list[list[str]], scheme: str, gold_entities=None) -> dict:
    """Micro precision/recall/F1 over entities and the same per entity type, strict mode.
    `gold_entities`: `entities(gold, scheme)` when the caller has it already (scoring many
    predictions against one gold set)."""
    g = gold_entities if gold_entities is not None else entities(gold, scheme)
    out = scores_of_entities(g, entities(pred, scheme))
    out.update(scheme=scheme, sentences=len(gold), words=sum(map(len, gold)))
    return out


def scores_of_entities(gold: list[list[tuple]], pred: list[list[tuple]]) -> dict:
    """P/R/F1 (micro and per type) of per-sentence entity lists, (type, start, end) each."""
    per: dict[str, list[int]] = {}  # type -> [true positives, predicted, gold]
    for gs, ps in zip(gold, pred):
        gset, pset = set(gs), set(ps)
        for t, *_ in gset & pset:
            per.setdefault(t, [0, 0, 0])[0] += 1
        for t, *_ in pset:
            per.setdefault(t, [0, 0, 0])[1] += 1
        for t, *_ in gset:
            per.setdefault(t, [0, 0, 0])[2] += 1
    tp, n_pred, n_gold = (sum(v[i] for v in per.values()) for i in range(3))
    out = {**_prf(tp, n_pred, n_gold), "entities": n_gold, "predicted_entities": n_pred}
    out["per_class"] = {t: {**_prf(*v), "support": v[2]} for t, v in sorted(per.items())}
    return out


def _prf(tp: int, n_pred: int, n_gold: int) -> dict:
    p = 100 * tp / n_pred if n_pred else 0.0
    r = 100 * tp / n_gold if n_gold else 0.0
    return {"precision": p, "recall": r, "f1": 2 * p * r / (p + r) if p + r else 0.0}


def tag_scores(gold: list[list[str]], pred: list[list[str]]) -> dict:
    """Word accuracy, per-tag precision/recall/F1 and their macro mean (POS tagging)."""
    g = np.array([t for s in gold for t in s], dtype=object)
    p = np.array([t for s in pred for t in s], dtype=object)
    per = {}
    for t in sorted(set(g.tolist()) | set(p.tolist())):
        tp = int(np.sum((g == t) & (p == t)))
        per[t] = {**_prf(tp, int(np.sum(p == t)), int(np.sum(g == t))), "support": int(np.sum(g == t))}
    gold_tags = [t for t in per if per[t]["support"]]
    return {"scheme": "none", "accuracy": 100 * float(np.mean(g == p)) if len(g) else 0.0,
            "macro_f1": float(np.mean([per[t]["f1"] for t in gold_tags])) if gold_tags else 0.0,
            "sentences": len(gold), "words": len(g), "per_class": per}


SUBTOKEN_F1 = "f1_seqeval_subtoken"


def seqeval_subtoken_f1(gold: list[list[str]], pred: list[list[str]]) -> float:
    """The token-positional-bias authors' POS "F1" (their `metrics/ner_f1.py`), in points: seqeval's
    default (conlleval, lenient) mode, micro F1, over sub-token label sequences.

    Their UD reader writes every UPOS tag as `S-<UPOS>` (a tag of "_" as `O`) and copies a word's
    label to each of its sub-tokens; seqeval then reads each `S-` label as a one-token chunk, so the
    score is a micro F1 over sub-tokens: 2 TP / (predicted + gold chunks), computed here in that
    closed form (seqeval's per-token Python loop would dominate a GPU F1(α) run; the test checks
    parity with `seqeval.metrics.classification_report`). Bare UPOS strings would be read otherwise:
    seqeval would merge runs of one tag into one chunk; their code used bare tags only before
    Dec 2022, ahead of the paper's runs.

    Args:
        gold, pred: per sentence, one POS tag per sub-token (see `subtoken_sequences`).
    """
    if len(gold) != len(pred) or any(len(a) != len(b) for a, b in zip(gold, pred)):
        raise ValueError("gold and predicted sub-token sequences differ in number or length")
    g = np.array([t for s in gold for t in s], dtype=object)
    p = np.array([t for s in pred for t in s], dtype=object)
    chunk_g, chunk_p = g != "_", p != "_"  # "_" is written O: no chunk
    tp = int(np.sum((g == p) & chunk_g))  # the same one-token chunk: same place, same tag
    n = int(chunk_g.sum()) + int(chunk_p.sum())
    return 100 * 2 * tp / n if n else 0.0


def subtoken_sequences(tags: list[list[str]], counts: list[np.ndarray]) -> list[list[str]]:
    """Word tags repeated over each word's sub-tokens: the authors' labels on every sub-token.
    `counts`: per sentence, (W,) sub-tokens of each word."""
    return [list(np.repeat(np.array(t, dtype=object), c)) if len(t) else [] for t, c in zip(tags, counts)]


def scoring_schemes(gold_scheme: str, pred_scheme: str) -> str:
    """The scheme entities are decoded in when gold and predictions come in these schemes: BIOES
    only when both are (a BIOES file scored for a BIOES model), else IOB2, so that a model trained
    on BIOES labels (`data.label_scheme: bioes`, as the authors trained CoNLL) and evaluated on an
    IOB2 file is scored exactly as an IOB2 model would be: its predictions mapped back to IOB2
    (`schemes.to_iob2_prefixes`) and decoded with strict IOB2. (Strict BIOES would reject more
    ill-formed predictions, e.g. a B-X with no E-X, than IOB2 can even express.)"""
    if "none" in (gold_scheme, pred_scheme):
        if gold_scheme != pred_scheme:
            raise ValueError(f"gold tags in scheme {gold_scheme}, predictions in {pred_scheme}")
        return "none"
    return "bioes" if gold_scheme == pred_scheme == "bioes" else "iob2"


def in_scoring_scheme(gold: list[list[str]], pred: list[list[str]], gold_scheme: str,
                      pred_scheme: str) -> tuple[list[list[str]], list[list[str]], str]:
    """(gold, predictions, scheme) ready for `score`: gold converted exactly (it is well formed),
    predictions mapped by prefix (they need not be well formed); see `scoring_schemes`."""
    scheme = scoring_schemes(gold_scheme, pred_scheme)
    if scheme != "none" and gold_scheme != scheme:
        gold = [convert(t, gold_scheme, scheme) for t in gold]
    if scheme != "none" and pred_scheme != scheme:
        pred = [to_iob2_prefixes(t) for t in pred]
    return gold, pred, scheme


def score(gold: list[list[str]], pred: list[list[str]], scheme: str) -> dict:
    """Entity scores for an entity scheme, tag scores for "none"."""
    if len(gold) != len(pred) or any(len(a) != len(b) for a, b in zip(gold, pred)):
        raise ValueError("gold and predicted sequences differ in number or length")
    return tag_scores(gold, pred) if scheme == "none" else entity_scores(gold, pred, scheme)


def main_metric(result: dict) -> tuple[str, float]:
    """F1 for NER, accuracy for POS: what best-checkpoint selection maximises."""
    return ("accuracy", result["accuracy"]) if result.get("scheme") == "none" else ("f1", result["f1"])


def sentence_ratios(gold: list[list[str]], pred: list[list[str]], scheme: str) -> list[tuple[int, int]]:
    """Per sentence, (numerator, denominator) of the main metric, so that sums over any set of
    sentences give its corpus-level value: NER F1 = 2 TP / (predicted + gold entities); POS
    accuracy = correct words / words. A paired bootstrap resamples sentences with these."""
    if scheme == "none":
        return [(sum(a == b for a, b in zip(g, p)), len(g)) for g, p in zip(gold, pred)]
    out = []
    for gs, ps in zip(entities(gold, scheme), entities(pred, scheme)):
        out.append((2 * len(set(gs) & set(ps)), len(gs) + len(ps)))
    return out


def score_files(gold_path, pred_path, *, format: str = "auto", tag: str = "upos", tag_column: int = -1,
                scheme: str = "auto") -> dict:
    """Score a predictions file (CoNLL columns: the word first, the predicted tag last; blank lines
    between sentences, as `predictions.conll` is written) against a gold CoNLL / CoNLL-U file."""
    gold = read_tagging(gold_path, format=format, tag=tag, tag_column=tag_column, scheme=scheme)
    pred = read_tagging(pred_path, format="conll", tag_column=-1, scheme="none")
    if len(gold.examples) != len(pred.examples):
        raise DataError(pred_path, None, f"{len(pred.examples)} sentences, but the gold file {gold_path} has "
                                         f"{len(gold.examples)}")
    for g, p in zip(gold.examples, pred.examples):
        if g.words != p.words:
            k = next((i for i, (a, b) in enumerate(zip(g.words, p.words)) if a != b), min(len(g), len(p)))
            raise DataError(pred_path, f"line {p.meta.get('line', 0) + k}",
                            f"word {k} of the sentence is {p.words[k] if k < len(p) else '<missing>'!r}, "
                            f"the gold file has {g.words[k] if k < len(g) else '<missing>'!r}")
        if gold.scheme != "none":
            for k, t in enumerate(p.tags):
                try:
                    parse_tag(t)
                except ValueError as e:
                    raise DataError(pred_path, f"line {p.meta.get('line', 0) + k}", str(e)) from None
    gold_tags, pred_tags, scheme = [e.tags for e in gold.examples], [e.tags for e in pred.examples], gold.scheme
    if scheme != "none":  # e.g. BIOES predictions (a model trained on BIOES labels) of an IOB2 file
        pred_scheme = "bioes" if any(t[:2] in ("E-", "S-") for s in pred_tags for t in s) else "iob2"
        gold_tags, pred_tags, scheme = in_scoring_scheme(gold_tags, pred_tags, gold.scheme, pred_scheme)
    result = score(gold_tags, pred_tags, scheme)
    result.update(gold=str(gold_path), predictions=str(Path(pred_path)))
    return result
