"""Tagging examples -> windows (features): word -> sub-token alignment, labels, sliding windows.

Shape legend: n windows; L_i tokens in window i (no padding is stored: padding happens per batch).

Alignment comes from the fast tokenizer's word ids (`is_split_into_words`), so any tokenizer works:
WordPiece, SentencePiece, byte-level BPE (loaded with `add_prefix_space`, see `load_tokenizer`).
A word's label sits on its first sub-token; with `label_subtokens="all"` its continuation
sub-tokens are trained too (entity tags B-X/E-X/S-X -> I-X there), with `"copy"` they get the
word's label as it is (the token-positional-bias authors' `label_all_tokens`: `S-PER S-PER` on a
two-piece word); either way the word's prediction is read at its first sub-token.

A sentence longer than the window gets several windows over word boundaries, consecutive ones
sharing at least `stride` tokens; every word is predicted by exactly one window, the one where it
has the most context on both sides (BERT's max-context rule) — nothing is truncated silently.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..tokens import IGNORE, separator_id, special_tokens  # noqa: F401  (tagging's names for them)
from ..errors import ConfigError, DataError
from .examples import TaggingExample



@dataclass
class TaggingFeatures:
    """Columnar windows; row i of every field describes window i.

    Attributes:
        input_ids: per window, token ids (L_i,) int64, special tokens included.
        word_index: per window (L_i,) int64: the token's word in its sentence, -1 for special tokens.
        predict: per window (L_i,) bool: this token is the first sub-token of a word that this
            window predicts (each word of each sentence is predicted by exactly one window).
        labels: per window (L_i,) int64 label ids, IGNORE where no loss; None without labels.
        cls_index: (n,) position of the leading special token ([CLS], <s>), -1 when the tokenizer
            adds none (GPT-2, BLOOM): position perturbations keep that token in place.
        example_index: (n,) index of the window's sentence in the examples list.
    """

    input_ids: list[np.ndarray]
    word_index: list[np.ndarray]
    predict: list[np.ndarray]
    labels: list[np.ndarray] | None
    cls_index: np.ndarray
    example_index: np.ndarray
    stats: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def lengths(self) -> np.ndarray:
        return np.array([len(x) for x in self.input_ids], dtype=np.int64)


def label_maps(labels: list[str]) -> dict[str, int]:
    return {t: i for i, t in enumerate(labels)}


LABEL_SUBTOKENS = ("first", "all", "copy")


def continuation_label(tag: str, scheme: str, label_subtokens: str = "all") -> str:
    """The label of a word's continuation sub-tokens: `all`, inside its entity (I-X); `copy`, the
    word's own label (the authors' `label_all_tokens`, their `tokenize_and_align_labels`)."""
    if scheme == "none" or tag == "O" or label_subtokens == "copy":
        return tag
    return "I-" + tag.split("-", 1)[1]


def learns_word_labels(label_subtokens: str, scheme: str) -> bool:
    """Whether a model trained with `label_subtokens` learned its word's label on every sub-token
    as it is (`copy`; `all` for per-word labels, which have no prefix to change): then its own
    prediction at each sub-token is what the authors' sub-token F1 scores, against the word labels
    copied (`metrics.subtoken_sequences`); otherwise each word's prediction is copied instead."""
    return label_subtokens == "copy" or (label_subtokens == "all" and scheme == "none")


def _windows(word_starts: np.ndarray, n_tokens: int, room: int, stride: int) -> list[tuple[int, int]]:
    """Token ranges [a, b) of a sentence's windows, cut at word starts where possible.

    word_starts: (w,) first token of each word (sorted). A window ends before the first word that does
    not fit wholly; the next one starts at the last word start at least `stride` tokens before that
    end, so consecutive windows share >= stride tokens unless a single word is longer than that.
    """
    if n_tokens <= room:
        return [(0, n_tokens)]
    out, a = [], 0
    while True:
        b = a + room
        if b >= n_tokens:
            out.append((a, n_tokens))
            return out
        # End at the last word start inside (a, b]; a single word longer than the window is cut.
        k = np.searchsorted(word_starts, b, side="right") - 1
        if word_starts[k] > a:
            b = int(word_starts[k])
        out.append((a, b))
        # Next start: the last word start at least `stride` tokens before b (the windows then share
        # >= stride tokens); when every such start is <= a, the first word start after a.
        k = np.searchsorted(word_starts, b - stride, side="right") - 1
        if k >= 0 and word_starts[k] > a:
            a = int(word_starts[k])
        else:
            k = np.searchsorted(word_starts, a, side="right")
            a = int(word_starts[k]) if k < len(word_starts) and word_starts[k] < b else b


def build_tagging_features(
    examples: list[TaggingExample],
    tokenizer,
    *,
    labels: list[str] | None = None,
    scheme: str = "none",
    max_seq_len: int = 256,
    stride: int = 64,
    label_subtokens: str = "first",
    source: str = "<examples>",
) -> TaggingFeatures:
    """Tokenize sentences into windows; with `labels` (the model's label list), attach label ids.

    Args:
        examples: validated sentences (see posbias.tagging.readers).
        tokenizer: a fast Hugging Face tokenizer (word ids needed).
        labels: label list; each gold tag must be in it. None builds windows without labels.
        scheme: scheme of the tags ("iob2", "bioes", "none"), for continuation labels.
        label_subtokens: which sub-tokens carry a label, `LABEL_SUBTOKENS` (`continuation_label`).
        stride: minimum number of tokens shared by consecutive windows of a long sentence.
        source: file name used in error messages.
    """
    if not examples:
        raise DataError(source, None, "no sentences to build features from")
    prefix, suffix = special_tokens(tokenizer)
    room = max_seq_len - len(prefix) - len(suffix)
    if room <= stride:
        raise ConfigError(f"data.max_seq_len ({max_seq_len}) leaves {room} tokens per window after special "
                          f"tokens: must exceed data.stride ({stride})")
    if label_subtokens not in LABEL_SUBTOKENS:
        raise ConfigError(f"data.label_subtokens must be one of {', '.join(LABEL_SUBTOKENS)}, got {label_subtokens!r}")
    label_id = label_maps(labels) if labels is not None else None
    tokens, unk_words = tokenize_sentences(examples, tokenizer)
    out = {"input_ids": [], "word_index": [], "predict": [], "labels": [], "cls": [], "ex": []}
    stats = {"sentences": len(examples), "words": 0, "windows": 0, "long_sentences": 0, "cut_words": 0}
    for i, (ex, (ids, wid)) in enumerate(zip(examples, tokens)):
        first = first_subtokens(wid)
        word_starts = np.flatnonzero(first)
        spans = _windows(word_starts, len(ids), room, stride)
        stats["words"] += len(ex.words)
        stats["long_sentences"] += len(spans) > 1
        # Max context: a word's first sub-token scores min(tokens left, tokens right) in a window.
        best = np.full(len(ex.words), -1.0)
        owner = np.zeros(len(ex.words), dtype=np.int64)
        for w, (a, b) in enumerate(spans):
            pos = word_starts[(word_starts >= a) & (word_starts < b)]
            score = np.minimum(pos - a, b - 1 - pos) + 0.01 * (b - a)
            words = wid[pos]
            better = score > best[words]  # ties: the earlier window keeps the word
            best[words[better]] = score[better]
            owner[words[better]] = w
        stats["cut_words"] += sum(not first[a] for a, _ in spans)  # a word longer than a window
        for w, (a, b) in enumerate(spans):
            tok = ids[a:b]
            words = wid[a:b]
            is_first = first[a:b]
            pred = is_first & (owner[words] == w)
            out["input_ids"].append(np.r_[prefix, tok, suffix].astype(np.int64))
            out["word_index"].append(_around(words, -1, prefix, suffix).astype(np.int64))
            out["predict"].append(_around(pred, False, prefix, suffix).astype(bool))
            if label_id is not None and ex.tags is not None:
                lab = np.full(len(tok), IGNORE, dtype=np.int64)
                for j in np.flatnonzero(is_first):
                    lab[j] = _label(label_id, ex.tags[words[j]], source, ex)
                if label_subtokens != "first":
                    for j in np.flatnonzero(~is_first & (words >= 0)):
                        lab[j] = _label(label_id, continuation_label(ex.tags[words[j]], scheme, label_subtokens),
                                        source, ex)
                out["labels"].append(_around(lab, IGNORE, prefix, suffix).astype(np.int64))
            out["cls"].append(0 if prefix else -1)
            out["ex"].append(i)
    stats["windows"] = len(out["input_ids"])
    stats["unknown_token_words"] = unk_words
    stats["mean_window_tokens"] = float(np.mean([len(x) for x in out["input_ids"]]))
    return TaggingFeatures(
        input_ids=out["input_ids"], word_index=out["word_index"], predict=out["predict"],
        labels=out["labels"] if label_id is not None else None,
        cls_index=np.array(out["cls"], dtype=np.int64), example_index=np.array(out["ex"], dtype=np.int64),
        stats=stats)


def tokenize_sentences(examples: list[TaggingExample], tokenizer) -> tuple[list[tuple[np.ndarray, np.ndarray]], int]:
    """Each sentence's sub-tokens without special tokens, once: [(ids (L,), word id (L,))], and the
    number of words that stand in as the unknown token (see below)."""
    enc = tokenizer([e.words for e in examples], is_split_into_words=True, add_special_tokens=False)
    out, unk_words = [], 0
    for i, ex in enumerate(examples):
        ids = np.asarray(enc["input_ids"][i], dtype=np.int64)
        wid = np.array([-1 if w is None else w for w in enc.word_ids(i)], dtype=np.int64)
        if len(np.unique(wid[wid >= 0])) < len(ex.words):
            # Words the tokenizer drops entirely (zero-width or control characters) still need a
            # prediction: they stand in as the unknown token, and are counted.
            ids, wid, n = _with_unknown_words(tokenizer, ex, ids, wid)
            unk_words += n
        out.append((ids, wid))
    return out, unk_words


def first_subtokens(wid: np.ndarray) -> np.ndarray:
    """(L,) bool: the token is the first sub-token of its word (word ids -1 mark special tokens)."""
    return np.r_[True, wid[1:] != wid[:-1]] & (wid >= 0)


def _around(x: np.ndarray, value, prefix: list, suffix: list) -> np.ndarray:
    """`x` with `value` at the special tokens' places before and after it."""
    return np.r_[np.full(len(prefix), value), x, np.full(len(suffix), value)]


def _label(label_id: dict[str, int], tag: str, source: str, ex: TaggingExample) -> int:
    if tag not in label_id:
        raise DataError(source, ex.id, f"tag {tag!r} is not among the model's labels {sorted(label_id)}")
    return label_id[tag]


def _with_unknown_words(tokenizer, ex: TaggingExample, ids, wid):
    """Re-tokenize a sentence with every word that produced no token replaced by the unknown token."""
    present = set(wid[wid >= 0].tolist())
    missing = [k for k in range(len(ex.words)) if k not in present]
    stand_in = tokenizer.unk_token or tokenizer.eos_token
    words = [stand_in if k in set(missing) else w for k, w in enumerate(ex.words)]
    enc = tokenizer([words], is_split_into_words=True, add_special_tokens=False)
    ids = np.asarray(enc["input_ids"][0], dtype=np.int64)
    wid = np.array([-1 if w is None else w for w in enc.word_ids(0)], dtype=np.int64)
    if len(np.unique(wid[wid >= 0])) < len(ex.words):
        raise DataError("<tokenizer>", ex.id, f"words {missing} produce no token even as {stand_in!r}")
    return ids, wid, len(missing)
