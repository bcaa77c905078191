"""De-biasing objectives for span heads with start and end distributions (`train.debias`): the
baselines of Ko et al., "Look at the First Sentence: Position Bias in Question Answering" (EMNLP
2020, §5; authors' code github dmis-lab/position-bias), built on Clark et al., "Don't Take the
Easy Way Out: Ensemble Based Methods for Avoiding Known Dataset Biases" (EMNLP 2019, §3.2).

The bias model b is the answer-position prior of the training windows (`answer_prior`). With the
main model's log p = log_softmax(logits) over the head's own candidates, for start and end alike:

    bias_product     L = CE(log p + log b)                          Clark §3.2.1 (b as a product of experts)
                     (`bias_term: probability`: log b replaced by b, as the authors' code; below)
    learned_mixin    L = CE(log p + g(x) log b),  g(x) = softplus(w·h + c) >= 0    Clark §3.2.2
    learned_mixin_h  L_mixin + w_H · H(softmax(g(x) log b))         Clark §3.2.3 (the entropy penalty)
    entropy          L = L_head - λ · H(softmax_t cos(e_t, h_t))    Ko et al.'s entropy regularisation,
                     in the form of the authors' code (`BertForQuestionAnsweringEval.cos_entropy_loss`,
                     model_type bert_reg, λ = 8): e_t the token's word embedding, h_t its last hidden
                     state; maximising the entropy spreads the word information evenly over positions.

Start and end losses are averaged (the heads' Eq. 1-2); entropy terms are averaged over the batch.
Every softmax runs over the head's own candidate mask (`head_mask`), the positions its own loss
normalises over; the authors' code normalised over every padded position, which under posbias's
per-batch padding would make the loss depend on the batch's make-up.

Training only: `QAModel.forward` uses these for the loss when targets are given and never touches
the scores, so decoding (evaluation, prediction) sees the main model alone. The learned-mixin gate
(w, c) is a parameter of the checkpoint (a resumed run needs it) that no prediction reads.

The prior, `train.debias.prior`, and where it follows or leaves the paper and its code:
- `token` (default; `answer_prior`): indexed by the token's offset in its window's context part,
  P(start = j-th context token), L = data.max_seq_len offsets. The paper's priors are word and
  sentence level; the authors' code looks its "word" statistics up by subword-token index
  (`convert_examples_to_features_word`) and writes them from the window's first context token on
  (index i of the window's context, for every window), with non-context tokens getting none.
  posbias's heads predict tokens, so the prior is counted on the token labels themselves.
- `sentence` (`sentence_prior`): indexed by the sentence of the context a token lies in,
  P(start in sentence k), L = SENTENCE_BUCKETS outcomes. A token's sentence is
  `posbias.qa.sentences.sentence_index(context, c)` (1-based, sentencex) of its first character c,
  sentences k >= SENTENCE_BUCKETS sharing the last bucket; the counts are of the sentences of the
  labelled start and end tokens. Every context token of sentence k then gets sentence k's value,
  start and end separately: the authors' `answer_stat` (`--all_bound True`, `${K}_stat.p`, read
  in `utils_squad.py` `read_squad_examples_opt`), which gives each word of sentence k the statistic
  of key k. Differences: they count one answer per question over SQuAD train, posbias one label
  per training window (with the null below), from the windows' own labels; their sentence index
  is 0-based and uncapped (keys 0 .. 20 for SQuAD train), sentences without a count getting 0.
  The sentence is the context's, not the window's: the later windows of a long context start in
  a later sentence. The lookup table of every training window's tokens (`sentence_columns`) is
  built with the prior from the examples' contexts and found by the batch's `window` indices;
  evaluation never builds it.
- The offset or sentence is the token's place in the window (the index the labels use), not the
  position id the encoder sees: Random Padding and RPP shift position ids but move no answer (and
  no token out of its sentence), so the prior still describes where answers are, and a clean and
  a perturbed pass of the same batch (augment mode) share it. A prior looked up at shifted ids
  would be off by the shift (k ~ U{0 .. n - m}).
- [CLS] labels (SQuAD v2 null answers, and windows without the answer under
  `data.unanswerable_windows: cls`) count as one more outcome, `null`, read at [CLS].
- Add-α (Laplace) smoothing over the L offsets or sentence buckets and the null:
  p = (count + α) / (N + α (L + 1)), N training windows, α = `train.debias.smoothing` (default 1).
  Candidates that are neither context nor [CLS] (the question under `softmax_over: all`) get the
  probability of an unseen outcome, α / (N + α (L + 1)). The authors' code adds unsmoothed
  probabilities, not their logarithms, to the log-softmax; posbias follows Clark et al.'s log b by
  default, and adds b itself under `train.debias.bias_term: probability`. The two differ in
  strength: on first-sentence answers only, the authors' sentence statistics are {sentence 1: 1.0},
  a +1 on sentence 1's tokens and 0 elsewhere (e^1 between them), where log b puts sentence 2 and
  later about log(N / α) below sentence 1 (8 nats for 3,000 windows). Under `probability` the
  authors' 0 for [CLS] and the question are the smoothed null and unseen probabilities (≈ α / N).

Shape legend: b batch, s sequence, d hidden, L prior length (data.max_seq_len, or SENTENCE_BUCKETS),
n training windows, W the longest training window.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ..errors import ConfigError, TrainingError
from ..registry import HEADS as REGISTERED_HEADS
from .heads.pointer import upcast
from .heads.span_scores import softmax_mask
from .sentences import sentence_starts

METHODS = ("bias_product", "learned_mixin", "learned_mixin_h", "entropy")
MIXIN = ("learned_mixin", "learned_mixin_h")
GATES = ("cls", "max")
ENTROPY_WEIGHT = 8.0  # λ of the authors' `cos_entropy_loss` (param=8)
# A head registered with `debias=True` (`posbias.registry.HEADS`) has a loss CE(start) + CE(end)
# over one candidate mask, with those logits as its scores: independent, dynamic_query,
# conditional_pointer. MaP (`matrix`) is not among them: its end distribution is one per start row
# (Eq. 7), trained on the gold row over sampled columns, so there is no end distribution for a
# position prior to multiply.

PRIOR_METHODS = ("bias_product", *MIXIN)  # the methods whose bias model is the answer prior
PRIORS = ("token", "sentence")  # train.debias.prior
BIAS_TERMS = ("log", "probability")  # train.debias.bias_term
NULL, UNSEEN, OFFSET = 0, 1, 2  # columns of the log-prior table: [CLS], other tokens, context offsets
# Sentences 1 .. 31 and "32+" of the sentence prior. Above every answer sentence of SQuAD train (the
# authors' statistics stop at their 0-based key 20; 17 in the bundled slice), so the cap only merges
# the rare tail of long contexts (MRQA's TriviaQA, NewsQA), whose few counts would otherwise each
# be smoothing-dominated outcomes of their own; small enough for one byte a token in the lookup.
SENTENCE_BUCKETS = 32


# ------------------------------------------------------------------------------------------ config
def check_config(debias, head: str) -> None:
    """Check `train.debias` (a `DebiasConfig`) for the run's head and fill in its defaults; each
    error names the dotted key. The ranges of `smoothing` and `entropy_weight` are declared on
    `DebiasConfig`'s fields."""
    if debias.method not in METHODS:
        raise ConfigError(f"train.debias.method must be one of {list(METHODS)}, got {debias.method!r}")
    if not REGISTERED_HEADS.traits(head, "model.head").get("debias"):
        raise ConfigError(f"train.debias: head {head!r} cannot take de-biasing (it needs start and end "
                          f"distributions over positions); use one of {REGISTERED_HEADS.with_trait('debias')}")
    w = debias.entropy_weight
    if debias.method == "entropy":
        debias.entropy_weight = ENTROPY_WEIGHT if w is None else w
    elif debias.method == "learned_mixin_h":
        if w is None:
            raise ConfigError("train.debias.entropy_weight must be set for learned_mixin_h (Clark et al.'s w, "
                              "tuned on held-out data; neither paper gives a value)")
    elif w is not None:
        raise ConfigError(f"train.debias.entropy_weight is read by entropy and learned_mixin_h only, not "
                          f"{debias.method}")
    if debias.method in MIXIN:
        debias.gate = debias.gate or "cls"
        if debias.gate not in GATES:
            raise ConfigError(f"train.debias.gate must be one of {list(GATES)}, got {debias.gate!r}")
        debias.gate_bias = bool(debias.gate_bias)  # None: no bias term (Clark et al.; before version 3: one)
    elif debias.gate is not None or debias.gate_bias is not None:
        key = "gate" if debias.gate is not None else "gate_bias"
        raise ConfigError(f"train.debias.{key} is read by learned_mixin and learned_mixin_h only, not {debias.method}")
    if debias.prior not in PRIORS:
        raise ConfigError(f"train.debias.prior must be one of {list(PRIORS)}, got {debias.prior!r}")
    if debias.prior != "token" and debias.method not in PRIOR_METHODS:
        raise ConfigError(f"train.debias.prior is read by {', '.join(PRIOR_METHODS)} only, not {debias.method}")
    if debias.bias_term not in BIAS_TERMS:
        raise ConfigError(f"train.debias.bias_term must be one of {list(BIAS_TERMS)}, got {debias.bias_term!r}")
    if debias.bias_term != "log" and debias.method not in PRIOR_METHODS:
        raise ConfigError(f"train.debias.bias_term is read by {', '.join(PRIOR_METHODS)} only, not {debias.method}")


# ------------------------------------------------------------------------------------------ prior
@dataclass
class AnswerPrior:
    """The answer-position prior of a training set (see the module docstring).

    Attributes:
        start, end: (L,) probability that the label is the j-th context token of its window
            (`level` token), or a token of the (j+1)-th sentence of its context (`level` sentence;
            the last entry: that sentence or a later one).
        null: probability of the [CLS] label (start and end alike).
        unseen: α / (N + α (L + 1)), the probability of an outcome never seen, for candidates that
            are neither context nor [CLS].
        windows: N, the training windows counted.
        smoothing: α.
        level: `token` or `sentence` (`train.debias.prior`).
        window_columns: sentence level, training only: (n, W) uint8, the log-table column of every
            token of every training window (`sentence_columns`), looked up by the batch's `window`.
            Not saved: a prior read from a checkpoint has none (and no prediction needs it).
    start.sum() + null == end.sum() + null == 1.
    """

    start: np.ndarray
    end: np.ndarray
    null: float
    unseen: float
    windows: int
    smoothing: float
    level: str = "token"
    window_columns: np.ndarray | None = field(default=None, repr=False, compare=False)

    def log_table(self) -> torch.Tensor:
        """(2, L + 2) log-probabilities: rows start, end; columns [CLS], unseen, offsets (or sentence
        buckets) 0 .. L-1."""
        rows = [np.concatenate([[self.null, self.unseen], p]) for p in (self.start, self.end)]
        return torch.log(torch.tensor(np.stack(rows), dtype=torch.float32))

    def to_dict(self) -> dict:
        index = ("token offset in the window's context" if self.level == "token" else
                 f"sentence of the context (1-based, sentencex) minus 1; the last entry: sentence {len(self.start)} "
                 f"and later")
        return {"level": self.level, "index": f"{index}; null = the [CLS] label",
                "smoothing": self.smoothing, "windows": self.windows, "null": self.null, "unseen": self.unseen,
                "start": self.start.tolist(), "end": self.end.tolist()}

    @classmethod
    def from_dict(cls, d: dict, source: str = "prior") -> "AnswerPrior":
        """A saved prior (`to_dict`), checked: positive probabilities that sum to 1."""
        try:
            start, end = (np.asarray(d[k], dtype=np.float64) for k in ("start", "end"))
            prior = cls(start, end, float(d["null"]), float(d["unseen"]), int(d["windows"]), float(d["smoothing"]),
                        d.get("level", "token"))  # saved before sentence priors existed: token
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"{source}: not an answer prior ({e})") from None
        if prior.level not in PRIORS:
            raise ConfigError(f"{source}: level must be one of {list(PRIORS)}, got {prior.level!r}")
        for name, p in (("start", start), ("end", end)):
            if p.ndim != 1 or len(p) == 0 or (p <= 0).any() or abs(p.sum() + prior.null - 1) > 1e-6:
                raise ConfigError(f"{source}: {name} must be positive probabilities summing with null to 1")
        return prior

    def summary(self) -> dict:
        """A few facts for run_info.json (the full prior is in each checkpoint's posbias_model.json).
        The modes are a context offset (token level) or a 1-based sentence (sentence level)."""
        first = 0 if self.level == "token" else 1
        return {"level": self.level, "windows": self.windows, "smoothing": self.smoothing, "null": round(self.null, 6),
                "start_mode": int(self.start.argmax()) + first, "end_mode": int(self.end.argmax()) + first,
                "length": len(self.start)}


def answer_prior(features, length: int, smoothing: float = 1.0) -> AnswerPrior:
    """The answer-position prior of labelled QA features (`build_qa_features(train=True)`).

    Args:
        features: QAFeatures with start/end labels (window token indices).
        length: L, the number of context offsets (data.max_seq_len: no window has more).
        smoothing: α of the add-α smoothing.
    """
    starts, ends, cls = features.start_positions, features.end_positions, features.cls_index
    if len(starts) == 0 or (starts < 0).any():
        raise ValueError("answer_prior needs labelled training features")
    null = starts == cls
    # Index of each window's first context token: labels become offsets in the context part.
    first = np.array([int(np.argmax(o[:, 0] >= 0)) for o in features.offsets], dtype=np.int64)
    n = len(starts)
    denom = n + smoothing * (length + 1)

    def dist(labels: np.ndarray) -> np.ndarray:
        offsets = np.clip(labels[~null] - first[~null], 0, length - 1)
        return (np.bincount(offsets, minlength=length)[:length] + smoothing) / denom

    return AnswerPrior(dist(starts), dist(ends), float((null.sum() + smoothing) / denom),
                       float(smoothing / denom), n, float(smoothing))


def prior_index(batch: dict, length: int) -> torch.Tensor:
    """(b, s) column of the log-prior table for each token of a batch: NULL at [CLS], OFFSET + j at
    the window's j-th context token (j capped at L - 1), UNSEEN elsewhere."""
    span, cls = batch["span_mask"].bool(), batch["cls_index"]
    rows = torch.arange(span.shape[0], device=span.device)
    is_cls = torch.zeros_like(span)
    is_cls[rows, cls] = True
    ctx = span & ~is_cls  # span_mask holds [CLS] too when some training window is labelled [CLS]
    offset = (ctx.long().cumsum(1) - 1).clamp(0, length - 1)  # (b, s): j of the j-th context token
    idx = torch.where(ctx, offset + OFFSET, torch.full_like(offset, UNSEEN))
    return idx.masked_fill(is_cls, NULL)


def sentence_columns(features, examples, buckets: int = SENTENCE_BUCKETS) -> np.ndarray:
    """(n, W) uint8: the sentence prior's log-table column of every token of every window.

    NULL at [CLS]; OFFSET + min(k, buckets) - 1 at a context token whose first character lies in
    the k-th sentence of its example's context (`posbias.qa.sentences.sentence_index`, 1-based);
    UNSEEN elsewhere (question, specials, and past the window's end up to W, the longest window).

    Args:
        features: QAFeatures (`offsets`, `example_index`, `cls_index`).
        examples: the examples the features were built from (`example_index` indexes them).
        buckets: sentences k >= buckets share the last bucket.
    """
    if not 1 <= buckets <= 255 - OFFSET:
        raise ValueError(f"sentence buckets must be in 1 .. {255 - OFFSET} (one byte a token), got {buckets}")
    width = int(features.lengths.max())
    columns = np.full((len(features), width), UNSEEN, dtype=np.uint8)
    starts: dict[int, np.ndarray] = {}  # example -> its sentences' first characters
    for i, offsets in enumerate(features.offsets):
        ex = int(features.example_index[i])
        if ex not in starts:
            starts[ex] = np.asarray(sentence_starts(examples[ex].context), dtype=np.int64)
        ctx = np.flatnonzero(offsets[:, 0] >= 0)
        # bisect_right over the sentence starts, as sentence_index: the 1-based sentence of each token.
        k = np.searchsorted(starts[ex], offsets[ctx, 0], side="right")
        columns[i, ctx] = OFFSET + np.minimum(k, buckets) - 1
        columns[i, features.cls_index[i]] = NULL
    return columns


def sentence_prior(features, examples, smoothing: float = 1.0, buckets: int = SENTENCE_BUCKETS) -> AnswerPrior:
    """The sentence-level answer prior of labelled QA features (`build_qa_features(train=True)`).

    The start and end distributions count the sentence bucket of each window's start and end label
    (its column in `sentence_columns`), [CLS] labels count as the null; add-α smoothing over the
    `buckets` sentence buckets and the null. The prior keeps the lookup table (`window_columns`).

    Args:
        features: QAFeatures with start/end labels (window token indices).
        examples: the examples the features were built from.
        smoothing: α of the add-α smoothing.
        buckets: sentences k >= buckets share the last bucket.
    """
    starts, ends, cls = features.start_positions, features.end_positions, features.cls_index
    if len(starts) == 0 or (starts < 0).any():
        raise ValueError("sentence_prior needs labelled training features")
    columns = sentence_columns(features, examples, buckets)
    null = starts == cls
    rows = np.flatnonzero(~null)
    n = len(starts)
    denom = n + smoothing * (buckets + 1)

    def dist(labels: np.ndarray) -> np.ndarray:
        bucket = columns[rows, labels[rows]].astype(np.int64) - OFFSET
        if (bucket < 0).any():  # a label off the context: not features build_qa_features makes
            raise ValueError("sentence_prior: a start or end label is neither [CLS] nor a context token")
        return (np.bincount(bucket, minlength=buckets) + smoothing) / denom

    return AnswerPrior(dist(starts), dist(ends), float((null.sum() + smoothing) / denom), float(smoothing / denom),
                       n, float(smoothing), "sentence", columns)


def window_prior_index(batch: dict, columns: torch.Tensor) -> torch.Tensor:
    """(b, s) column of the log-prior table for each token of a batch, read from a per-window table.

    Args:
        batch: a training batch of the features the table was built from (`posbias.qa.collate`):
            `window` (b,) their indices, `pad_left` (b,) the left padding that moves each row's
            tokens, `span_mask` (b, s) for the shape.
        columns: (n, W) the column of each token of each window (`sentence_columns`).
    """
    if "window" not in batch:
        raise TrainingError("train.debias.prior sentence: the batch has no `window` indices to look its "
                            "tokens' sentences up by (posbias.qa.collate makes them)")
    span = batch["span_mask"]
    rows = columns[batch["window"]].long()  # (b, W): the row of each window, unpadded
    width = rows.shape[1]
    j = torch.arange(span.shape[1], device=span.device)[None, :] - batch["pad_left"][:, None]  # (b, s): window token
    idx = rows.gather(1, j.clamp(0, width - 1))  # (b, s)
    return idx.masked_fill((j < 0) | (j >= width), UNSEEN)  # left padding (right padding is UNSEEN in the table)


# ------------------------------------------------------------------------------------- the losses
def masked_log_softmax(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(b, s) log-softmax over the positions where `mask` is True (others at the dtype's minimum)."""
    x = upcast(logits)
    return x.masked_fill(~mask, torch.finfo(x.dtype).min).log_softmax(-1)


def ensemble_cross_entropy(logits: torch.Tensor, log_bias: torch.Tensor, mask: torch.Tensor,
                           target: torch.Tensor) -> torch.Tensor:
    """Clark et al.'s ensemble loss: CE of softmax(log p_main + log_bias) over `mask`, batch mean.

    Args:
        logits: (b, s) the main model's scores.
        log_bias: (b, s) log b (bias product) or g(x) · log b (learned-mixin).
        mask: (b, s) bool, the candidates.
        target: (b,) gold positions.
    """
    combined = masked_log_softmax(logits, mask) + log_bias.to(upcast(logits).dtype)
    return F.cross_entropy(combined.masked_fill(~mask, torch.finfo(combined.dtype).min), target)


def masked_entropy(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(b,) entropy -Σ p log p of softmax(logits) over `mask`."""
    logp = masked_log_softmax(logits, mask)
    return -(logp.exp() * logp).masked_fill(~mask, 0.0).sum(-1)


def cosine_entropy(word_embeddings: torch.Tensor, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(b,) H(softmax_t cos(e_t, h_t)) over `mask`: the authors' entropy regulariser's term.

    Args:
        word_embeddings: (b, s, d) e_t, the word embedding of each input token.
        hidden: (b, s, d) h_t, the last layer's state of each token.
    """
    cos = F.cosine_similarity(upcast(word_embeddings), upcast(hidden), dim=-1)  # (b, s)
    return masked_entropy(cos, mask)


def head_mask(head, batch: dict) -> torch.Tensor:
    """(b, s) bool: the positions the head's own start/end softmax normalises over."""
    return softmax_mask(batch, getattr(head, "softmax_over", "context"), head.null_answer)


class Debias(nn.Module):
    """The training objective of `train.debias` for a QA model: the learned-mixin gate (a parameter)
    and the answer prior (a buffer left out of the state dict; checkpoints keep it as JSON), with, for
    the sentence prior, the sentence table of the training windows (never saved)."""

    def __init__(self, method: str, hidden_size: int, *, entropy_weight: float | None = None,
                 gate: str | None = None, gate_bias: bool = False, prior_level: str = "token",
                 bias_term: str = "log"):
        super().__init__()
        self.method, self.entropy_weight, self.gate_input = method, entropy_weight, gate or "cls"
        self.prior_level = prior_level  # train.debias.prior
        self.bias_term = bias_term  # train.debias.bias_term: log b or b added to the log-softmax
        # g(x) = softplus(w·h): Clark et al. §3.2.2; w·h of the [CLS] state (`cls`) or, as the
        # authors' code, its maximum over the tokens (`max`). `gate_bias` adds a bias c (runs before
        # config version 3 had one).
        self.gate = nn.Linear(hidden_size, 1, bias=gate_bias) if method in MIXIN else None
        self.register_buffer("log_prior", None, persistent=False)  # (2, L + 2), see AnswerPrior.log_table
        self.prior: AnswerPrior | None = None
        # Sentence prior: (n, W) its window_columns. A plain attribute, moved to the batch's device at
        # first use: as a buffer, DDP would broadcast its n × W bytes at every step.
        self.window_columns: torch.Tensor | None = None
        # g(x) over the training rows since training_stats(): (sum, count, min, max), constant memory
        # for a loop that never asks.
        self._gate_seen: tuple | None = None

    def training_stats(self) -> dict:
        """The learned-mixin gate g(x) over the training rows since the last call (mean, min, max),
        then forgotten: what the bias term was scaled by. {} for the other methods or before a batch."""
        if self._gate_seen is None:
            return {}
        total, n, low, high = self._gate_seen
        self._gate_seen = None
        return {"debias_gate_mean": total.item() / n, "debias_gate_min": low.item(), "debias_gate_max": high.item()}

    def _see_gate(self, g: torch.Tensor) -> None:
        g = g.detach().float()  # (b,)
        seen = (g.sum(), len(g), g.min(), g.max())
        if self._gate_seen is not None:  # no .item() here: no device sync per step
            total, n, low, high = self._gate_seen
            seen = (total + seen[0], n + seen[1], torch.minimum(low, seen[2]), torch.maximum(high, seen[3]))
        self._gate_seen = seen

    @property
    def needs_word_embeddings(self) -> bool:
        return self.method == "entropy"

    def set_prior(self, prior: AnswerPrior) -> None:
        if prior.level != self.prior_level:
            raise ConfigError(f"train.debias.prior is {self.prior_level!r}, but the answer prior given is "
                              f"{prior.level!r}")
        device = self.gate.weight.device if self.gate is not None else None
        self.prior = prior
        self.log_prior = prior.log_table().to(device) if device is not None else prior.log_table()
        columns = prior.window_columns
        self.window_columns = torch.from_numpy(columns) if columns is not None else None

    def table_columns(self, batch: dict, device: torch.device) -> torch.Tensor:
        """(b, s) column of `log_prior` for each token of a training batch."""
        if self.prior_level == "token":
            return prior_index(batch, self.log_prior.shape[1] - OFFSET)
        if self.window_columns is None:
            raise TrainingError("train.debias.prior sentence: the prior has no sentence table of the training "
                                "windows (a prior read from a checkpoint has none; train_features builds it)")
        if self.window_columns.device != device:
            self.window_columns = self.window_columns.to(device)
        return window_prior_index(batch, self.window_columns)

    def mixin_scale(self, tokens: torch.Tensor, batch: dict) -> torch.Tensor:
        """(b, 1) g(x) >= 0."""
        if self.gate_input == "max":
            scores = self.gate(tokens).squeeze(-1)  # (b, s)
            real = batch["attention_mask"].bool()
            score = scores.masked_fill(~real, torch.finfo(scores.dtype).min).amax(-1)  # (b,): padding excluded
        else:
            rows = torch.arange(tokens.shape[0], device=tokens.device)
            score = self.gate(tokens[rows, batch["cls_index"]]).squeeze(-1)  # (b,)
        return F.softplus(score)[:, None]

    def loss(self, scores: dict, tokens: torch.Tensor, batch: dict, targets: dict, mask: torch.Tensor,
             word_embeddings: torch.Tensor | None = None) -> torch.Tensor:
        """The training loss replacing the head's.

        Args:
            scores: the head's output (start_logits, end_logits (b, s), loss).
            tokens: (b, s, d) the tokens' last hidden states.
            mask: (b, s) the head's candidates (`head_mask`).
            word_embeddings: (b, s, d) for `entropy`.
        """
        if self.method == "entropy":
            return scores["loss"] - self.entropy_weight * cosine_entropy(word_embeddings, tokens, mask).mean()
        if self.log_prior is None:
            raise TrainingError("train.debias: the model has no answer prior (it comes from the training "
                                "features: the task's train_features builds it before build_model)")
        log_prior = self.log_prior.to(mask.device)  # a no-op once the model has moved with its buffers
        table = log_prior[:, self.table_columns(batch, mask.device)]  # (2, b, s): start, end
        if self.bias_term == "probability":  # the authors' code: b itself, not log b
            table = table.exp()
        log_b = [table[0], table[1]]  # the bias term: log b, or b
        if self.gate is not None:
            g = self.mixin_scale(tokens, batch)  # (b, 1)
            if self.training:
                self._see_gate(g[:, 0])
            log_b = [g * x for x in log_b]
        loss = (ensemble_cross_entropy(scores["start_logits"], log_b[0], mask, targets["start_positions"])
                + ensemble_cross_entropy(scores["end_logits"], log_b[1], mask, targets["end_positions"])) / 2
        if self.method == "learned_mixin_h":
            # Clark et al.'s penalty: a low-entropy scaled bias keeps g(x) from shrinking to 0.
            penalty = (masked_entropy(log_b[0], mask) + masked_entropy(log_b[1], mask)) / 2
            loss = loss + self.entropy_weight * penalty.mean()
        return loss


def make_debias(debias, head: str, encoder) -> Debias:
    """The `Debias` module of a checked `train.debias` for `head` on `encoder` (no prior yet)."""
    check_config(debias, head)
    hidden = encoder.config.hidden_size
    if debias.method == "entropy":
        width = getattr(encoder.get_input_embeddings(), "embedding_dim", None)
        if width != hidden:
            raise ConfigError(f"train.debias.method entropy compares word embeddings with hidden states (cosine), "
                              f"but this encoder embeds at width {width} and its hidden size is {hidden}")
    return Debias(debias.method, hidden, entropy_weight=debias.entropy_weight, gate=debias.gate,
                  gate_bias=debias.gate_bias, prior_level=debias.prior, bias_term=debias.bias_term)
