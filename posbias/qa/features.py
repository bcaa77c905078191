"""QA examples -> windows (features): sliding windows, offsets back to context characters, labels.

Shape legend: n windows; L_i tokens in window i (no padding is stored: padding happens per batch).
Each window is `[CLS] question [SEP] context-part [SEP]` (or context first for tokenizers that pad
on the left, like XLNet), so a long context becomes several overlapping windows (`stride`).
"""
from __future__ import annotations

import random
import warnings
from dataclasses import dataclass, field

import numpy as np

from ..errors import ConfigError, DataError
from .examples import QAExample


@dataclass
class QAFeatures:
    """Columnar windows; row i of every field describes window i.

    Attributes:
        input_ids: per window, token ids (L_i,) int64.
        token_type_ids: per window (L_i,) or None when the tokenizer has no segment ids.
        offsets: per window (L_i, 2) int64 character span in the context; -1 for non-context tokens.
        max_context: per window (L_i,) bool, True where this window gives the token its maximal
            context among the example's windows (original BERT's `token_is_max_context`).
        cls_index: (n,) position of the [CLS] token (the null answer of SQuAD v2).
        example_index: (n,) index of the window's example in the examples list.
        start_positions, end_positions: (n,) token label, -1 for windows built without labels.
        question_mask: per window (L_i,) bool, True at question tokens (heads that pool the question,
            MaP paper Eq. 5-6), or None for features built elsewhere (collate then takes every real
            non-context token).
        null_candidate: training windows of which some are labelled [CLS] (`unanswerable_windows=
            "cls"`): [CLS] then competes in the start/end softmax of every one of them (collate adds
            it to `span_mask`; for SQuAD v1, whose heads have no null position, this is what lets
            BERT's pre-processing train at all). False when every window holds its answer, so such
            data trains exactly as under `drop` (Eq. 1-2's context-only softmax). Evaluation windows
            never set it: a v1 answer is a context span.
        answer_prior: `train.debias`'s answer prior of these training windows (`posbias.qa.debias.
            AnswerPrior`), set by `QATask.train_features` and read when the model is built; None
            otherwise.
    """

    input_ids: list[np.ndarray]
    token_type_ids: list[np.ndarray] | None
    offsets: list[np.ndarray]
    max_context: list[np.ndarray]
    cls_index: np.ndarray
    example_index: np.ndarray
    start_positions: np.ndarray
    end_positions: np.ndarray
    stats: dict = field(default_factory=dict)
    question_mask: list[np.ndarray] | None = None
    null_candidate: bool = False
    answer_prior: object | None = None

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def lengths(self) -> np.ndarray:
        return np.array([len(x) for x in self.input_ids], dtype=np.int64)

    def context_mask(self, i: int) -> np.ndarray:
        return self.offsets[i][:, 0] >= 0

    def select(self, idx) -> "QAFeatures":
        """A subset of windows (e.g. one process's shard); example indices are kept."""
        idx = np.asarray(idx, dtype=np.int64)
        pick = lambda xs: [xs[i] for i in idx]  # noqa: E731
        return QAFeatures(
            input_ids=pick(self.input_ids),
            token_type_ids=pick(self.token_type_ids) if self.token_type_ids is not None else None,
            offsets=pick(self.offsets), max_context=pick(self.max_context),
            cls_index=self.cls_index[idx], example_index=self.example_index[idx],
            start_positions=self.start_positions[idx], end_positions=self.end_positions[idx],
            stats=dict(self.stats),
            question_mask=pick(self.question_mask) if self.question_mask is not None else None,
            null_candidate=self.null_candidate)


def check_fast_tokenizer(tokenizer) -> None:
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError(
            f"tokenizer {type(tokenizer).__name__} is not a fast (Rust) tokenizer: posbias needs "
            "character offsets; use a tokenizer folder with tokenizer.json")


def resolve_context_first(tokenizer, setting: str) -> bool:
    """Context before question for tokenizers that pad on the left (the HF examples' rule)."""
    if setting == "auto":
        return tokenizer.padding_side == "left"
    return setting == "true"


UNANSWERABLE_WINDOWS = ("cls", "drop", "auto")


def resolve_unanswerable_windows(setting: str, version: int) -> str:
    """`drop` or `cls` for training windows that do not hold the label (`data.unanswerable_windows`).

    `cls` is BERT's original pre-processing (run_squad.py sets start = end = 0 for such windows,
    SQuAD 1.1 included; HF run_qa.py does the same), which the Random Padding paper follows (§2.2;
    App. B.2: "we do not remove any instances from training sets"). `auto` is what posbias did
    before issue 29, kept for saved configs that say it: `cls` for v2, `drop` for v1.
    """
    if setting not in UNANSWERABLE_WINDOWS:
        raise ConfigError(f"data.unanswerable_windows must be one of {list(UNANSWERABLE_WINDOWS)}, got {setting!r}")
    if setting == "auto":
        return "cls" if version == 2 else "drop"
    return setting


def _truncate_questions(questions: list[str], tokenizer, max_query_len: int) -> tuple[list[str], int]:
    """Cut questions to `max_query_len` tokens at a token boundary (original BERT's max_query_length).

    Without this a very long question leaves no room for context and the tokenizer fails deep
    inside overflow handling.
    """
    enc = tokenizer(questions, add_special_tokens=False, return_offsets_mapping=True)
    out, n_cut = [], 0
    for q, offs in zip(questions, enc["offset_mapping"]):
        if len(offs) > max_query_len:
            q = q[: offs[max_query_len - 1][1]]
            n_cut += 1
        out.append(q)
    return out, n_cut


def _label_tokens(offsets: np.ndarray, char_start: int, char_end: int) -> tuple[int, int] | None:
    """Token span covering characters [char_start, char_end) in one window, or None if not inside.

    offsets: (L, 2) with -1 rows for non-context tokens.
    """
    ctx = np.flatnonzero(offsets[:, 0] >= 0)
    starts, ends = offsets[ctx, 0], offsets[ctx, 1]
    # The answer must lie wholly inside the window's context part.
    if len(ctx) == 0 or starts[0] > char_start or ends[-1] < char_end:
        return None
    s = ctx[np.searchsorted(starts, char_start, side="right") - 1]  # last token starting <= char_start
    e = ctx[np.searchsorted(ends, char_end, side="left")]  # first token ending >= char_end
    return int(s), int(e)


def _max_context(offsets: list[np.ndarray], windows: list[int]) -> None:
    """Mark, for one example's windows, where each context token has its maximal context.

    Score of a token in a window = min(tokens left, tokens right) + 0.01 * window context length
    (Devlin et al.'s run_squad rule). Tokens are identified across windows by their character start.
    Returns a list of bool arrays parallel to `windows`.
    """
    keys, scores, owner, pos = [], [], [], []
    for w in windows:
        ctx = np.flatnonzero(offsets[w][:, 0] >= 0)
        n = len(ctx)
        rank = np.arange(n)
        keys.append(offsets[w][ctx, 0])
        scores.append(np.minimum(rank, n - 1 - rank) + 0.01 * n)
        owner.append(np.full(n, w))
        pos.append(ctx)
    keys, scores, owner, pos = map(np.concatenate, (keys, scores, owner, pos))
    # Sort by key, then by descending score (ties: earlier window wins, as the stable original).
    order = np.lexsort((owner, -scores, keys))
    first = np.ones(len(order), bool)
    first[1:] = keys[order][1:] != keys[order][:-1]
    masks = {w: np.zeros(len(offsets[w]), bool) for w in windows}
    for w, p in zip(owner[order][first], pos[order][first]):
        masks[w][p] = True
    return [masks[w] for w in windows]


def _encode(examples: list[QAExample], tokenizer, *, max_seq_len: int, stride: int, max_query_len: int,
            ctx_first: bool, source: str, offsets: bool = True):
    """(the tokenizer's windows of every example, number of questions cut): the one tokenizer call
    that both `build_qa_features` and `window_lengths` make, so their windows agree exactly
    (`offsets` only decides whether the offsets, computed anyway, are converted to Python)."""
    # HF strips leading whitespace from questions: some tokenizers would spend a token on it.
    questions = [e.question.lstrip() for e in examples]
    questions, n_cut = _truncate_questions(questions, tokenizer, max_query_len)
    contexts = [e.context for e in examples]
    first, second = (contexts, questions) if ctx_first else (questions, contexts)
    try:
        # No attention mask: nothing reads it, and its Python list costs 8 bytes a token.
        enc = tokenizer(first, second, truncation="only_first" if ctx_first else "only_second",
                        max_length=max_seq_len, stride=stride, return_overflowing_tokens=True,
                        return_offsets_mapping=offsets, return_attention_mask=False, padding=False)
    except Exception as err:  # find the culprit instead of surfacing a Rust stack trace
        for e, q in zip(examples, questions):
            try:
                a, b = (e.context, q) if ctx_first else (q, e.context)
                tokenizer(a, b, truncation="only_first" if ctx_first else "only_second",
                          max_length=max_seq_len, stride=stride, return_overflowing_tokens=True)
            except Exception as one:
                raise DataError(source, e.id, f"tokenizer failed: {one}") from None
        raise DataError(source, None, f"tokenizer failed: {err}") from None
    return enc, n_cut


def build_qa_features(
    examples: list[QAExample],
    tokenizer,
    *,
    max_seq_len: int = 384,
    stride: int = 128,
    max_query_len: int = 64,
    context_first: str = "auto",
    train: bool = False,
    version: int = 1,
    label_policy=None,
    unanswerable_windows: str = "auto",
    seed: int = 0,
    source: str = "<examples>",
    doc_stride: int | None = None,
) -> QAFeatures:
    """Tokenize examples into windows; with `train`, attach span labels.

    Args:
        stride: tokens two consecutive windows of one context share (`data.stride`; `doc_stride`,
            run_qa's name and this function's before config version 2, is read with a FutureWarning).
        examples: validated examples (see posbias.data.squad).
        tokenizer: a fast Hugging Face tokenizer.
        train: attach labels via `label_policy` and drop/redirect windows without the label.
        version: 1 (every window's label must be inside the context) or 2 (null = [CLS]).
        label_policy: `(example, rng) -> Answer | None`; defaults to the first answer.
        unanswerable_windows: training windows that do not hold the label (including every window
            of a question without one: unanswerable, or its answers cut off by `posbias data build`):
            "cls" labels them [CLS] (start = end = cls_index) and keeps them, for v1 as for v2
            (BERT's original pre-processing; `null_candidate` is set when one is); "drop" leaves them out;
            "auto" is the behaviour before issue 29 (cls for v2, drop for v1) and this function's
            default for direct callers; runs take `data.unanswerable_windows` (default cls).
        source: file name used in error messages.
    """
    if doc_stride is not None:
        warnings.warn("build_qa_features(doc_stride=...) is now stride=...", FutureWarning, stacklevel=2)
        stride = doc_stride
    check_fast_tokenizer(tokenizer)
    if not examples:
        raise DataError(source, None, "no examples to build features from")
    if label_policy is None:
        from .labels import first_answer as label_policy  # binds the parameter's default, only when none is given
    unanswerable_windows = resolve_unanswerable_windows(unanswerable_windows, version)
    ctx_first = resolve_context_first(tokenizer, context_first)
    enc, n_cut = _encode(examples, tokenizer, max_seq_len=max_seq_len, stride=stride,
                         max_query_len=max_query_len, ctx_first=ctx_first, source=source)

    ctx_seq = 0 if ctx_first else 1
    cls_id = tokenizer.cls_token_id
    rng = random.Random(seed)
    labels: dict[int, tuple[int, int] | None] = {}
    if train:
        for i, e in enumerate(examples):
            a = None if e.is_impossible else label_policy(e, rng)
            if a is None:
                labels[i] = None
                continue
            # Answers with surrounding spaces would otherwise pull in a neighbouring token.
            s, t = a.start, a.end
            while s < t and e.context[s].isspace():
                s += 1
            while t > s and e.context[t - 1].isspace():
                t -= 1
            labels[i] = (s, t)

    ids, types, offs, qmask, cls_idx, ex_idx, starts, ends = [], [], [], [], [], [], [], []
    n_dropped = n_null = 0
    has_types = "token_type_ids" in enc
    for w, ex in enumerate(enc["overflow_to_sample_mapping"]):
        seq_ids = enc.sequence_ids(w)
        o = np.array(enc["offset_mapping"][w], dtype=np.int64).reshape(-1, 2)
        o[np.array([s != ctx_seq for s in seq_ids])] = -1
        input_ids = np.array(enc["input_ids"][w], dtype=np.int64)
        cls = np.flatnonzero(input_ids == cls_id) if cls_id is not None else np.array([], int)
        c = int(cls[0]) if len(cls) else 0
        s = t = -1
        if train:
            span = labels[ex]
            tok = _label_tokens(o, *span) if span is not None else None
            if tok is None:
                if unanswerable_windows == "drop":
                    n_dropped += 1
                    continue
                # BERT's run_squad: start = end = [CLS]. For v1 too: the window still trains the
                # encoder on its context, and its question is not lost when no window holds the
                # answer (a truncated train set, App. B.2); decoding a v1 model never answers [CLS].
                s = t = c
                n_null += 1
            else:
                s, t = tok
        ids.append(input_ids)
        types.append(np.array(enc["token_type_ids"][w], dtype=np.int64) if has_types else None)
        offs.append(o)
        qmask.append(np.array([sid == 1 - ctx_seq for sid in seq_ids], dtype=bool))
        cls_idx.append(c)
        ex_idx.append(ex)
        starts.append(s)
        ends.append(t)

    ex_idx_arr = np.array(ex_idx, dtype=np.int64)
    max_ctx: list[np.ndarray | None] = [None] * len(offs)
    by_example: dict[int, list[int]] = {}
    for w, ex in enumerate(ex_idx):
        by_example.setdefault(ex, []).append(w)
    for windows in by_example.values():
        for w, m in zip(windows, _max_context(offs, windows)):
            max_ctx[w] = m

    stats = {
        "examples": len(examples),
        "windows": len(ids),
        "questions_truncated": n_cut,
        "windows_dropped_without_answer": n_dropped,
        "windows_labelled_null": n_null,
        "examples_without_window": len(examples) - len(by_example),
        "mean_window_tokens": float(np.mean([len(x) for x in ids])) if ids else 0.0,
    }
    if train:
        # Questions none of whose windows holds their label: with `drop` they have no window, with
        # `cls` only [CLS] windows.
        holds = {ex for ex, s, c in zip(ex_idx, starts, cls_idx) if s != c}
        stats["examples_without_answer_window"] = len(examples) - len(holds)
        # v1 windows all labelled [CLS] would train a model that never sees an answer span.
        if not ids or (version == 1 and not holds):
            raise DataError(source, None, "no training window contains its answer; check data.max_seq_len/data.stride")
    return QAFeatures(
        input_ids=ids, token_type_ids=types if has_types else None, offsets=offs, max_context=max_ctx,
        cls_index=np.array(cls_idx, dtype=np.int64), example_index=ex_idx_arr,
        start_positions=np.array(starts, dtype=np.int64), end_positions=np.array(ends, dtype=np.int64),
        stats=stats, question_mask=qmask, null_candidate=train and n_null > 0)


def window_lengths(examples: list[QAExample], tokenizer, *, max_seq_len: int = 384, stride: int = 128,
                   max_query_len: int = 64, context_first: str = "auto",
                   source: str = "<examples>") -> tuple[np.ndarray, np.ndarray]:
    """(lengths (n,), example_index (n,)) of the windows `build_qa_features(..., train=False)` makes,
    without building them (evaluation windows are never dropped: one per tokenizer window)."""
    check_fast_tokenizer(tokenizer)
    if not examples:
        raise DataError(source, None, "no examples to build features from")
    enc, _ = _encode(examples, tokenizer, max_seq_len=max_seq_len, stride=stride,
                     max_query_len=max_query_len, ctx_first=resolve_context_first(tokenizer, context_first),
                     source=source, offsets=False)
    lengths = np.array([len(x) for x in enc["input_ids"]], dtype=np.int64)
    return lengths, np.array(enc["overflow_to_sample_mapping"], dtype=np.int64)


def example_chunks(examples: list[QAExample], max_chars: int) -> list[tuple[int, int]]:
    """Consecutive [lo, hi) slices of examples holding at most `max_chars` characters of question and
    context each (one example at least, however long)."""
    chunks, lo, chars = [], 0, 0
    for i, e in enumerate(examples):
        n = len(e.context) + len(e.question)
        if i > lo and chars + n > max_chars:
            chunks.append((lo, i))
            lo, chars = i, 0
        chars += n
    if lo < len(examples):
        chunks.append((lo, len(examples)))
    return chunks


class StreamedFeatures:
    """The evaluation windows of many examples, built on demand instead of all at once.

    A first pass tokenizes the examples `chunk_chars` characters at a time and keeps only each
    window's length and example (16 bytes a window). `select(idx)` then builds the windows a batch
    needs from their examples and keeps the examples' windows in a small cache, so memory follows
    the batches in flight instead of the file (a window of BERT features with its Python
    intermediates costs ~0.5 KB a token; SQuAD dev has 2-4 million window tokens).

    Window numbering, windows and example indices equal those of
    `build_qa_features(examples, train=False)`, so a caller batching by `lengths` runs exactly the
    batches it would run on the full features.

    Attributes:
        lengths: (n,) tokens of each window.
        example_index: (n,) example of each window (non-decreasing).
    """

    def __init__(self, examples: list[QAExample], tokenizer, *, chunk_chars: int = 1 << 18,
                 cache_tokens: int = 1 << 18, **options):
        """options: the window keywords of `build_qa_features` (max_seq_len, stride, max_query_len,
        context_first, source)."""
        self.examples, self.tokenizer, self.options = examples, tokenizer, options
        self.cache_tokens = cache_tokens
        chunks = example_chunks(examples, chunk_chars) or [(0, 0)]  # no examples: window_lengths raises
        parts = [window_lengths(examples[lo:hi], tokenizer, **options) for lo, hi in chunks]
        self.lengths = np.concatenate([n for n, _ in parts])
        self.example_index = np.concatenate([ex + lo for (_, ex), (lo, _) in zip(parts, chunks)])
        counts = np.bincount(self.example_index, minlength=len(examples))
        self._first = np.r_[0, np.cumsum(counts)[:-1]]  # (examples,) number of the example's first window
        self._left = counts.copy()  # windows of each example not selected yet
        self._tokens = np.bincount(self.example_index, weights=self.lengths, minlength=len(examples))
        self._cache: dict[int, QAFeatures] = {}  # example -> its windows (insertion order = last use)

    def __len__(self) -> int:
        return len(self.lengths)

    def _trim(self, keep: int | None) -> None:
        """Over budget: drop the least recently used examples but `keep`; their remaining windows are
        rebuilt when asked for."""
        held = sum(self._tokens[e] for e in self._cache)
        for e in list(self._cache):
            if held <= self.cache_tokens:
                break
            if e != keep:
                held -= self._tokens[e]
                del self._cache[e]

    def select(self, idx) -> QAFeatures:
        """Windows `idx` (file numbering), in that order; example indices are the file's.

        Meant for a loop that selects each window once: an example leaves the cache as soon as all
        its windows were selected (selecting one again rebuilds it).
        """
        idx = np.asarray(idx, dtype=np.int64)
        ex = self.example_index[idx]
        need = np.unique(ex).tolist()
        windows = (idx - self._first[ex]).tolist()
        picked: dict[tuple[int, int], tuple] = {}  # (example, window) -> its fields
        # One example at a time, the cache trimmed after each: a batch of the last windows of many long
        # examples (they sort together) never holds every one of those examples' windows at once.
        wanted: dict[int, set] = {}
        for x, w in zip(ex.tolist(), windows):
            wanted.setdefault(x, set()).add(w)

        def take(e: int, feats: QAFeatures) -> None:
            for w in wanted[e]:
                picked[e, w] = (feats.input_ids[w], None if feats.token_type_ids is None else feats.token_type_ids[w],
                                feats.offsets[w], feats.max_context[w], int(feats.cls_index[w]),
                                feats.question_mask[w])
            self._cache[e] = feats  # most recently used last
            self._trim(keep=e)

        cached = [e for e in need if e in self._cache]
        for e in cached:
            take(e, self._cache.pop(e))
        missing = [e for e in need if e not in set(cached)]
        # Examples are built together up to the cache's token budget (one tokenizer call for many
        # short ones), a long one alone.
        groups, group, tokens = [], [], 0
        for e in missing:
            if group and tokens + self._tokens[e] > self.cache_tokens:
                groups.append(group)
                group, tokens = [], 0
            group.append(e)
            tokens += self._tokens[e]
        if group:
            groups.append(group)
        for group in groups:
            built = build_qa_features([self.examples[e] for e in group], self.tokenizer, train=False, **self.options)
            for j, e in enumerate(group):
                take(e, built.select(np.flatnonzero(built.example_index == j)))
            del built
        rows = [picked[e, w] for e, w in zip(ex.tolist(), windows)]
        out = QAFeatures(
            input_ids=[r[0] for r in rows],
            token_type_ids=None if rows[0][1] is None else [r[1] for r in rows],
            offsets=[r[2] for r in rows], max_context=[r[3] for r in rows],
            cls_index=np.array([r[4] for r in rows], dtype=np.int64), example_index=ex,
            start_positions=np.full(len(idx), -1, np.int64), end_positions=np.full(len(idx), -1, np.int64),
            question_mask=[r[5] for r in rows])
        np.subtract.at(self._left, ex, 1)
        for e in need:
            if self._left[e] <= 0:  # every window of the example is done
                self._cache.pop(e, None)
        self._trim(keep=ex[-1].item() if len(ex) else None)
        return out
