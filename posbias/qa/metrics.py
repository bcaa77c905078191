"""SQuAD exact match and F1, written from the official evaluation scripts' definitions.

SQuAD v1.1 (Rajpurkar et al., 2016) and v2.0 (Rajpurkar, Jia & Liang, 2018) score a predicted
answer string against each gold text after normalisation (lower case, drop punctuation, drop the
articles a/an/the, collapse whitespace) and keep the max over gold texts. Behaviours of the
official scripts reproduced here, because published numbers depend on them:

* v1.1 `f1_score`: 0 whenever no token overlaps, so an empty prediction against an empty gold
  gets F1 0 (but EM 1).
* v2.0 `compute_f1`: if either side has no tokens, F1 is 1 when both are empty, else 0.
* v2.0 `get_raw_scores`: gold texts that normalise to "" are dropped; a question left with none
  (including every unanswerable one) has the single gold "". HasAns/NoAns follow whether the
  raw gold list is empty, and a subset's keys are omitted when it has no questions.
* v2.0 `apply_no_ans_threshold`: a prediction whose no-answer probability is > the threshold
  scores 1 on an unanswerable question and 0 on an answerable one.
* v2.0 `find_best_thresh`: start from "abstain everywhere", walk questions in (stable) order of
  no-answer probability, and keep the first threshold with the strictly best running score.
  A non-empty raw prediction on an unanswerable question costs 1 there even if it normalises
  to "" -- the official script tests the raw string.

Missing predictions score 0 and every average is over all gold questions, as in v1.1. The v2.0
script has no such rule: it averages over the questions it could score and then fails with a
KeyError on the HasAns/NoAns subsets. Extending the v1.1 rule gives the same numbers whenever
nothing is missing. For the same reason, a question without a prediction adds nothing to the
best-threshold walk (it is not counted among the "abstain" starting points).
"""
from __future__ import annotations

import functools
import math
import re
import string
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

from posbias import utils
from posbias.errors import ConfigError, DataError
from posbias.limits import data_limit, load_json

from .readers import read_qa

VERSIONS = ("1.1", "2.0")
_DROP_PUNCT = str.maketrans("", "", string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


@functools.lru_cache(maxsize=1 << 16)
def normalize_answer(s: str) -> str:
    """Lower case, drop punctuation, drop articles, collapse whitespace, in the official order.

    The order matters: punctuation goes before articles, so "the-cat" -> "thecat" keeps "the".
    Cached: scoring normalises each prediction once per gold text, twice (EM and F1).
    """
    s = s.lower().translate(_DROP_PUNCT)  # the official set(string.punctuation), dropped
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def exact_match(prediction: str, gold: str) -> float:
    """1.0 when the normalised strings are equal (identical in v1.1 and v2.0)."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1(prediction: str, gold: str, version: str = "1.1") -> float:
    """Bag-of-tokens F1 of the normalised strings.

    Args:
        prediction: predicted answer text.
        gold: one gold answer text.
        version: "1.1" or "2.0"; they differ only when a side has no tokens (module docstring).
    """
    _check_version(version)
    pred_toks = normalize_answer(prediction).split()
    return _f1_tokens(pred_toks, Counter(pred_toks), normalize_answer(gold).split(), version)


def _f1_tokens(pred_toks: list[str], pred_bag: Counter, gold_toks: list[str], version: str) -> float:
    """`f1` of normalised token lists (`pred_bag` = Counter(pred_toks), built once per prediction)."""
    if version == "2.0" and (not pred_toks or not gold_toks):
        # v2.0 treats "no tokens" as the no-answer prediction: right only if both abstain.
        return float(pred_toks == gold_toks)
    num_same = sum((pred_bag & Counter(gold_toks)).values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_toks)
    recall = num_same / len(gold_toks)
    return (2 * precision * recall) / (precision + recall)


def per_question(
    gold: Mapping[str, list[str]],
    predictions: Mapping[str, str],
    version: str = "1.1",
    na_probs: Mapping[str, float] | None = None,
    na_prob_thresh: float = 1.0,
) -> dict[str, tuple[float, float]]:
    """Question id -> (exact, f1) in 0..1, in gold order; the unit for bootstraps and buckets.

    Args:
        gold: question id -> gold texts; [] marks an unanswerable (v2.0) question.
        predictions: question id -> predicted text; ids missing here score (0, 0), extra ids
            are ignored.
        version: "1.1" or "2.0".
        na_probs: v2.0 only: question id -> predicted no-answer probability. When given, a
            prediction with na_prob > na_prob_thresh is scored as the empty answer.
        na_prob_thresh: see na_probs; the official default 1.0 never abstains.

    Raises:
        ValueError: unknown version, a v1.1 question with no gold text (the v1.1 script has no
            unanswerable questions), na_probs with v1.1, or na_probs missing a predicted id.
    """
    _check_version(version)
    if na_probs is not None and version != "2.0":
        raise ConfigError("--na-probs only applies to SQuAD v2.0 scoring (version='2.0'); the data is v1.1")
    scores = {}
    for qid, texts in gold.items():
        if qid not in predictions:
            scores[qid] = (0.0, 0.0)
            continue
        pred = predictions[qid]
        if version == "1.1":
            if not texts:
                raise ValueError(
                    f"question {qid!r} has no gold answer; SQuAD v1.1 scoring needs one "
                    "(score unanswerable questions with version='2.0')"
                )
        else:
            # v2.0 drops gold texts that normalise to nothing; none left = only "" is right.
            texts = [t for t in texts if normalize_answer(t)] or [""]
        # exact_match and f1 of each gold text, the prediction normalised once
        norm = normalize_answer(pred)
        toks = norm.split()
        bag = Counter(toks)
        golds = [normalize_answer(t) for t in texts]
        scores[qid] = (
            max(float(norm == g) for g in golds),
            max(_f1_tokens(toks, bag, g.split(), version) for g in golds),
        )
    if na_probs is not None:
        scores = _apply_na_threshold(scores, gold, predictions, na_probs, na_prob_thresh)
    return scores


def squad_v1(gold: Mapping[str, list[str]], predictions: Mapping[str, str],
             scores: Mapping[str, tuple[float, float]] | None = None) -> dict:
    """The official SQuAD v1.1 result: percentages over all gold questions.

    Args:
        scores: `per_question(gold, predictions, "1.1")` when the caller has it already.
    Returns:
        {"exact_match", "f1": percentages, "total": gold questions, "missing": gold ids without
        a prediction, "extra": prediction ids not in gold (ignored)}.
    """
    if scores is None:
        scores = per_question(gold, predictions, "1.1")
    total = _check_total(scores)
    return {
        "exact_match": 100.0 * sum(em for em, _ in scores.values()) / total,
        "f1": 100.0 * sum(f for _, f in scores.values()) / total,
        "total": total,
        **_coverage(gold, predictions),
    }


def squad_v2(
    gold: Mapping[str, list[str]],
    predictions: Mapping[str, str],
    na_probs: Mapping[str, float] | None = None,
    na_prob_thresh: float = 1.0,
) -> dict:
    """The official SQuAD v2.0 result, plus "missing"/"extra" counts.

    Args:
        gold: question id -> gold texts; [] marks an unanswerable question.
        predictions: question id -> predicted text ("" = no answer).
        na_probs: question id -> predicted no-answer probability; enables thresholding and the
            best_exact/best_f1 search over thresholds.
        na_prob_thresh: predictions with na_prob > this are scored as "".

    Returns:
        "exact", "f1", "total"; "HasAns_*"/"NoAns_*" for non-empty subsets; with na_probs also
        "best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh"; "missing", "extra".
    """
    raw = per_question(gold, predictions, "2.0")
    total = _check_total(raw)
    scores = raw
    if na_probs is not None:
        scores = _apply_na_threshold(raw, gold, predictions, na_probs, na_prob_thresh)
    out = _percentages(scores, list(gold))
    for prefix, has_ans in (("HasAns", True), ("NoAns", False)):
        subset = [qid for qid, texts in gold.items() if bool(texts) == has_ans]
        if subset:  # the official script omits an empty subset rather than dividing by 0
            out.update({f"{prefix}_{k}": v for k, v in _percentages(scores, subset).items()})
    if na_probs is not None:
        for i, name in enumerate(("exact", "f1")):
            best, thresh = _best_thresh(
                {q: s[i] for q, s in raw.items()}, gold, predictions, na_probs, total
            )
            out[f"best_{name}"], out[f"best_{name}_thresh"] = best, thresh
    out.update(_coverage(gold, predictions))
    return out


PERCENTAGES = frozenset({"exact_match", "exact", "f1", "HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1",
                         "best_exact", "best_f1"})
"""The keys of a QA result (at any depth: `by_answer_length`, ...) that are percentages, 0..100."""


def check_ranges(result: dict) -> None:
    """`posbias.utils.check_ranges` over this task's percentages (`PERCENTAGES`): raise rather than write
    a result with a non-finite number or a percentage outside 0..100."""
    utils.check_ranges(result, PERCENTAGES, "QA metrics")


def score_files(
    data_path: str | Path,
    predictions_path: str | Path,
    na_prob_path: str | Path | None = None,
    version: str = "auto",
    na_prob_thresh: float = 1.0,
) -> dict:
    """Score an official-format predictions file against a SQuAD file (`posbias score qa`).

    Args:
        data_path: SQuAD-format dataset.
        predictions_path: JSON object question id -> answer string.
        na_prob_path: optional JSON object question id -> no-answer probability (v2.0 only).
        version: "1.1", "2.0" or "auto" (2.0 if the file has unanswerable questions or its
            version starts with "2").
        na_prob_thresh: see `squad_v2`.

    Returns:
        The `squad_v1` or `squad_v2` dict.

    Raises:
        DataError: a file is not valid JSON or not an object of the expected value type.
        ConfigError: unknown version, or na_prob_path with v1.1 (a ValueError).
    """
    if version not in (*VERSIONS, "auto"):
        raise ConfigError(f"version must be one of 1.1, 2.0, auto; got {version!r}")
    dataset = read_qa(data_path, on_bad_record="error", check_offsets=False)
    why = "--version 1.1" if version == "1.1" else "it has no unanswerable question"
    if version == "auto":
        v2 = dataset.has_impossible or str(dataset.version).startswith("2")
        version = "2.0" if v2 else "1.1"
    if version == "1.1" and na_prob_path is not None:
        raise ConfigError(f"--na-probs {na_prob_path}: no-answer probabilities apply to SQuAD v2.0 scoring only, "
                          f"and {data_path} is scored as v1.1 ({why}); leave out --na-probs, or score as v2.0 "
                          "with --version 2.0")
    predictions = _read_json_object(predictions_path, (str,), "an answer string")
    if version == "1.1":
        return squad_v1(dataset.gold(), predictions)
    na_probs = None
    if na_prob_path is not None:
        na_probs = _read_json_object(na_prob_path, (int, float), "a number")
    return squad_v2(dataset.gold(), predictions, na_probs, na_prob_thresh)


def _apply_na_threshold(scores, gold, predictions, na_probs, thresh):
    """Score confident abstentions as "": right iff unanswerable. Missing predictions stay 0."""
    out = {}
    for qid, s in scores.items():
        if qid in predictions and _na_prob(na_probs, qid) > thresh:
            correct = float(not gold[qid])
            s = (correct, correct)
        out[qid] = s
    return out


def _best_thresh(scores, gold, predictions, na_probs, total):
    """Best score over no-answer thresholds and the threshold reaching it (official walk).

    Below every na_prob all predictions abstain, scoring the number of unanswerable questions.
    Raising the threshold past a question's na_prob lets its prediction through: an answerable
    question gains its score; an unanswerable one loses 1 if the raw prediction is non-empty.
    """
    answered = [qid for qid in gold if qid in predictions]
    cur = best = sum(1 for qid in answered if not gold[qid])
    best_thresh = 0.0
    # Stable sort over na_probs' own order, so ties walk exactly as in the official script.
    for qid in sorted((q for q in na_probs if q in gold and q in predictions), key=na_probs.get):
        if gold[qid]:
            cur += scores[qid]
        elif predictions[qid]:
            cur -= 1
        if cur > best:
            best, best_thresh = cur, na_probs[qid]
    return 100.0 * best / total, best_thresh


def _na_prob(na_probs, qid):
    if qid not in na_probs:
        raise ConfigError(f"no-answer probabilities (--na-probs): none for predicted question {qid!r}")
    return na_probs[qid]


def _percentages(scores, qids):
    return {
        "exact": 100.0 * sum(scores[q][0] for q in qids) / len(qids),
        "f1": 100.0 * sum(scores[q][1] for q in qids) / len(qids),
        "total": len(qids),
    }


def _coverage(gold, predictions):
    return {
        "missing": sum(1 for qid in gold if qid not in predictions),
        "extra": sum(1 for qid in predictions if qid not in gold),
    }


def _check_total(scores):
    if not scores:
        raise ValueError("no gold questions to score")
    return len(scores)


def _check_version(version):
    if version not in VERSIONS:
        raise ValueError(f"version must be one of {', '.join(VERSIONS)}; got {version!r}")


def _read_json_object(path, value_types, what):
    """Read a JSON object of id -> value, naming the file and record on the first bad entry."""
    obj = load_json(path, "predictions file", data_limit(), data=True)
    if not isinstance(obj, dict):
        raise DataError(
            path, None, f"expected a JSON object mapping question id to {what}, "
            f"got {type(obj).__name__}"
        )
    for qid, value in obj.items():
        # bool is an int subclass but never a probability or an answer.
        if isinstance(value, bool) or not isinstance(value, value_types):
            raise DataError(path, qid, f"value must be {what}, got {type(value).__name__}")
        # json reads NaN and Infinity, which JSON has not: a NaN no-answer probability compares
        # False with every threshold (silently never abstains) and sorts anywhere.
        if isinstance(value, float) and not math.isfinite(value):
            raise DataError(path, qid, f"value must be a finite number, got {value}")
    return obj
