"""Run a model over windows, decode answers, score them, write prediction files.

Used by training (periodic evaluation, through `posbias.qa.task`) and by `posbias evaluate/predict qa`.
"""
from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from ..batching import eval_batches, move
from ..config import RunConfig, build_config
from ..errors import ConfigError, DataError
from ..evaluation import evaluate_file, opened_for_eval, write_run_meta
from ..outputs import staged_output
from ..records import unicode_problem
from ..utils import atomic_write_json, interactive
from . import metrics
from .answer_length import answer_length_labels, breakdown
from .answer_sentence import answer_sentence_labels
from .collate import collate
from .decode import WindowCandidates, batch_candidates, candidate_chars, decode
from .examples import QADataset, QAExample
from .features import QAFeatures, StreamedFeatures, build_qa_features, example_chunks
from .readers import read_dataset

# Evaluation builds windows a few examples at a time (features.StreamedFeatures): the first pass
# tokenizes EVAL_CHUNK_CHARS characters of questions and contexts at a time, and at most
# EVAL_CACHE_TOKENS tokens of windows are kept besides the batch in flight.
EVAL_CHUNK_CHARS = 1 << 18
EVAL_CACHE_TOKENS = 1 << 18
# What a NaN-scores error calls a model evaluated without a path (training's periodic evaluation).
MODEL_NAME = "the model being evaluated"
# Freed heap pages go back to the OS every TRIM_EVERY batches and after the last (`release_freed_memory`):
# often enough that the holes of a few batches never add up, rarely enough that a GPU evaluating a
# small encoder does not wait on a heap walk per batch.
TRIM_EVERY = 16


def eval_features(examples: list[QAExample], tokenizer, cfg: RunConfig, source: str) -> QAFeatures:
    d = cfg.data
    return build_qa_features(examples, tokenizer, max_seq_len=d.max_seq_len, stride=d.stride,
                             max_query_len=d.max_query_len, context_first=d.context_first, train=False,
                             source=source)


def eval_windows(examples: list[QAExample], tokenizer, cfg: RunConfig, source: str) -> QAFeatures | StreamedFeatures:
    """The evaluation windows: built at once when the examples fit in one chunk of
    EVAL_CHUNK_CHARS characters (one question, a small dev set), else streamed batch by batch."""
    if len(example_chunks(examples, EVAL_CHUNK_CHARS)) <= 1:
        return eval_features(examples, tokenizer, cfg, source)
    d = cfg.data
    return StreamedFeatures(examples, tokenizer, chunk_chars=EVAL_CHUNK_CHARS, cache_tokens=EVAL_CACHE_TOKENS,
                            max_seq_len=d.max_seq_len, stride=d.stride, max_query_len=d.max_query_len,
                            context_first=d.context_first, source=source)


def run_windows(model, features: QAFeatures | StreamedFeatures, *, pad_id: int, padding_side: str,
                batch_size: int, n_best: int, max_answer_len: int, require_max_context: bool = False,
                max_tokens: int | None = None, accelerator=None, progress: bool = True,
                model_name: str = MODEL_NAME) -> WindowCandidates:
    """Top-n_best spans of every window, with their character spans. With an accelerator the windows
    are split across processes and the candidates gathered on every process.

    Only the batch's windows are asked of `features` (`select`), and the candidates keep their
    character spans, so with StreamedFeatures no window outlives its batch. The batches are the same
    for both kinds of features, hence so are the scores, to the bit. A batch holds at most
    `batch_size` windows and `max_tokens` padded tokens (`batching.eval_batches`). Scores with NaN
    or +inf are refused in one line naming `model_name` (`check_scores`)."""
    rank, world = (accelerator.process_index, accelerator.num_processes) if accelerator else (0, 1)
    device = accelerator.device if accelerator else next(model.parameters()).device
    # Longest first: similar lengths share a batch, so dynamic padding wastes little.
    order = np.argsort(-features.lengths, kind="stable")[rank::world]
    out = WindowCandidates.empty(len(features), n_best)
    was_training = model.training
    model.eval()
    rows = []
    with torch.inference_mode():
        batches = eval_batches(order, features.lengths, batch_size, max_tokens)
        for n, idx in enumerate(tqdm(batches, desc="eval", leave=False,
                                     disable=not progress or rank != 0 or not interactive())):
            windows = features.select(idx)  # this batch's windows, rows 0..b-1
            batch = collate(windows, np.arange(len(idx)), pad_id=pad_id, padding_side=padding_side)
            batch["window"] = torch.from_numpy(idx.astype(np.int64))
            batch = move(batch, device)
            # The model itself, not its DDP wrapper: a DDP forward syncs buffers with the other
            # processes, which run other numbers of batches here (none with fewer windows than processes).
            scores = _unwrap(model)(batch)
            check_scores(scores, model_name)
            sc, st, en, nu = batch_candidates(_unwrap(model).head, scores, batch, k=n_best,
                                              max_answer_len=max_answer_len,
                                              require_max_context=require_max_context)
            out.fill(idx, sc, st, en, nu, *candidate_chars(windows, st, en))
            rows.append(idx)
            del windows, batch, scores
            # Batches of ever shorter windows leave holes in glibc's heap that add up otherwise.
            if (n + 1) % TRIM_EVERY == 0:
                release_freed_memory()
    release_freed_memory()
    model.train(was_training)
    if world > 1:
        from accelerate.utils import gather_object

        mine = np.concatenate(rows) if rows else np.array([], np.int64)
        parts = gather_object([(mine, out.scores[mine], out.starts[mine], out.ends[mine], out.null[mine],
                                 out.start_chars[mine], out.end_chars[mine])])
        for part in parts:
            out.fill(*part)
    return out


def check_scores(scores: dict, model_name: str = MODEL_NAME) -> None:
    """Refuse a head's scores (its output dict, nested for MaP) holding NaN or +inf, in one line
    naming the model: decoding ranks NaN above every real span, so such a model (NaN weights, an
    fp16 overflow) would otherwise write answers and an F1. -inf is allowed: heads mask with it.
    One device-side reduction and one host sync per batch."""
    tensors, stack = [], [scores]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            stack.extend(x.values())
        elif torch.is_tensor(x) and x.is_floating_point():
            tensors.append(x)
    # x < inf is False exactly for NaN and +inf
    if tensors and not bool(torch.stack([(t < float("inf")).all() for t in tensors]).all()):
        raise ConfigError(f"{model_name}: the model's start/end scores are NaN or infinite (its weights hold "
                          "NaN/inf, or its precision overflows); posbias does not decode them")


def release_freed_memory() -> None:
    """Give freed heap pages (a batch's activations, its windows) back to the OS (glibc; else a no-op).

    glibc keeps freed heap pages mapped, and the next batch, of other shapes, or the n-best dicts
    and JSON text built after the loop (pymalloc arenas, mmapped buffers) rarely reuse them: on
    SQuAD dev with MiniLM the forward loop's RSS crept to 1.30 GiB without this, 1.22 GiB with it
    (one 64 x 384 batch itself needs ~0.5 GB on top of ~0.6 GB of libraries and weights).
    """
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def _unwrap(model):
    return getattr(model, "module", model)


def score_predictions(examples: list[QAExample], predictions: dict, null_odds: dict, version: int) -> dict:
    """The official SQuAD v1.1 / v2.0 result plus `by_answer_length` (MaP Fig. 6) and
    `by_answer_sentence` (Ko et al. 2020: 1, 2, 3, 4, 5+, "no answer"): bucket -> {"total", EM, "f1"},
    from the same per-question scores the overall numbers average."""
    gold = {e.id: e.gold_texts() for e in examples}
    if version == 2:
        result = metrics.squad_v2(gold, predictions, na_probs=null_odds or None)
        scores = metrics.per_question(gold, predictions, "2.0", na_probs=null_odds or None)
    else:
        scores = metrics.per_question(gold, predictions, "1.1")
        result = metrics.squad_v1(gold, predictions, scores)
    em_key = "exact" if version == 2 else "exact_match"
    result["by_answer_length"] = breakdown(answer_length_labels(examples), scores, em_key)
    result["by_answer_sentence"] = breakdown(answer_sentence_labels(examples), scores, em_key)
    return result


def predict_examples(model, tokenizer, cfg: RunConfig, examples: list[QAExample], *, source: str,
                     accelerator=None, progress: bool = True, model_name: str = MODEL_NAME):
    """examples -> (predictions, nbest, null_odds, features, candidates); features are QAFeatures
    for inputs of one chunk (see `eval_windows`), else StreamedFeatures (lengths, example_index)."""
    feats = eval_windows(examples, tokenizer, cfg, source)
    cands = run_windows(model, feats, pad_id=tokenizer.pad_token_id, padding_side=tokenizer.padding_side,
                        batch_size=cfg.train.eval_batch_size, max_tokens=cfg.train.eval_batch_tokens,
                        n_best=cfg.decode.n_best,
                        max_answer_len=cfg.decode.max_answer_len,
                        require_max_context=cfg.decode.require_max_context, accelerator=accelerator,
                        progress=progress, model_name=model_name)
    version = 2 if _unwrap(model).null_answer else 1
    preds, nbest, null_odds = decode(examples, feats, cands, n_best=cfg.decode.n_best, version=version,
                                     null_threshold=cfg.decode.null_threshold)
    return preds, nbest, null_odds, feats, cands


def evaluate_dataset(model, tokenizer, cfg: RunConfig, dataset: QADataset, out_dir=None, *,
                     accelerator=None, progress: bool = True, model_name: str = MODEL_NAME) -> dict:
    """Predict, score and (main process) write predictions.json, nbest.json, null_odds.json, metrics.json
    (the official SQuAD keys, `windows`, `skipped_records`, `by_answer_length`, `by_answer_sentence`).
    `model_name`: what an error about the model's scores calls it (its path)."""
    if not _unwrap(model).null_answer and dataset.has_impossible:
        # A v1 model (no null answer) cannot be scored by v1 rules on a question without a gold answer.
        qid = next(e.id for e in dataset.examples if e.is_impossible)
        raise DataError(dataset.path, qid, "question is unanswerable (is_impossible), but the model has no "
                                           "null answer (trained on SQuAD v1 data); evaluate it on answerable "
                                           "questions only")
    preds, nbest, null_odds, feats, _ = predict_examples(model, tokenizer, cfg, dataset.examples,
                                                         source=dataset.path, accelerator=accelerator,
                                                         progress=progress, model_name=model_name)
    version = 2 if _unwrap(model).null_answer else 1
    result = score_predictions(dataset.examples, preds, null_odds, version)
    metrics.check_ranges(result)
    result["windows"] = len(feats)
    result["skipped_records"] = len(dataset.skipped)
    if out_dir is not None and (accelerator is None or accelerator.is_main_process):
        write_predictions(out_dir, preds, nbest, null_odds)
        atomic_write_json(Path(out_dir) / "metrics.json", result)
    return result


def write_predictions(out_dir, predictions: dict, nbest: dict, null_odds: dict) -> None:
    """predictions.json (official format), nbest.json, null_odds.json (official na_prob format)."""
    out = Path(out_dir)
    atomic_write_json(out / "predictions.json", predictions)
    atomic_write_json(out / "nbest.json", nbest, indent=None)
    atomic_write_json(out / "null_odds.json", null_odds)


def main_metric(result: dict) -> float:
    """F1 of a v1 or v2 result dict (what best-checkpoint selection compares)."""
    if "f1" not in result:
        raise ConfigError(f"no f1 in evaluation result {sorted(result)}")
    return float(result["f1"])


def evaluate_checkpoint(model, data, output_dir=None, overrides=None, progress: bool = True) -> dict:
    """Score a checkpoint (posbias or Hugging Face QA folder) on a QA file; writes predictions,
    metrics and the run's config/versions into `output_dir` when given."""
    return evaluate_file(model, data, output_dir, overrides, "qa", partial(evaluate_dataset, model_name=str(model)),
                         progress=progress)


def predict_checkpoint(model, question: str | None = None, context: str | None = None, data=None,
                       output_dir=None, n_best: int | None = None, overrides=None, progress: bool = False) -> dict:
    """Answer one question (question + context) or every question of a file.

    `data` needs no answers: SQuAD JSON (answers, where present, are not used), MRQA JSONL, or a
    JSONL of questions, one object per line (`posbias.qa.questions`):

        {"id": "q1", "question": "Who wrote it?", "context": "Ada Lovelace wrote ..."}

    Returns id -> {"answer", "probability", "start_char", "nbest"}; with `output_dir`, also writes
    predictions.json, nbest.json, null_odds.json.
    """
    import time

    if (question is None) != (context is None) or (question is None) == (data is None):
        raise ConfigError("predict needs either question and context, or data")
    if n_best is not None and n_best < 1:
        raise ConfigError(f"--n-best must be >= 1, got {n_best} (it sets decode.n_best)")
    with staged_output(output_dir) as out, opened_for_eval(model, overrides, "qa") as (net, tokenizer, cfg):
        if n_best is not None:
            cfg = build_config(cfg.to_dict(), {"decode": {"n_best": n_best}})
        t0 = time.time()
        skipped = []
        if data is not None:
            ds = read_dataset(data, cfg.data.on_bad_record, labeled=False)  # answers not needed
            examples, source, skipped = ds.examples, ds.path, ds.skipped
        else:
            if not question.strip() or not context.strip():
                raise ConfigError("question and context must be non-empty")
            for name, text in (("question", question), ("context", context)):
                if reason := unicode_problem(text):
                    raise ConfigError(f"{name} {reason}")
            examples, source = [QAExample(id="q0", question=question, context=context)], "<command line>"
        preds, nbest, null_odds, _, _ = predict_examples(net, tokenizer, cfg, examples, source=source,
                                                         progress=progress, model_name=str(model))
        if out is not None:
            write_predictions(out, preds, nbest, null_odds)
            write_run_meta(out, cfg, "predict", model, source, t0, skipped=skipped)
    result = {}
    for e in examples:
        top = next((c for c in nbest[e.id] if c["text"] == preds[e.id]), None)
        result[e.id] = {"answer": preds[e.id], "probability": top["probability"] if top else None,
                        "start_char": top["start_char"] if top else -1, "nbest": nbest[e.id]}
    return result
