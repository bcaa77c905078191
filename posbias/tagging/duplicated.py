"""Position-bias evaluation of a tagger on duplicated test sets: F1(α), Prec(α), Rec(α) (Ben Amor et
al., "Impact of Position Bias on Language Models in Token Classification", §3.2, Eq. 2).

* D*: the sentences whose word length lies between two quantiles (Q1 and Q3 by default) of a
  length distribution: the split's own, or train + dev + test pooled as the authors'; `length_subset`.
* D*_test(k): every sentence repeated k times in one input, copies joined by the tokenizer's own
  separator token: `prefix x sep x sep ... x suffix` ([CLS] x [SEP] x [SEP] ... x [SEP] for BERT).
  F1(α) scores the predictions of copy α (α = 1..k) against the gold tags, so the same words are
  scored at later and later positions with their local context unchanged.
* The subset is fixed across k: only sentences whose k_max copies fit the model's length are
  evaluated, for every k (the authors' code drops what overflows at each k separately, so each k
  is scored on a different subset); the count and share left out are reported.
* `shift` mode simulates copy α with a single copy whose position ids start where copy α would
  (the Random Padding / RPP mechanism, `posbias.perturb.position_shift`): it moves the words
  without repeating the context, which separates "position" from "repeated context".
* Consistency(α): of the entities (POS: words) predicted right in copy 1, the share also right in
  copy α of the same input (computed at α = 1 too: 100, or undefined when copy 1 gets nothing right).
* Every cell also gets the authors' "F1" (seqeval's default, lenient mode over sub-token label
  sequences, `metrics.seqeval_subtoken_f1`) beside the strict word-level F1 (POS: accuracy): each
  word's label, in the model's own scheme (IOBES for their CoNLL runs), copied to its sub-tokens,
  against each sub-token's own prediction for a model that learned those labels
  (`data.label_subtokens: copy`, their `label_all_tokens`), else its word's prediction copied.

Token ids are never re-tokenized per k: each sentence is tokenized once and its ids duplicated.
All (k, sentence) inputs are batched together, longest first, under a token budget per batch.

Shape legend: n sentences, L_i tokens of sentence i (no special tokens), W_i its words, k copies,
b rows of a batch, s the longest row of a batch, c labels.
"""
from __future__ import annotations

import io
import time
import warnings
import zipfile
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from ..utils import interactive
from ..analysis.stats import mean_std
from ..errors import ConfigError
from ..perturb.position_shift import shift_effect, shift_position_ids
from . import metrics as M
from .columns import scheme_mismatch
from .config import POSITION_BATCH_TOKENS
from .examples import TaggingDataset, TaggingExample
from .features import first_subtokens, separator_id, special_tokens, tokenize_sentences
from .schemes import convert, to_iob2_prefixes

MODES = ("duplicate", "shift")
# What a NaN-logits error calls a model given without a path (a Trainer's, through `posbias.hf`).
MODEL_NAME = "the model being evaluated"
SENTENCE_COUNTS = "sentence_counts"
COPY_LAYOUT = "copy_layout"
COPY_SCORES = "copy_scores.npz"
"""Every (k, α) cell's per-sentence counts and where each copy sits, written beside a diagnosis
(`save_copy_scores`) and kept in an experiment's store, so that F1(α) can be split by sentence."""


def sentence_counts(result: dict) -> dict:
    """Pop each mode's per-sentence counts from a `position_eval` result (they are large and not
    JSON): mode -> ((k, α) of each cell, metric -> (cells, n, 2) counts)."""
    out = {}
    for mode in MODES:
        part = result.get(mode) or {}
        if SENTENCE_COUNTS in part:
            out[mode] = ([(c["k"], c["alpha"]) for c in part["cells"]], part.pop(SENTENCE_COUNTS))
    return out


def save_copy_scores(path, counts: dict, layout: dict | None) -> None:
    """`counts` (`sentence_counts`) and the copies' `layout` as a compressed NumPy archive of integer
    arrays (no pickled objects): per mode `<mode>/cells` (cells, 2) = (k, α) and `<mode>/<metric>`
    (cells, n, 2) (numerator, denominator) per sentence, with `body_tokens` (n,), `prefix` and
    `position_base` to place every copy (`copy_position_span`). Written atomically."""
    from ..utils import atomic_write_bytes

    arrays = {}
    for mode, (cells, metrics) in counts.items():
        arrays[f"{mode}/cells"] = np.asarray(cells, dtype=np.int32).reshape(-1, 2)
        for metric, a in metrics.items():
            if metric != "f1":  # f1's counts follow from precision's and recall's
                arrays[f"{mode}/{metric}"] = np.asarray(a, dtype=np.int32)
    if layout is not None:
        arrays["body_tokens"] = np.asarray(layout["body_tokens"], dtype=np.int32)
        arrays["prefix"] = np.asarray([layout["prefix"]], dtype=np.int32)
        arrays["position_base"] = np.asarray([layout["position_base"]], dtype=np.int32)
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    atomic_write_bytes(path, buf.getvalue())


def load_copy_scores(data: bytes, where: str) -> dict:
    """A `save_copy_scores` archive read back (integer arrays only: `allow_pickle=False`): {"modes":
    mode -> {"cells": (cells, 2), metric -> (cells, n, 2)}, "body_tokens", "prefix", "position_base"};
    NER's f1 counts rebuilt from precision's and recall's. Damaged bytes: one line naming `where`."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (ValueError, OSError, EOFError, KeyError, zipfile.BadZipFile) as e:
        raise ConfigError(f"{where}: the per-copy scores are damaged ({' '.join(str(e).split())[:120]})") from None
    out = {"modes": {}}
    for key, a in arrays.items():
        if "/" in key:
            mode, metric = key.split("/", 1)
            out["modes"].setdefault(mode, {})[metric] = a
        else:
            out[key] = a if key == "body_tokens" else int(a.reshape(-1)[0])
    for part in out["modes"].values():
        if "precision" in part and "recall" in part:  # f1 = 2tp / (n_pred + n_gold)
            tp, n_pred, n_gold = part["precision"][..., 0], part["precision"][..., 1], part["recall"][..., 1]
            part["f1"] = np.stack([2 * tp, n_pred + n_gold], -1)
    return out


def copy_position_span(alpha: int, body_tokens: np.ndarray, prefix: int, position_base: int = 0) -> np.ndarray:
    """(n, 2) the first and last position id of copy α of each sentence in its D*_test(k) input (duplicate
    mode; the same for every k >= α): copy α starts (α - 1)(L + 1) slots after the prefix."""
    first = position_base + prefix + (alpha - 1) * (np.asarray(body_tokens) + 1)
    return np.stack([first, first + np.asarray(body_tokens) - 1], -1)


def length_subset(examples: list[TaggingExample], quantiles: tuple[float, float] | None = (0.25, 0.75), *,
                  pool: tuple[np.ndarray, list[str]] | None = None):
    """D*: (the sentences whose word length lies in [q_lo, q_hi], a description). `quantiles` None
    keeps every sentence.

    The bounds are the quantiles (NumPy's linear interpolation, bounds inclusive, as the authors'
    `np.percentile`) of `examples`' own lengths, or with `pool` = (lengths, the files they come
    from) of those pooled lengths: the authors' `trim_dataset` pools train, dev and test, so every
    split is cut to the same bounds (`posbias.tagging.inputs.length_pool`)."""
    lengths = np.array([len(e.words) for e in examples], dtype=np.int64)
    info = {"quantiles": list(quantiles) if quantiles else None, "split_sentences": len(examples),
            "pool": list(pool[1]) if pool is not None else None,
            "pool_sentences": int(len(pool[0])) if pool is not None else len(examples)}
    if not quantiles or not len(examples):
        info.update(length_bounds=None, subset_sentences=len(examples))
        return list(examples), info
    lo_q, hi_q = quantiles
    if not 0 <= lo_q <= hi_q <= 1:
        raise ConfigError(f"quantiles must satisfy 0 <= low <= high <= 1, got {list(quantiles)}")
    reference = lengths if pool is None else np.asarray(pool[0])
    if not len(reference):
        raise ConfigError("the length pool holds no sentence")
    lo, hi = (float(x) for x in np.quantile(reference, [lo_q, hi_q]))
    keep = [e for e, n in zip(examples, lengths) if lo <= n <= hi]
    info.update(length_bounds=[lo, hi], subset_sentences=len(keep))
    return keep, info


def usable_length(model, tokenizer, max_len: int | None = None) -> int:
    """Tokens an input may hold: `max_len` if given, else the encoder's position table (minus its
    first position id, RoBERTa's offset), else the tokenizer's model_max_length, else 512."""
    if max_len is not None:
        return int(max_len)
    config = model.encoder.config
    n_pos = getattr(config, "max_position_embeddings", None)
    if n_pos:
        return int(n_pos) - int(getattr(model, "position_base", 0))
    limit = getattr(tokenizer, "model_max_length", None)
    return int(limit) if limit and limit < 100_000 else 512


def shift_applicable(model) -> tuple[bool, str | None]:
    """(whether shifting position ids moves the words for this encoder, why not or what alone it
    moves), read from its config (`posbias.perturb.position_shift.shift_effect`)."""
    inputs = getattr(model, "_inputs", None)
    return shift_effect(model.encoder.config, inputs is None or inputs.positions)


def duplicate_input(prefix: list[int], body: np.ndarray, sep: int, suffix: list[int], k: int) -> np.ndarray:
    """(P + kL + k - 1 + S,) ids of D*_test(k)'s input: prefix, k copies of `body` joined by `sep`, suffix."""
    return np.r_[prefix, np.tile(np.r_[body, sep], k)[:-1], suffix].astype(np.int64)


def copy_slots(n_prefix: int, body_len: int, firsts: np.ndarray, k: int) -> np.ndarray:
    """(k, W) slot of each word's first sub-token in each copy of a `duplicate_input` (copy α starts
    (α - 1)(L + 1) slots after the prefix: L tokens plus one separator per earlier copy)."""
    return n_prefix + np.arange(k)[:, None] * (body_len + 1) + np.asarray(firsts)[None, :]


def copy_shift(alpha: int, body_len: int) -> int:
    """Shift mode: how far copy α's position ids lie beyond copy 1's."""
    return (alpha - 1) * (body_len + 1)


@dataclass
class _Rows:
    """The inputs of one mode: per row its sentence, k (duplicate) or α (shift), and length."""

    sentence: np.ndarray  # (rows,) index into the evaluated sentences
    k: np.ndarray  # (rows,) copies in the input (duplicate) or the simulated copy α (shift)
    length: np.ndarray  # (rows,) tokens, special tokens included


def _predict_rows(model, rows: _Rows, build, device, batch_tokens: int, pad_id: int,
                  progress: bool, desc: str, subtokens: bool = False, model_name: str = MODEL_NAME):
    """Run every row, longest first, in batches of at most `batch_tokens` padded tokens; returns per
    row the (copies, W) predicted label ids, and with `subtokens` per row the (copies, L) ids at
    every sub-token (else None). `build(row) -> (ids (s,), position ids or None, first-token
    positions (n_copies, W), every body token's position (n_copies, L))`. Logits with NaN or inf
    are refused in one line naming `model_name` (argmax would still tag every word)."""
    order = np.argsort(-rows.length, kind="stable")
    out: list[np.ndarray | None] = [None] * len(order)
    sub_out: list[np.ndarray | None] | None = [None] * len(order) if subtokens else None
    start = 0
    bar = tqdm(total=len(order), desc=desc, leave=False, disable=not progress or not interactive())
    with torch.inference_mode():
        while start < len(order):
            size = max(1, min(512, batch_tokens // int(rows.length[order[start]])))
            idx = order[start:start + size]
            start += len(idx)
            built = [build(r) for r in idx]
            s = max(len(b[0]) for b in built)
            ids = np.full((len(idx), s), pad_id, dtype=np.int64)
            mask = np.zeros((len(idx), s), dtype=np.int64)
            pos = None if built[0][1] is None else np.zeros((len(idx), s), dtype=np.int64)
            for j, (x, p, *_) in enumerate(built):  # right padding: real tokens keep their slots
                ids[j, :len(x)] = x
                mask[j, :len(x)] = 1
                if pos is not None:
                    pos[j, :len(x)] = p
            batch = {"input_ids": torch.from_numpy(ids).to(device), "attention_mask": torch.from_numpy(mask).to(device)}
            if pos is not None:
                batch["position_ids"] = torch.from_numpy(pos).to(device)
            logits = model(batch)["logits"]  # (b, s, c)
            if not bool(torch.isfinite(logits).all()):  # one reduction and one host sync per batch
                raise ConfigError(f"{model_name}: the model's logits are NaN or infinite (its weights hold NaN/inf, "
                                  "or its precision overflows); posbias does not decode them")
            label = logits.argmax(-1).cpu().numpy()  # (b, s)
            for j, r in enumerate(idx):
                out[r] = label[j, built[j][2]]  # (copies, W)
                if sub_out is not None:
                    sub_out[r] = label[j, built[j][3]]  # (copies, L)
            bar.update(len(idx))
    bar.close()
    return out, sub_out


def _scores(gold_tags, gold_ents, pred_tags, scheme: str, first_right=None) -> tuple[dict, object, np.ndarray]:
    """Metrics of one (k, α) cell, what copy α got right (for consistency against copy 1), and per
    ratio metric (NER: f1, precision, recall; POS: accuracy) the (n, 2) per-sentence (numerator,
    denominator) whose sums over sentences give the cell's corpus score (`metrics.sentence_ratios`),
    so that its sentences can be resampled."""
    if scheme == "none":
        res = M.tag_scores(gold_tags, pred_tags)
        right = [np.array(g, dtype=object) == np.array(p, dtype=object) for g, p in zip(gold_tags, pred_tags)]
        counts = {"accuracy": [(int(r.sum()), len(r)) for r in right]}
    else:
        pred_ents = M.entities(pred_tags, scheme)
        res = M.scores_of_entities(gold_ents, pred_ents)
        right = [set(g) & set(p) for g, p in zip(gold_ents, pred_ents)]
        tp, n_pred, n_gold = (np.array([len(x) for x in xs], dtype=np.int64) for xs in
                              (right, [set(p) for p in pred_ents], [set(g) for g in gold_ents]))
        counts = {"f1": np.stack([2 * tp, n_pred + n_gold], -1), "precision": np.stack([tp, n_pred], -1),
                  "recall": np.stack([tp, n_gold], -1)}
    if first_right is not None:
        res["consistency"] = consistency(first_right, right)
    return res, right, {k: np.asarray(v, dtype=np.int64).reshape(-1, 2) for k, v in counts.items()}


def consistency(first_right: list, right: list) -> float | None:
    """Of what copy 1 got right (per sentence: entity sets, or POS boolean arrays over words), the
    share copy α also gets right, in points; None when copy 1 got nothing right (no share to take).
    At α = 1 it is 100 by this definition, not by decree."""
    if first_right and isinstance(first_right[0], np.ndarray):
        base = sum(int(a.sum()) for a in first_right)
        both = sum(int((a & b).sum()) for a, b in zip(first_right, right))
    else:
        base = sum(len(a) for a in first_right)
        both = sum(len(a & b) for a, b in zip(first_right, right))
    return 100 * both / base if base else None


def _mean_std(values) -> tuple[float | None, float | None]:
    """mean ± sample std of the defined values; None for what is undefined (JSON has no NaN): both
    when there are no values, the std when there is one (a single k has no spread)."""
    vals = [v for v in values if v is not None]
    if not vals:
        return None, None
    m, s = mean_std(vals)
    return m, (None if np.isnan(s) else s)


def _by_alpha(cells: list[dict], k_max: int, keys: list[str], classes: list[str], class_key: str) -> list[dict]:
    """For each α: each metric's mean ± sample std over the cells with k >= α (the paper's tables)."""
    out = []
    for alpha in range(1, k_max + 1):
        sel = [c for c in cells if c["alpha"] == alpha]
        row = {"alpha": alpha, "n_k": len(sel)}
        for key in keys:
            row[f"{key}_mean"], row[f"{key}_std"] = _mean_std([c[key] for c in sel])
        row["per_class"] = {}
        for cls in classes:
            m, s = _mean_std([c["per_class"][cls][class_key] for c in sel if cls in c["per_class"]])
            row["per_class"][cls] = {f"{class_key}_mean": m, f"{class_key}_std": s}
        out.append(row)
    return out


def position_eval(model, tokenizer, dataset: TaggingDataset, *, k_max: int = 10,
                  quantiles: tuple[float, float] | None = (0.25, 0.75), modes=MODES, max_len: int | None = None,
                  batch_tokens: int = POSITION_BATCH_TOKENS, progress: bool = True,
                  length_pool: tuple[np.ndarray, list[str]] | None = None, own_subtokens: bool = False,
                  keep_counts: bool = False, model_name: str = MODEL_NAME) -> dict:
    """F1(α), Prec(α), Rec(α) (POS: accuracy(α)) and the authors' sub-token F1(α) of `model` on
    D*_test(k), k = 1..k_max, overall and per class, in `duplicate` and/or `shift` mode (module
    docstring); returns a JSON-able dict. Entities are scored in the data's own scheme (a BIOES
    model's predictions of an IOB2 file mapped back, `metrics.scoring_schemes`); the sub-token F1
    in the model's (`subtoken_scheme`).

    Args:
        model: a TaggerModel (posbias checkpoint or imported Hugging Face folder), in eval mode or not.
        dataset: the test split read with gold tags; D* is cut from it with `quantiles`.
        max_len: tokens an input may hold (default: the model's position table, see `usable_length`).
        batch_tokens: padded tokens per forward batch (memory bound).
        length_pool: (sentence lengths, their files) the D* bounds are quantiles of (`length_subset`);
            None: the test split's own.
        own_subtokens: the sub-token F1 from each sub-token's own prediction (a model that learned
            its word's label on every sub-token, as the authors': `features.learns_word_labels`);
            else each word's prediction on all its sub-tokens.
        keep_counts: also keep, per mode, the per-sentence counts of the ratio metrics (NumPy, not
            JSON; `sentence_counts` takes them out) for intervals over sentences.
        model_name: what an error about NaN or infinite logits calls the model (its path).
    """
    unknown = set(modes) - set(MODES)
    if unknown or not modes:
        raise ConfigError(f"modes must be a non-empty subset of {MODES}, got {list(modes)}")
    if not isinstance(k_max, int) or k_max < 1:
        raise ConfigError(f"k_max must be a positive integer, got {k_max!r}")
    if any(e.tags is None for e in dataset.examples):
        raise ConfigError(f"{dataset.path}: the position evaluation needs gold tags")
    net = getattr(model, "module", model)
    shift_moves, shift_why = shift_applicable(net) if "shift" in modes else (True, None)
    if not shift_moves and set(modes) == {"shift"}:  # nothing else to report: say so, not an empty result
        raise ConfigError(f"shift mode cannot evaluate this model: {shift_why}")
    scheme = net.scheme
    if (dataset.scheme == "none") != (scheme == "none"):
        raise ConfigError(scheme_mismatch(dataset, net.labels, scheme))
    t0 = time.perf_counter()
    subset, info = length_subset(dataset.examples, quantiles, pool=length_pool)
    labels = np.array(net.labels, dtype=object)
    # The sub-token F1 reads the model's labels as they are: gold in the model's scheme.
    model_tags = [e.tags if dataset.scheme == scheme else convert(e.tags, dataset.scheme, scheme) for e in subset]
    model_labels = labels
    if scheme != "none":  # gold in the scoring scheme, the model's labels mapped to it

        scored = M.scoring_schemes(dataset.file_scheme, scheme)
        if dataset.scheme != scored:
            subset = [TaggingExample(e.id, e.words, convert(e.tags, dataset.scheme, scored), e.meta) for e in subset]
        if scheme != scored:
            labels = np.array(to_iob2_prefixes(net.labels), dtype=object)
        scheme = scored
    inputs = _Inputs.of(subset, tokenizer)
    limit = usable_length(net, tokenizer, max_len)
    fits = np.flatnonzero(inputs.length(np.arange(len(subset)), k_max) <= limit)  # the k_max-copy input fits
    info.update(k_max=k_max, max_len=limit, separator=tokenizer.convert_ids_to_tokens(inputs.sep),
                evaluated_sentences=int(len(fits)), left_out=int(len(subset) - len(fits)),
                left_out_share=float(1 - len(fits) / len(subset)) if subset else 0.0,
                unknown_token_words=inputs.unknown_words)
    if not len(fits):
        raise ConfigError(f"{dataset.path}: none of the {len(subset)} D* sentences fits {k_max} copies in {limit} "
                          "tokens; lower k_max or raise max_len")
    inputs = inputs.select(fits)
    gold = [subset[i].tags for i in fits]
    sub = _SubtokenGold.of([model_tags[i] for i in fits], inputs.word_counts(), model_labels, net.scheme,
                           own_subtokens)
    scorer = _Scorer(gold, scheme, labels, sub)
    device = next(iter([*net.parameters(), *net.buffers()]), torch.empty(0)).device
    result = {"data": dataset.path, "scheme": scheme, "metric": scorer.key, "subset": info}
    if scheme != net.scheme:
        result["label_scheme"] = net.scheme  # the model's labels, mapped back for scoring
    result["subtoken_predictions"] = "own" if own_subtokens else "word"
    if net.scheme != "none":
        result["subtoken_scheme"] = net.scheme
    tokens_run = 0
    was_training = net.training
    net.eval()
    try:
        for mode in modes:
            if mode == "shift" and not shift_moves:
                result["shift"] = {"skipped": shift_why}
                continue
            if mode == "shift" and shift_why:
                warnings.warn(f"shift mode: {shift_why}", stacklevel=2)
            rows, build = (inputs.duplicate_rows(k_max) if mode == "duplicate"
                           else inputs.shift_rows(k_max, getattr(net, "position_base", 0),
                                                  getattr(net, "position_pad", 0)))
            tokens_run += int(rows.length.sum())
            preds, sub_preds = _predict_rows(net, rows, build, device, batch_tokens, tokenizer.pad_token_id, progress,
                                             f"{mode} k<= {k_max}", subtokens=own_subtokens, model_name=model_name)
            cells = scorer.cells(mode, rows, preds, k_max, sub_preds)
            # shift: one cell per α (its value does not depend on k), so it has no std over k
            result[mode] = {"cells": cells, "by_alpha": _by_alpha(cells, k_max, scorer.keys, scorer.classes, "f1")}
            if keep_counts:  # metric -> (cells, n, 2) per-sentence counts (`analysis.verdict.alpha_axis`)
                result[mode][SENTENCE_COUNTS] = {k: np.stack([c[k] for c in scorer.counts_of_cells])
                                                 for k in scorer.counts_of_cells[0]}
                result[COPY_LAYOUT] = {"body_tokens": np.array([len(b) for b in inputs.bodies], dtype=np.int32),
                                       "prefix": len(inputs.prefix),
                                       "position_base": int(getattr(net, "position_base", 0) or 0)}
    finally:
        net.train(was_training)
    seconds = time.perf_counter() - t0
    result["timing"] = {"seconds": seconds, "real_tokens": tokens_run, "tokens_per_s": tokens_run / seconds}
    result["summary"] = summary(result)
    return result


@dataclass
class _Inputs:
    """The evaluated sentences, tokenized once: the tokenizer's specials and separator, each
    sentence's body ids (L_i,), the slots of its words' first sub-tokens (W_i,) and each body
    token's word (L_i,)."""

    prefix: list[int]
    suffix: list[int]
    sep: int
    bodies: list[np.ndarray]
    firsts: list[np.ndarray]
    unknown_words: int = 0
    words: list[np.ndarray] | None = None

    @classmethod
    def of(cls, examples: list[TaggingExample], tokenizer) -> "_Inputs":
        prefix, suffix = special_tokens(tokenizer)
        tokens, unknown = tokenize_sentences(examples, tokenizer) if examples else ([], 0)
        return cls(prefix, suffix, separator_id(tokenizer), [ids for ids, _ in tokens],
                   [np.flatnonzero(first_subtokens(wid)) for _, wid in tokens], unknown, [wid for _, wid in tokens])

    def select(self, idx) -> "_Inputs":
        return _Inputs(self.prefix, self.suffix, self.sep, [self.bodies[i] for i in idx],
                       [self.firsts[i] for i in idx], self.unknown_words, [self.words[i] for i in idx])

    def word_counts(self) -> list[np.ndarray]:
        """Per sentence, (W_i,) sub-tokens of each word."""
        return [np.bincount(w, minlength=len(f)) for w, f in zip(self.words, self.firsts)]

    def body_slots(self, i: int, k: int) -> np.ndarray:
        """(k, L_i) slot of every body token of sentence i in each copy of its k-copy input."""
        return copy_slots(len(self.prefix), len(self.bodies[i]), np.arange(len(self.bodies[i])), k)

    def length(self, idx: np.ndarray, k) -> np.ndarray:
        """Tokens of the k-copy inputs of sentences `idx` (k broadcasts)."""
        n_tok = np.array([len(self.bodies[i]) for i in idx], dtype=np.int64)
        return len(self.prefix) + k * n_tok + (k - 1) + len(self.suffix)

    def duplicate_rows(self, k_max: int):
        """Every (k, sentence) input of D*_test(k), k = 1..k_max, and how to build one."""
        n = len(self.bodies)
        ks = np.repeat(np.arange(1, k_max + 1), n)
        sentence = np.tile(np.arange(n), k_max)
        rows = _Rows(sentence, ks, self.length(sentence, ks))

        def build(r):
            i, k = rows.sentence[r], int(rows.k[r])
            return (duplicate_input(self.prefix, self.bodies[i], self.sep, self.suffix, k), None,
                    copy_slots(len(self.prefix), len(self.bodies[i]), self.firsts[i], k), self.body_slots(i, k))
        return rows, build

    def shift_rows(self, k_max: int, base: int, pad: int):
        """Every (α, sentence) single-copy input with copy α's position ids, and how to build one."""
        n = len(self.bodies)
        sentence = np.tile(np.arange(n), k_max)
        rows = _Rows(sentence, np.repeat(np.arange(1, k_max + 1), n), self.length(sentence, 1))
        cls_index = torch.tensor([0 if self.prefix else -1])

        def build(r):
            i, alpha = rows.sentence[r], int(rows.k[r])
            x = np.r_[self.prefix, self.bodies[i], self.suffix].astype(np.int64)
            tau = torch.tensor([copy_shift(alpha, len(self.bodies[i]))])
            p = shift_position_ids(torch.ones(1, len(x), dtype=torch.long), cls_index, tau, base=base,
                                   pad_position=pad)[0].numpy()
            return x, p, copy_slots(len(self.prefix), len(self.bodies[i]), self.firsts[i], 1), self.body_slots(i, 1)
        return rows, build


@dataclass
class _SubtokenGold:
    """What each cell's authors' sub-token F1 scores against (`metrics.seqeval_subtoken_f1`)."""

    counts: list[np.ndarray]  # per sentence (W_i,) sub-tokens of each word
    labels: np.ndarray  # the model's label names as it learned them (not mapped for scoring)
    scheme: str  # theirs: the model's scheme
    own: bool  # each sub-token's own prediction, else its word's copied
    gold: list[list[str]]  # per sentence the word labels in `scheme` copied to each sub-token
    chunks: M.Chunks | None  # NER: the gold's lenient chunks, computed once

    @classmethod
    def of(cls, word_tags, counts, labels, scheme: str, own: bool) -> "_SubtokenGold":
        gold = M.subtoken_sequences(word_tags, counts)
        return cls(counts, labels, scheme, own, gold, M.lenient_chunks(gold) if scheme != "none" else None)

    def f1(self, word_ids: list[np.ndarray], subtoken_ids: list[np.ndarray] | None) -> float:
        """From per sentence (W_i,) predicted label ids of its words, or with `own` (L_i,) of its sub-tokens."""
        pred = ([list(self.labels[x]) for x in subtoken_ids] if self.own
                else M.subtoken_sequences([list(self.labels[x]) for x in word_ids], self.counts))
        if self.chunks is None:
            return M.seqeval_subtoken_f1(self.gold, pred)
        return M.lenient_scores(self.gold, pred, self.chunks)["f1"]


class _Scorer:
    """Scores each (k, α) cell of a mode against the gold tags (entities computed once)."""

    def __init__(self, gold: list[list[str]], scheme: str, labels: np.ndarray, subtokens: _SubtokenGold):
        """`labels`: the model's label names in the scoring scheme; `subtokens`: what the authors'
        sub-token F1 scores against."""
        self.gold, self.scheme, self.labels, self.sub = gold, scheme, labels, subtokens
        self.gold_ents = M.entities(gold, scheme) if scheme != "none" else None
        if scheme == "none":
            self.key, self.keys = "accuracy", ["accuracy", "macro_f1", M.SUBTOKEN_F1, "consistency"]
            self.classes = sorted({t for s in gold for t in s})
        else:
            self.key, self.keys = "f1", ["f1", "precision", "recall", M.SUBTOKEN_F1, "consistency"]
            self.classes = sorted({t for s in self.gold_ents for t, _, _ in s})

    def cells(self, mode: str, rows: _Rows, preds: list[np.ndarray], k_max: int,
              sub_preds: list[np.ndarray] | None = None) -> list[dict]:
        """duplicate: a cell per (k, α ≤ k); shift: a cell per α (its k is α). `sub_preds`: per row
        the (copies, L) label ids at every sub-token (when the sub-token F1 reads them). Each cell's
        per-sentence counts of the main metric are left in `counts_of_cells`, in cell order."""
        out = []
        self.counts_of_cells: list[dict[str, np.ndarray]] = []
        for k in (range(1, k_max + 1) if mode == "duplicate" else [None]):
            first_right = None
            for alpha in range(1, (k or k_max) + 1):
                # duplicate: the rows of this k, copy α of each; shift: the rows simulating copy α
                sel = np.flatnonzero(rows.k == k) if mode == "duplicate" else np.flatnonzero(rows.k == alpha)
                copy = alpha - 1 if mode == "duplicate" else 0
                pred_tags = [list(self.labels[preds[r][copy]]) for r in sel]
                res, right, counts = _scores(self.gold, self.gold_ents, pred_tags, self.scheme, first_right)
                self.counts_of_cells.append(counts)
                res["sentences"] = len(sel)  # the same subset for every k
                if alpha == 1:
                    first_right = right
                    res["consistency"] = consistency(right, right)
                res[M.SUBTOKEN_F1] = self.sub.f1([preds[r][copy] for r in sel],
                                                 [sub_preds[r][copy] for r in sel] if self.sub.own else None)
                out.append({"k": k or alpha, "alpha": alpha, **res})
        return out


def summary(result: dict, alphas=(1, 5, 10)) -> dict:
    """Flat numbers for tables and experiments: the main metric at k = 1 (the D* test set as is) and
    F1(α) / Prec(α) / Rec(α) (POS: accuracy(α)) and the authors' sub-token F1(α) averaged over
    k >= α, for each mode. A `_std` is None where one k (or, in shift mode, one cell) has no spread."""
    key = result["metric"]
    out = {}
    for mode in MODES:
        part = result.get(mode)
        if not part or "by_alpha" not in part:
            continue
        tag = "" if mode == "duplicate" else "shift_"
        rows = {r["alpha"]: r for r in part["by_alpha"]}
        first = next(c for c in part["cells"] if c["alpha"] == 1 and c["k"] == 1)
        if mode == "duplicate":
            out[key] = first[key]
            for extra in ("precision", "recall", "macro_f1", M.SUBTOKEN_F1):
                if extra in first:
                    out[extra] = first[extra]
        for a in alphas:
            if a in rows:
                out[f"{tag}{key}_alpha_{a}"] = rows[a][f"{key}_mean"]
                out[f"{tag}{key}_alpha_{a}_std"] = rows[a][f"{key}_std"]
                for extra in ("precision", "recall", "consistency"):
                    if f"{extra}_mean" in rows[a]:
                        out[f"{tag}{extra}_alpha_{a}"] = rows[a][f"{extra}_mean"]
                if f"{M.SUBTOKEN_F1}_mean" in rows[a]:
                    out[f"{tag}{M.SUBTOKEN_F1}_alpha_{a}"] = rows[a][f"{M.SUBTOKEN_F1}_mean"]
                    out[f"{tag}{M.SUBTOKEN_F1}_alpha_{a}_std"] = rows[a][f"{M.SUBTOKEN_F1}_std"]
    out["scheme"] = result["scheme"]
    return out


def experiment_metrics(result: dict, alphas=(5, 10)) -> dict:
    """What an experiment stores of a `position_eval` result: the `summary` numbers, the α curves
    (mean over k >= α) of both modes, and `report`, the [name, key] pairs its report rows show:
    the main metric at k = 1, its value at each α (averaged over k >= α), the same of the authors'
    sub-token F1 (what the paper's tables report), shift mode and consistency at the last α."""
    key = result["metric"]
    name = "F1" if key == "f1" else "accuracy"
    k_max = result["subset"]["k_max"]
    alphas = [a for a in alphas if 1 < a <= k_max]
    out = dict(summary(result, alphas=(1, *alphas)))
    report = [[name, key]] + [[f"{name}({a})", f"{key}_alpha_{a}"] for a in alphas]
    if M.SUBTOKEN_F1 in out:
        report += [["sub-token F1", M.SUBTOKEN_F1]] + [[f"sub-token F1({a})", f"{M.SUBTOKEN_F1}_alpha_{a}"]
                                                        for a in alphas]
    for mode in MODES:
        part = result.get(mode) or {}
        if "by_alpha" in part:
            tag = "" if mode == "duplicate" else "shift_"
            out[f"{tag}{key}_by_alpha"] = [r[f"{key}_mean"] for r in part["by_alpha"]]
    if alphas:
        last = alphas[-1]
        if f"shift_{key}_alpha_{last}" in out:
            report.append([f"shift {name}({last})", f"shift_{key}_alpha_{last}"])
        report.append([f"consistency({last})", f"consistency_alpha_{last}"])
    out.update(report=report, metric=key, evaluated_sentences=result["subset"]["evaluated_sentences"],
               left_out=result["subset"]["left_out"])
    return out
