"""Tagging metrics: entity-level P/R/F1 (seqeval, strict mode) for NER, accuracy and per-tag F1 for POS.

NER is scored at word level (each word's prediction is read at its first sub-token) with seqeval's
**strict** mode on the declared scheme (IOB2 or BIOES): an entity counts only when its type and
both boundaries match and its tag sequence is well formed (a predicted `I-PER` after `O` is not
an entity). seqeval's default mode is conlleval's lenient one, which repairs such sequences; the
token-positional-bias authors used it, and scored every sub-token. posbias's main number is the
strict one (`docs/concepts/duplicated-test-sets.md` says where this differs from the paper's code); the authors' metric
is reported beside it (`seqeval_subtoken_f1`, `lenient_scores`: an exact, vectorized equivalent of
seqeval's default mode). A model trained on
BIOES labels is scored on an IOB2 file in IOB2, its predictions mapped back (`scoring_schemes`).

POS (scheme "none"): accuracy over words, and per-tag precision/recall/F1 with their macro mean;
beside them the authors' POS "F1" (`seqeval_subtoken_f1`: seqeval's default mode over sub-tokens).
All numbers are percentages.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import utils
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
PERCENTAGES = frozenset({"precision", "recall", "f1", "accuracy", "macro_f1", SUBTOKEN_F1})
"""The keys of a tagging result (at any depth: `per_class`) that are percentages, 0..100."""


def check_ranges(result: dict) -> None:
    """`posbias.utils.check_ranges` over this task's percentages (`PERCENTAGES`): raise rather than write
    a result with a non-finite number or a percentage outside 0..100."""
    utils.check_ranges(result, PERCENTAGES, "tagging metrics")


def seqeval_subtoken_f1(gold: list[list[str]], pred: list[list[str]], scheme: str = "none") -> float:
    """The token-positional-bias authors' "F1" (their `metrics/ner_f1.py`), in points: seqeval's
    default (conlleval, lenient) mode, micro F1, over sub-token label sequences, each word's label
    copied to its sub-tokens (`subtoken_sequences`).

    NER (`scheme` an entity scheme): `lenient_scores` of the labels as they are, in the scheme the
    model learned (the authors': IOBES, `S-PER S-PER` on a two-piece word read as two chunks).

    POS (`scheme` "none"): their UD reader writes every UPOS tag as `S-<UPOS>` (a tag of "_" as `O`);
    seqeval then reads each `S-` label as a one-token chunk, so the score is a micro F1 over
    sub-tokens: 2 TP / (predicted + gold chunks), computed here in that closed form (the test
    checks parity with `seqeval.metrics.classification_report`). Bare UPOS strings would be read
    otherwise: seqeval would merge runs of one tag into one chunk; their code used bare tags only
    before Dec 2022, ahead of the paper's runs.

    Args:
        gold, pred: per sentence, one label per sub-token.
    """
    if scheme != "none":
        return lenient_scores(gold, pred)["f1"]
    if len(gold) != len(pred) or any(len(a) != len(b) for a, b in zip(gold, pred)):
        raise ValueError("gold and predicted sub-token sequences differ in number or length")
    g = np.array([t for s in gold for t in s], dtype=object)
    p = np.array([t for s in pred for t in s], dtype=object)
    chunk_g, chunk_p = g != "_", p != "_"  # "_" is written O: no chunk
    tp = int(np.sum((g == p) & chunk_g))  # the same one-token chunk: same place, same tag
    n = int(chunk_g.sum()) + int(chunk_p.sum())
    return 100 * 2 * tp / n if n else 0.0


@dataclass(frozen=True)
class Chunks:
    """Chunks of label sequences flattened as seqeval numbers them (`lenient_chunks`); m chunks.

    Attributes:
        types: the chunk types present, sorted; type: (m,) index of each chunk's type in it.
        first, last: (m,) the chunk's first and last label (inclusive) in the flattened sequence.
        n: labels in the flattened sequence (sentences, their separators and the final `O`).
    """

    types: list[str]
    type: np.ndarray
    first: np.ndarray
    last: np.ndarray
    n: int

    def as_set(self) -> set[tuple[str, int, int]]:
        """{(type, first, last)}: seqeval's `get_entities` tuples."""
        return set(zip([self.types[t] for t in self.type.tolist()], self.first.tolist(), self.last.tolist()))

    def keys(self, type_ids: dict[str, int]) -> np.ndarray:
        """(m,) one int64 per chunk, equal for equal (type, first, last), types numbered by `type_ids`."""
        if len(type_ids) * self.n * self.n >= 2 ** 62:
            raise ValueError(f"{self.n} labels are too many to number their chunks in int64")
        tid = np.array([type_ids[t] for t in self.types], dtype=np.int64)[self.type] if len(self.type) else self.type
        return (tid * self.n + self.first) * self.n + self.last


def lenient_chunks(sequences: list[list[str]]) -> Chunks:
    """The chunks seqeval's default mode reads (`seqeval.metrics.sequence_labeling.get_entities`,
    conlleval's lenient rules), over the sentences flattened with an `O` after each, exactly as
    seqeval numbers them; vectorized (its per-label Python loop would dominate an F1(α) run).
    Lenient: any sequence is read, an ill-formed one repaired, e.g. `I-X` after `O` starts a chunk,
    `S-X S-X` is two, `B-X B-X` two, a lone `E-X` one.

    Shape legend: n labels, sentence separators and seqeval's final `O` included."""
    flat = [t for s in sequences for t in (*s, "O")] + ["O"]
    index: dict[str, int] = {}
    codes = np.fromiter((index.setdefault(t, len(index)) for t in flat), dtype=np.int64, count=len(flat))  # (n,)
    names = list(index)
    # Per distinct label, seqeval's reading: the tag is its first character, the type what follows the
    # first "-" ('_' when empty); the tags its rules name get a code, any other behaves as one more.
    O, B, I, E, S, DOT, OTHER = range(7)  # noqa: E741, N806
    tag_code = {"O": O, "B": B, "I": I, "E": E, "S": S, ".": DOT}
    label_type = [t[1:].split("-", 1)[-1] or "_" for t in names]
    types = sorted(set(label_type))
    tag = np.array([tag_code.get(t[0], OTHER) for t in names], dtype=np.int64)[codes]  # (n,)
    typ = np.array([types.index(t) for t in label_type], dtype=np.int64)[codes]  # (n,)
    prev_tag = np.r_[O, tag[:-1]]
    prev_typ = np.r_[-1, typ[:-1]]  # seqeval starts with prev_type '' (no label's type)
    new_type = prev_typ != typ
    # end_of_chunk(prev_tag, tag, prev_type, type_): a chunk ended at i - 1
    end = (np.isin(prev_tag, (E, S)) | (np.isin(prev_tag, (B, I)) & np.isin(tag, (B, S, O)))
           | (~np.isin(prev_tag, (O, DOT)) & new_type))
    # start_of_chunk(prev_tag, tag, prev_type, type_): a chunk starts at i
    start = (np.isin(tag, (B, S)) | (np.isin(prev_tag, (E, S, O)) & np.isin(tag, (E, I)))
             | (~np.isin(tag, (O, DOT)) & new_type))
    # seqeval emits (prev_type, begin_offset, i - 1) before it moves begin_offset to a start at i:
    # the chunk begins at the last start before i (0 if none yet).
    last_start = np.maximum.accumulate(np.where(start, np.arange(len(flat)), 0))  # (n,)
    i = np.flatnonzero(end)  # never 0: before the first label prev_tag is O
    return Chunks(types, typ[i - 1], last_start[i - 1], i - 1, len(flat))


def lenient_scores(gold: list[list[str]], pred: list[list[str]], gold_chunks: Chunks | None = None) -> dict:
    """Micro precision/recall/F1 (points) of seqeval's default (lenient) mode, as its
    `classification_report(mode=None)` "micro avg" (zero where undefined): the token-positional-bias
    authors' NER metric (their `metrics/ner_f1.py`) over sub-token label sequences. `gold_chunks`:
    `lenient_chunks(gold)` when the caller has it (scoring many predictions against one gold set)."""
    if len(gold) != len(pred) or any(len(a) != len(b) for a, b in zip(gold, pred)):
        raise ValueError("gold and predicted sub-token sequences differ in number or length")
    g = gold_chunks if gold_chunks is not None else lenient_chunks(gold)
    p = lenient_chunks(pred)
    type_ids = {t: i for i, t in enumerate(sorted(set(g.types) | set(p.types)))}
    tp = len(np.intersect1d(g.keys(type_ids), p.keys(type_ids), assume_unique=True))
    return {**_prf(tp, len(p.first), len(g.first)), "entities": len(g.first), "predicted_entities": len(p.first)}


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
