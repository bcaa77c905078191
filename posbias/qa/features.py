"""QA examples -> windows (features): sliding windows, offsets back to context characters, labels.

Shape legend: n windows; L_i tokens in window i (no padding is stored: padding happens per batch).
Each window is `[CLS] question [SEP] context-part [SEP]` (or context first for tokenizers that pad
on the left, like XLNet), so a long context becomes several overlapping windows (`stride`).
Windows are assembled from each question and each context tokenized once (`PairLayout`,
`TokenizedTexts`): SQuAD asks ~5 questions of a paragraph, and the pair encoding would tokenize
the paragraph again for each. Tokenizers the layout does not describe get the tokenizer's own windows.
"""
from __future__ import annotations

import random
import warnings
import weakref
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


def _max_context(offsets: list[np.ndarray], example_index) -> list[np.ndarray]:
    """Mark, in every window, the context tokens to which this window gives maximal context.

    Score of a token in a window = min(tokens left, tokens right) + 0.01 * window context length
    (Devlin et al.'s run_squad rule), compared across the windows of one example. Tokens are
    identified across windows by their character start. One sort for all the windows: (example,
    character start), then descending score, then the earlier window (the stable original's tie rule).
    Returns a bool array per window.
    """
    lengths = np.array([len(o) for o in offsets], dtype=np.int64)  # (windows,)
    if not len(offsets):
        return []
    every = np.concatenate(offsets)  # (tokens, 2) all windows' offsets
    flat = np.flatnonzero(every[:, 0] >= 0)  # (ctx tokens,) index of each context token in `every`
    owner = np.repeat(np.arange(len(offsets)), lengths)[flat]  # its window
    n = np.bincount(owner, minlength=len(offsets))  # (windows,) context tokens of each window
    rank = np.arange(len(flat)) - (np.cumsum(n) - n)[owner]  # position among its window's context
    size = n[owner]
    scores = np.minimum(rank, size - 1 - rank) + 0.01 * size
    keys = every[flat, 0]
    example = np.asarray(example_index, dtype=np.int64)[owner]
    order = np.lexsort((owner, -scores, keys, example))
    first = np.ones(len(order), bool)
    first[1:] = (keys[order][1:] != keys[order][:-1]) | (example[order][1:] != example[order][:-1])
    mask = np.zeros(int(lengths.sum()), bool)
    mask[flat[order][first]] = True
    return [m.copy() for m in np.split(mask, np.cumsum(lengths)[:-1])]


@dataclass(frozen=True)
class PairLayout:
    """Where a tokenizer puts the special tokens of a pair: ids (and token types) before, between
    and after the two sequences, and the token type of each sequence.

    A fast tokenizer encodes a pair as each text encoded alone, then truncated, then this template
    put around the two (the tokenizers library's order: encode, truncate, post-process). So the
    windows of `tokenizer(question, context, return_overflowing_tokens=True)` can be assembled from
    the question and the context tokenized once each, however many questions share a context.
    """

    parts: tuple[np.ndarray, np.ndarray, np.ndarray]
    part_types: tuple[np.ndarray, np.ndarray, np.ndarray] | None  # None: the tokenizer has no type ids
    seq_types: tuple[int, int]

    @property
    def added(self) -> int:
        return sum(len(p) for p in self.parts)


_LAYOUTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# Two pairs of different lengths: a layout that depended on the texts would differ between them.
_PROBES = (("what is it?", "a b c d e f"), ("who", "one two three four five six seven"))


def pair_layout(tokenizer) -> PairLayout | None:
    """The tokenizer's `PairLayout`, or None when its pairs are not a fixed template around the two
    sequences encoded alone (ids, types and offsets compared on two probe pairs), or when it
    truncates on the left: windows then come from the tokenizer itself (`_encode`)."""
    if getattr(tokenizer, "truncation_side", "right") != "right":
        return None
    try:
        return _LAYOUTS[tokenizer]
    except KeyError:
        pass
    except TypeError:  # not weak-referenceable or not hashable: probe each time
        return _probe_layout(tokenizer)
    layout = _LAYOUTS[tokenizer] = _probe_layout(tokenizer)
    return layout


def _probe_layout(tokenizer) -> PairLayout | None:
    found = []
    for a, b in _PROBES:
        try:
            pair = tokenizer(a, b, return_offsets_mapping=True, return_attention_mask=False)
            alone = [{"input_ids": ids.tolist(), "offset_mapping": offs.tolist()}
                     for ids, offs in TokenizedTexts(tokenizer).tokens_of([a, b])]
        except Exception:  # noqa: BLE001  (any failure: the tokenizer's own windows are used)
            return None
        ids, seq = pair["input_ids"], pair.sequence_ids(0)
        spans = []
        for k in (0, 1):
            at = [i for i, x in enumerate(seq) if x == k]
            if not at or at != list(range(at[0], at[-1] + 1)):
                return None
            if ids[at[0]:at[-1] + 1] != alone[k]["input_ids"]:
                return None
            if [tuple(x) for x in pair["offset_mapping"][at[0]:at[-1] + 1]] != [tuple(x) for x in alone[k]["offset_mapping"]]:
                return None
            spans.append((at[0], at[-1] + 1))
        (a0, a1), (b0, b1) = spans
        if a1 > b0:
            return None
        cuts = ((0, a0), (a1, b0), (b1, len(ids)))
        parts = tuple(tuple(ids[lo:hi]) for lo, hi in cuts)
        if "token_type_ids" in pair:
            types = pair["token_type_ids"]
            if len(set(types[a0:a1])) != 1 or len(set(types[b0:b1])) != 1:
                return None
            part_types = tuple(tuple(types[lo:hi]) for lo, hi in cuts)
            seq_types = (types[a0], types[b0])
        else:
            part_types, seq_types = None, (0, 0)
        found.append((parts, part_types, seq_types))
    if found[0] != found[1]:
        return None
    parts, part_types, seq_types = found[0]
    def arr(xs):
        return tuple(np.array(x, dtype=np.int64) for x in xs)

    return PairLayout(arr(parts), arr(part_types) if part_types is not None else None, seq_types)


class TokenizedTexts:
    """Token ids and character offsets of texts tokenized alone (no special tokens), each distinct
    text once while it stays among the most recently used `max_tokens` tokens (12 bytes a token).

    SQuAD asks ~5 questions of each paragraph: the windows of all of them reuse one tokenization.
    """

    def __init__(self, tokenizer, max_tokens: int = 1 << 21):
        self.tokenizer, self.max_tokens = tokenizer, max_tokens
        self._held: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # text -> (ids, offsets); last used last
        self._tokens = 0

    def _backend(self):
        """The Rust tokenizer, where calling it directly is exactly what `tokenizer(texts,
        add_special_tokens=False)` does, minus transformers' conversion of every encoding to Python
        lists: no truncation or padding left set on it by an earlier call (transformers sets them per
        call and leaves them), special tokens split as transformers would, and transformers' own
        `_encode_plus` (no tokenizer class of its own in between). Else None."""
        from transformers import PreTrainedTokenizerFast

        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if (backend is None or type(self.tokenizer)._encode_plus is not PreTrainedTokenizerFast._encode_plus
                or backend.truncation is not None or backend.padding is not None
                or backend.encode_special_tokens != bool(getattr(self.tokenizer, "split_special_tokens", False))):
            return None
        return backend

    def tokens_of(self, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        """(ids (L,) int32, offsets (L, 2) int32) of each text."""
        missing = list(dict.fromkeys(t for t in texts if t not in self._held))
        got = {}
        if missing:
            backend = self._backend()
            if backend is not None:
                encoded = ((e.ids, e.offsets) for e in backend.encode_batch(missing, add_special_tokens=False))
            else:
                # verbose=False: a context longer than the model is expected here (it becomes windows)
                enc = self.tokenizer(missing, add_special_tokens=False, return_offsets_mapping=True,
                                     return_attention_mask=False, return_token_type_ids=False, verbose=False)
                encoded = zip(enc["input_ids"], enc["offset_mapping"])
            for t, (ids, offs) in zip(missing, encoded):
                got[t] = (np.array(ids, dtype=np.int32), np.array(offs, dtype=np.int32).reshape(-1, 2))
        out = []
        for t in texts:
            hit = self._held.pop(t, None)
            if hit is None:
                hit = got[t]
                self._tokens += len(hit[0])
            self._held[t] = hit  # most recently used last
            out.append(hit)
        if self._tokens > self.max_tokens:
            for t in list(self._held):
                if self._tokens <= self.max_tokens:
                    break
                self._tokens -= len(self._held.pop(t)[0])
        return out


def _window_spans(n_other: int, n: int, *, added: int, max_seq_len: int, stride: int) -> list[tuple[int, int]] | None:
    """[start, stop) token spans of the truncated sequence (n tokens) in each window beside the other
    sequence (n_other tokens): the tokenizers library's `truncate` with overflow (windows every
    budget - stride tokens until one reaches the end). None where the tokenizer would fail."""
    total = n_other + n + added
    if total <= max_seq_len:
        return [(0, n)]
    budget = n - (total - max_seq_len)
    if budget <= 0 or stride >= budget:
        return None  # the tokenizer raises: `_encode` reports it
    spans, start = [], 0
    while True:
        stop = min(start + budget, n)
        spans.append((start, stop))
        if stop == n:
            return spans
        start += budget - stride


def _encode_spans(examples: list[QAExample], texts: TokenizedTexts, layout: PairLayout, *, max_seq_len: int,
                  stride: int, max_query_len: int, ctx_first: bool):
    """`_encode`'s windows as (example, question tokens, context tokens, [start, stop) of the context)
    from texts tokenized alone, plus the number of questions cut; None where the tokenizer would
    fail (`_encode` then raises its error)."""
    questions = [e.question.lstrip() for e in examples]  # as `_encode`
    q_tok = texts.tokens_of(questions)
    cut = {i: q[: int(t[1][max_query_len - 1, 1])] for i, (q, t) in enumerate(zip(questions, q_tok))
           if len(t[0]) > max_query_len}
    if cut:  # `_truncate_questions`: the cut text is tokenized again
        for i, t in zip(cut, texts.tokens_of(list(cut.values()))):
            q_tok[i] = t
    c_tok = texts.tokens_of([e.context for e in examples])
    windows = []
    for i, (q, c) in enumerate(zip(q_tok, c_tok)):
        spans = _window_spans(len(q[0]), len(c[0]), added=layout.added, max_seq_len=max_seq_len, stride=stride)
        if spans is None:
            return None
        windows.extend((i, q, c, a, b) for a, b in spans)
    return windows, len(cut)


def _assemble(windows, layout: PairLayout, *, ctx_first: bool, cls_id: int | None):
    """Per window: input_ids, token_type_ids (or None), offsets (-1 outside the context), question
    mask and [CLS] position, as `build_qa_features` reads them from the tokenizer's encoding."""
    (pre, mid, suf), part_types = layout.parts, layout.part_types
    t_first, t_second = layout.seq_types
    # [CLS] in the template before both sequences: its first position is fixed
    fixed_cls = next((i for i, x in enumerate(pre.tolist()) if x == cls_id), None)
    ids, types, offs, qmask, cls_idx = [], [], [], [], []
    for _, (q_ids, _), (c_ids, c_off), a, b in windows:
        first, second = (c_ids[a:b], q_ids) if ctx_first else (q_ids, c_ids[a:b])
        x = np.concatenate([pre, first, mid, second, suf])  # int64: the template's dtype wins
        lo1 = len(pre)
        lo2 = lo1 + len(first) + len(mid)
        (c_lo, c_hi), (q_lo, q_hi) = ((lo1, lo1 + len(first)), (lo2, lo2 + len(second))) if ctx_first else \
            ((lo2, lo2 + len(second)), (lo1, lo1 + len(first)))
        o = np.full((len(x), 2), -1, np.int64)
        o[c_lo:c_hi] = c_off[a:b]
        m = np.zeros(len(x), bool)
        m[q_lo:q_hi] = True
        ids.append(x)
        offs.append(o)
        qmask.append(m)
        if part_types is not None:
            pt0, pt1, pt2 = part_types
            types.append(np.concatenate([pt0, np.full(len(first), t_first, np.int64), pt1,
                                         np.full(len(second), t_second, np.int64), pt2]))
        if fixed_cls is None:
            cls = np.flatnonzero(x == cls_id) if cls_id is not None else ()
            cls_idx.append(int(cls[0]) if len(cls) else 0)
        else:
            cls_idx.append(fixed_cls)
    return ids, types if part_types is not None else None, offs, qmask, cls_idx


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


def _windows(examples: list[QAExample], tokenizer, *, max_seq_len: int, stride: int, max_query_len: int,
             ctx_first: bool, source: str, texts: TokenizedTexts | None = None) -> dict:
    """Every window of the examples, before labels: input_ids, token_type_ids (None without),
    offsets (-1 outside the context), question_mask, cls_index, example_index (lists, one entry
    a window) and questions_cut. Assembled from each text tokenized once (`PairLayout`) where the
    tokenizer allows, else read from its pair encoding (`_encode`); the two agree to the token."""
    cls_id = tokenizer.cls_token_id
    layout = pair_layout(tokenizer)
    found = None
    if layout is not None:
        found = _encode_spans(examples, texts or TokenizedTexts(tokenizer), layout, max_seq_len=max_seq_len,
                              stride=stride, max_query_len=max_query_len, ctx_first=ctx_first)
    if found is not None:
        spans, n_cut = found
        ids, types, offs, qmask, cls_idx = _assemble(spans, layout, ctx_first=ctx_first, cls_id=cls_id)
        return {"input_ids": ids, "token_type_ids": types, "offsets": offs, "question_mask": qmask,
                "cls_index": cls_idx, "example_index": [w[0] for w in spans], "questions_cut": n_cut}
    enc, n_cut = _encode(examples, tokenizer, max_seq_len=max_seq_len, stride=stride,
                         max_query_len=max_query_len, ctx_first=ctx_first, source=source)
    ctx_seq = 0 if ctx_first else 1
    has_types = "token_type_ids" in enc
    out = {"input_ids": [], "token_type_ids": [] if has_types else None, "offsets": [], "question_mask": [],
           "cls_index": [], "example_index": list(enc["overflow_to_sample_mapping"]), "questions_cut": n_cut}
    for w in range(len(out["example_index"])):
        seq_ids = enc.sequence_ids(w)
        o = np.array(enc["offset_mapping"][w], dtype=np.int64).reshape(-1, 2)
        o[np.array([s != ctx_seq for s in seq_ids])] = -1
        input_ids = np.array(enc["input_ids"][w], dtype=np.int64)
        cls = np.flatnonzero(input_ids == cls_id) if cls_id is not None else np.array([], int)
        out["input_ids"].append(input_ids)
        if has_types:
            out["token_type_ids"].append(np.array(enc["token_type_ids"][w], dtype=np.int64))
        out["offsets"].append(o)
        out["question_mask"].append(np.array([sid == 1 - ctx_seq for sid in seq_ids], dtype=bool))
        out["cls_index"].append(int(cls[0]) if len(cls) else 0)
    return out


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
    texts: TokenizedTexts | None = None,
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
        texts: texts tokenized earlier, to reuse (`StreamedFeatures`); else a new store.
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
    windows = _windows(examples, tokenizer, max_seq_len=max_seq_len, stride=stride, max_query_len=max_query_len,
                       ctx_first=ctx_first, source=source, texts=texts)
    n_cut = windows.pop("questions_cut")

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
    has_types = windows["token_type_ids"] is not None
    for w, ex in enumerate(windows["example_index"]):
        o, input_ids, c = windows["offsets"][w], windows["input_ids"][w], windows["cls_index"][w]
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
        types.append(windows["token_type_ids"][w] if has_types else None)
        offs.append(o)
        qmask.append(windows["question_mask"][w])
        cls_idx.append(c)
        ex_idx.append(ex)
        starts.append(s)
        ends.append(t)

    ex_idx_arr = np.array(ex_idx, dtype=np.int64)
    max_ctx = _max_context(offs, ex_idx_arr)

    stats = {
        "examples": len(examples),
        "windows": len(ids),
        "questions_truncated": n_cut,
        "windows_dropped_without_answer": n_dropped,
        "windows_labelled_null": n_null,
        "examples_without_window": len(examples) - len(np.unique(ex_idx_arr)),
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
                   max_query_len: int = 64, context_first: str = "auto", source: str = "<examples>",
                   texts: TokenizedTexts | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(lengths (n,), example_index (n,)) of the windows `build_qa_features(..., train=False)` makes,
    without building them (evaluation windows are never dropped: one per tokenizer window).
    `texts`: as `build_qa_features`'s, which then reuses what this call tokenized."""
    check_fast_tokenizer(tokenizer)
    if not examples:
        raise DataError(source, None, "no examples to build features from")
    ctx_first = resolve_context_first(tokenizer, context_first)
    layout = pair_layout(tokenizer)
    if layout is not None:
        found = _encode_spans(examples, texts or TokenizedTexts(tokenizer), layout, max_seq_len=max_seq_len,
                              stride=stride, max_query_len=max_query_len, ctx_first=ctx_first)
        if found is not None:
            spans = found[0]
            lengths = [layout.added + len(q[0]) + b - a for _, q, _, a, b in spans]
            return np.array(lengths, dtype=np.int64), np.array([w[0] for w in spans], dtype=np.int64)
    enc, _ = _encode(examples, tokenizer, max_seq_len=max_seq_len, stride=stride, max_query_len=max_query_len,
                     ctx_first=ctx_first, source=source, offsets=False)
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
                 cache_tokens: int = 1 << 18, text_cache_tokens: int = 1 << 21, **options):
        """options: the window keywords of `build_qa_features` (max_seq_len, stride, max_query_len,
        context_first, source). text_cache_tokens: tokens of tokenized questions and contexts kept
        from the first pass for the windows' building (`TokenizedTexts`)."""
        self.examples, self.tokenizer = examples, tokenizer
        self.options = {**options, "texts": TokenizedTexts(tokenizer, text_cache_tokens)}
        self.cache_tokens = cache_tokens
        chunks = example_chunks(examples, chunk_chars) or [(0, 0)]  # no examples: window_lengths raises
        parts = [window_lengths(examples[lo:hi], tokenizer, **self.options) for lo, hi in chunks]
        self.lengths = np.concatenate([n for n, _ in parts])
        self.example_index = np.concatenate([ex + lo for (_, ex), (lo, _) in zip(parts, chunks)])
        counts = np.bincount(self.example_index, minlength=len(examples))
        self._first = np.r_[0, np.cumsum(counts)[:-1]]  # (examples,) number of the example's first window
        self._left = counts.copy()  # windows of each example not selected yet
        self._tokens = np.bincount(self.example_index, weights=self.lengths, minlength=len(examples))
        self._cache: dict[int, QAFeatures] = {}  # example -> its windows (insertion order = last use)
        self._held = 0.0  # tokens of the cached examples' windows

    def __len__(self) -> int:
        return len(self.lengths)

    def _trim(self, keep: int | None) -> None:
        """Over budget: drop the least recently used examples but `keep`; their remaining windows are
        rebuilt when asked for."""
        for e in list(self._cache):
            if self._held <= self.cache_tokens:
                break
            if e != keep:
                self._pop(e)

    def _put(self, e: int, feats: QAFeatures) -> None:
        self._cache[e] = feats  # most recently used last
        self._held += self._tokens[e]

    def _pop(self, e: int) -> QAFeatures | None:
        feats = self._cache.pop(e, None)
        if feats is not None:
            self._held -= self._tokens[e]
        return feats

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
            self._put(e, feats)
            self._trim(keep=e)

        cached = [e for e in need if e in self._cache]
        for e in cached:
            take(e, self._pop(e))
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
                self._pop(e)
        self._trim(keep=ex[-1].item() if len(ex) else None)
        return out
