"""`posbias diagnose generation`: where in its prompt a causal LM stops using the document that answers.

Multi-document QA as Liu et al. (TACL 2024, "Lost in the Middle") built it (`benchmark.py`): each
question's gold paragraph among k − 1 distractor paragraphs of other articles, the gold at every
position 1..k (paired: only its place moves). Each prompt is scored (`scoring.py`) by the gold
answer's log-likelihood (one forward, works for base models) and/or by greedy generation (Liu et al.'s
accuracy: a normalised gold answer inside the output; SQuAD EM/F1 of its first line). The verdict
(`analysis.py`): the curve over positions, last vs first, the U-shape (middle − best edge), the trend
and PSI, paired by question with bootstrap intervals.

Mitigations, each on the same questions and gold positions and compared with the unmodified model
(paired): `reorder` (LangChain's `LongContextReorder` by BM25 relevance: the most relevant documents at
the edges) and `mspoe` (Ms-PoE, Zhang et al. 2024: per-head rescaled position indices; RoPE models).
Optionally a depth × length grid (needle in a haystack with a real question): the gold paragraph at
depth d of about L tokens of other articles, scored by log-likelihood, shown as a heatmap with counts.

Scores are kept per prompt in `cache_dir` as they are computed (`cache.py`): a killed run resumes, and
a second diagnosis of the same model and data reads them back.
"""
from __future__ import annotations

import contextlib
import math
import random
import time
from pathlib import Path, PurePath

import numpy as np
from tqdm.auto import tqdm

from ..analysis import verdict as V
from ..errors import ConfigError
from ..interrupt import stop_on_signals
from ..outputs import staged_output
from ..qa.readers import read_dataset
from ..render import Document, data_label, fmt, md_escape, pyplot
from ..diagnoses import answerable
from ..utils import atomic_write_json, check_ranges, now_iso, versions
from . import benchmark as B
from .paired import mean_interval, paired_difference, position_verdict, sentence, u_text
from .cache import ScoreCache, item_key
from .lm import default_cache_dir
from .backend import BACKENDS, SLOT_SLACK, check_backend_options, open_model
from .endpoint import PartialScores
from .mspoe import LAYER_CHOICES, ORDERS as MSPOE_ORDERS, ms_poe, resolve_layers
from .endpoint import CHECK_SAMPLE
from .scoring import MAX_BATCH_TOKENS, Encoded, Rate, render, squad_scores

SCORINGS = ("loglik", "generation")
MITIGATIONS = ("reorder", "mspoe")
OUTPUTS = frozenset({"diagnosis.md", "diagnosis.html", "diagnosis.json", "run_info.json", "scores.json",
                     "predictions.json", "score_by_position.png", "depth_length.png"})
METRICS = {"loglik": ("answer probability", "per-token probability of the gold answer, %"),
           "accuracy": ("accuracy", "a normalised gold answer in the output (Liu et al.), %"),
           "exact": ("EM", "SQuAD exact match of the first line"), "f1": ("F1", "SQuAD F1 of the first line")}
CONDITIONS = {"original": "unmodified", "reorder": "reordered (BM25, edges first)", "mspoe": "Ms-PoE"}
REFERENCES = {"closed_book": "closed-book (no documents)", "oracle": "the gold document alone"}
"""Liu et al.'s two reference points, scored with the unmodified model: the floor and the ceiling."""
ROOM = 64
"""Prompt tokens kept free beside the documents' budget: instruction, question, labels, answer."""
CHUNK = 64
"""Prompts scored between two writes of the score cache."""


def _check_int(name: str, value, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"diagnose generation: {name} must be an integer >= {low}, got {value!r}")


def _check_choice(name: str, values, allowed) -> tuple:
    values = tuple(values)
    bad = [v for v in values if v not in allowed]
    if bad or len(set(values)) != len(values):
        raise ConfigError(f"diagnose generation: {name} must be distinct values among {', '.join(allowed)}, "
                          f"got {', '.join(map(str, values))}")
    return values


# ------------------------------------------------------------------------------------------ scoring
class Scorer:
    """Scores prompts with one model, through the score cache, in chunks (module docstring)."""

    def __init__(self, lm, cache_dir, *, batch_size: int, max_new_tokens: int, progress: bool,
                 batch_tokens: int = MAX_BATCH_TOKENS):
        self.lm, self.batch_size, self.max_new_tokens = lm, batch_size, max_new_tokens
        self.batch_tokens = batch_tokens
        prec = lm.precision.name
        self.caches = {"loglik": ScoreCache(cache_dir, lm.fingerprint, prec, "loglik", float),
                       "generation": ScoreCache(cache_dir, lm.fingerprint, prec, "generation", str)}
        self.progress = progress
        self.seconds: dict[str, float] = {}
        self.computed: dict[str, int] = {}

    def score(self, kind: str, items: list[Encoded], condition: str, context=contextlib.nullcontext) -> list:
        """Each item's score (loglik: mean log-probability; generation: the answer's first line)."""
        cache = self.caches[kind]
        extra = self.max_new_tokens if kind == "generation" else None
        check_fits(items, int(self.lm.context_length), self.lm.source, extra)
        keys = [item_key(kind, condition, e.prompt, e.answer if kind == "loglik" else extra) for e in items]
        todo: dict[str, Encoded] = {}
        for k, e in zip(keys, items):
            if k not in cache and k not in todo:
                todo[k] = e
        name = f"{kind}, {condition}"
        if todo:
            rate = Rate()
            bar = tqdm(total=len(todo), desc=name, unit="prompt", disable=not self.progress, leave=False)
            pending = list(todo.items())
            with context() as handle:
                # Ms-PoE orders its heads at one query per row: the last prompt token, as at generation's prefill
                before = (lambda cols: setattr(handle, "query_index", cols)) if hasattr(handle, "query_index") else None
                for lo in range(0, len(pending), CHUNK):
                    part = pending[lo:lo + CHUNK]
                    enc = [e for _, e in part]
                    convert = float if kind == "loglik" else str
                    try:
                        if kind == "loglik":
                            vals = self.lm.loglik(enc, batch_size=self.batch_size, max_tokens=self.batch_tokens,
                                                  before=before)
                        else:
                            if before is not None:
                                handle.query_index = None  # generation orders the heads at its own prefill
                            vals = self.lm.generate(enc, batch_size=self.batch_size, max_tokens=self.batch_tokens,
                                                    max_new_tokens=self.max_new_tokens)
                    except PartialScores as p:  # a server failed part way: keep what it finished, then stop
                        cache.add({part[i][0]: convert(v) for i, v in sorted(p.done.items())})
                        raise p.error from None
                    cache.add({k: convert(v) for (k, _), v in zip(part, vals)})
                    rate(len(part))
                    bar.update(len(part))
            bar.close()
            self.seconds[name] = self.seconds.get(name, 0.0) + rate.seconds
            self.computed[name] = self.computed.get(name, 0) + len(todo)
        return [cache[k] for k in keys]


def _encode(lm, texts: list[str], answers: list[str], chat: bool) -> list[Encoded]:
    return lm.encode(texts, answers, chat)


def score_matrix(scorer: Scorer, kind: str, questions, layouts, condition: str, chat: bool, context=contextlib.nullcontext,
                 template: str = B.QA_PROMPT) -> dict[str, np.ndarray]:
    """Per-question scores (q, k) of `questions` laid out by `layouts(question, position)` (the documents
    in prompt order): loglik -> {"loglik", "logprob"}; generation -> {"accuracy", "exact", "f1"} and
    "predictions" (q, k) of strings. Scores in points."""
    k = questions[0].k
    texts = [B.prompt(q.question, layouts(q, p), template=template) for q in questions for p in range(1, k + 1)]
    flat = _scored(scorer, kind, texts, [q for q in questions for _ in range(k)], condition, chat, context)
    return {m: v.reshape(len(questions), k) for m, v in flat.items()}


def _scored(scorer: Scorer, kind: str, texts: list[str], questions, condition: str, chat: bool,
            context=contextlib.nullcontext) -> dict[str, np.ndarray]:
    """Scores of prompt `texts[i]` for the gold answers of `questions[i]`, each metric a 1-D array in
    points (score_matrix's metrics)."""
    enc = _encode(scorer.lm, texts, [q.answers[0] for q in questions], chat)
    vals = scorer.score(kind, enc, condition, context)
    if kind == "loglik":
        lp = np.asarray(vals, dtype=np.float64)
        return {"loglik": 100.0 * np.exp(lp), "logprob": lp}
    preds = np.asarray(vals, dtype=object)
    acc = np.array([100.0 * B.best_subspan_em(p, q.answers) for p, q in zip(preds, questions)])
    em_f1 = np.array([squad_scores(p, q.answers) for p, q in zip(preds, questions)]).reshape(-1, 2)
    return {"accuracy": acc, "exact": em_f1[:, 0], "f1": em_f1[:, 1], "predictions": preds}


def reference_scores(scorer: Scorer, kind: str, questions, chat: bool, template: str = B.QA_PROMPT) -> dict:
    """Liu et al.'s references with the unmodified model, per question: closed-book (the question alone,
    their closed-book prompt) and oracle (the gold document alone, in `template`). {reference: metric
    -> (q,)}."""
    prompts = {"closed_book": [B.closedbook_prompt(q.question) for q in questions],
               "oracle": [B.prompt(q.question, [q.gold], template=template) for q in questions]}
    return {ref: _scored(scorer, kind, texts, questions, ref.replace("_", "-"), chat)
            for ref, texts in prompts.items()}


def mspoe_tag(mspoe: dict) -> str:
    """The score cache's name of an Ms-PoE setting: the ratios, and the layers and head order where they are
    not the authors' (every layer but the first two, outlier order), so that scores cached before the
    two options existed are still read for that setting."""
    lo, hi = mspoe["ratios"]
    tag = f"mspoe-{lo:g}-{hi:g}"
    if list(mspoe.get("resolved", [])) == list(mspoe.get("authors_layers", [])) and mspoe["order"] == "outlier":
        return tag
    return f"{tag}-layers{','.join(map(str, mspoe.get('resolved', [])))}-{mspoe['order']}"


def reorder_layout(q, p: int) -> list:
    """LongContextReorder of the documents with the gold at position p, by BM25 relevance to the question."""
    docs = q.documents(p)
    return B.long_context_reorder(docs, B.bm25_relevance(q.question, docs))


# ----------------------------------------------------------------------------------------- the command
def diagnose(model, data, output_dir, *, k: int = 5, scorings=("loglik",), mitigations=(), max_questions: int | None = None,
             max_prompt_tokens: int | None = None, lengths=(), depths=None, template: str = "qa", chat: str = "auto",
             max_new_tokens: int = 32, batch_size: int = 8, batch_tokens: int = MAX_BATCH_TOKENS, seed: int = 0,
             device: str = "auto",
             precision: str = "auto", cache_dir=None, mspoe_ratios=(1.2, 1.8), mspoe_layers="auto",
             mspoe_head_order: str = "outlier", distractors: str = "random", references: bool = True,
             endpoint: str | None = None, backend: str = "auto", api_key_env: str | None = None,
             tokenizer: str | None = None, concurrency: int = 4, timeout: float = 300.0, retries: int = 4,
             llama_server_args: str | None = None, bias_samples: int = V.DEFAULT_SAMPLES,
             min_bucket: int = V.MIN_BUCKET, quality_floor: float = V.QUALITY_FLOOR, progress: bool = True) -> dict:
    """Diagnose a causal LM's position bias on SQuAD-format `data` (module docstring); writes
    diagnosis.md/.html/.json, scores.json, predictions.json (with generation) and plots into
    `output_dir`. Returns the diagnosis dict with `verdict_lines`, what the CLI prints.

    Args:
        model: a Hugging Face causal-LM folder, a cached Hub id, a .gguf file, `gemma` (the packaged
            Gemma 3 270M), or an object with `posbias.generation.lm.LM`'s members; with `endpoint`, the
            model's name on the server (None: the one model it serves).
        k: documents per prompt (the gold one and k − 1 distractors).
        scorings: "loglik" and/or "generation".
        mitigations: "reorder" and/or "mspoe", each compared with the unmodified model.
        max_questions: N answerable questions drawn at random (seeded by `seed`) over the whole file,
            kept in file order; distractors come from the whole file.
        max_prompt_tokens: the documents' budget plus `ROOM`; default the model's context, at most 4,096.
        lengths: haystack lengths L (tokens) for the depth × length grid; empty: no grid.
        distractors: "random" (drawn from other articles) or "bm25" (the other articles' paragraphs BM25
            ranks highest for the question, most relevant first: Liu et al.'s retrieved distractors).
        template: Liu et al.'s prompt: "qa", "qa_query_aware" or "qa_ordered_randomly".
        chat: "auto" (the tokenizer's chat template where it has one), "on" or "off".
        cache_dir: scores (and a converted GGUF) kept here; default `default_cache_dir()`.
        mspoe_ratios: Ms-PoE's (minimum, maximum) position compression ratio.
        mspoe_layers: the layers Ms-PoE patches: "auto" (the global-attention layers of a model that
            mixes sliding-window and global attention, else every layer but the first two, as the
            authors), "all", "global", or a list of indices (`posbias.generation.mspoe.resolve_layers`).
        mspoe_head_order: "outlier" (the paper's ranking), "reversed" (the authors' fixed order for
            later gold positions) or "index".
        references: also score Liu et al.'s closed-book (no documents) and oracle (the gold document
            alone) prompts with the unmodified model: the floor and the ceiling of the position curve.
        batch_size, batch_tokens: prompts and padded tokens per forward batch at most (a longer single
            prompt still runs alone); neither changes a score.
        endpoint: an OpenAI-compatible server's URL (`posbias.generation.endpoint`): the model is scored
            there, not loaded here.
        backend: for a .gguf file or `gemma`: `auto` (llama.cpp's server when it is installed and no
            mitigation needs the weights here), `llama.cpp` or `transformers` (`posbias.generation.backend`).
        api_key_env: the environment variable holding the server's key (never written anywhere).
        tokenizer: with `endpoint`, a local tokenizer (folder or cached Hub id) for a server without
            /tokenize; checked against the server on sample prompts.
        concurrency: requests in flight at once (a started llama.cpp server gets as many slots).
        timeout, retries: seconds per request, and retries (with backoff) of a failed one.
        llama_server_args: extra options for the llama.cpp server posbias starts (e.g. "-ngl 99").
    """
    _check_int("k", k, 1)
    _check_int("batch_size", batch_size, 1)
    _check_int("batch_tokens", batch_tokens, 1)
    _check_int("max_new_tokens", max_new_tokens, 1)
    if max_questions is not None:
        _check_int("max_questions", max_questions, 1)
    if max_prompt_tokens is not None:
        _check_int("max_prompt_tokens", max_prompt_tokens, ROOM + 1)
    scorings = _check_choice("scorings", scorings, SCORINGS)
    if not scorings:
        raise ConfigError("diagnose generation: scorings must name at least one of loglik, generation")
    mitigations = _check_choice("mitigations", mitigations, MITIGATIONS)
    depths = B.DEPTHS if depths is None else tuple(depths)
    if len(mspoe_ratios) != 2 or not all(isinstance(r, (int, float)) and not isinstance(r, bool) and 1 <= r < math.inf
                                         for r in mspoe_ratios) or mspoe_ratios[0] > mspoe_ratios[1]:
        raise ConfigError(f"diagnose generation: mspoe_ratios must be (minimum, maximum), 1 <= minimum <= maximum, "
                          f"got {mspoe_ratios!r}")
    for L in lengths:
        _check_int("lengths", L, 1)
    for d in depths:
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0 <= d <= 1:
            raise ConfigError(f"diagnose generation: depths must be fractions in [0, 1], got {d!r}")
    if template not in B.TEMPLATES:
        raise ConfigError(f"diagnose generation: template must be one of {', '.join(B.TEMPLATES)}, got {template!r}")
    if chat not in ("auto", "on", "off"):
        raise ConfigError(f"diagnose generation: chat must be auto, on or off, got {chat!r}")
    if distractors not in B.DISTRACTORS:
        raise ConfigError(f"diagnose generation: distractors must be one of {', '.join(B.DISTRACTORS)}, "
                          f"got {distractors!r}")
    _check_int("concurrency", concurrency, 1)
    _check_int("retries", retries, 0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf:
        raise ConfigError(f"diagnose generation: timeout must be a positive number of seconds, got {timeout!r}")
    check_backend_options(model, endpoint=endpoint, backend=backend, needs_weights="mspoe" in mitigations)
    if mspoe_head_order not in MSPOE_ORDERS:
        raise ConfigError(f"diagnose generation: mspoe_head_order must be one of {', '.join(MSPOE_ORDERS)}, "
                          f"got {mspoe_head_order!r}")
    if isinstance(mspoe_layers, str):
        if mspoe_layers not in LAYER_CHOICES:
            raise ConfigError(f"diagnose generation: mspoe_layers must be one of {', '.join(LAYER_CHOICES)} or a "
                              f"list of layer indices, got {mspoe_layers!r}")
    else:
        mspoe_layers = tuple(mspoe_layers)
        for i in mspoe_layers:
            _check_int("mspoe_layers", i, 0)
    lo_r, hi_r = mspoe_ratios
    t0 = time.time()
    ds = read_dataset(data)
    usable = answerable(ds.examples)
    if not usable:
        raise ConfigError(f"{ds.path}: no answerable question (diagnose generation needs questions with answers)")
    cache_dir = default_cache_dir() if cache_dir is None else Path(cache_dir)
    _check_apart(cache_dir, Path(output_dir))
    slot = (max_prompt_tokens or 4096) + max(max_new_tokens, ROOM) + SLOT_SLACK
    with stop_on_signals(), open_model(model, endpoint=endpoint, backend=backend, needs_weights="mspoe" in mitigations,
                                       api_key_env=api_key_env, tokenizer=tokenizer, concurrency=concurrency,
                                       timeout=timeout, retries=retries, server_args=llama_server_args, slot_tokens=slot,
                                       device=device, precision=precision, cache_dir=cache_dir) as lm:
        if "loglik" in scorings and hasattr(lm, "probe_loglik"):
            lm.probe_loglik()  # a server that cannot score log-likelihoods is refused before any work
        return _open_diagnose(lm, ds, usable, output_dir, cache_dir, k=k, scorings=scorings, mitigations=mitigations,
                              max_questions=max_questions, max_prompt_tokens=max_prompt_tokens, lengths=lengths,
                              depths=depths, template=template, chat=chat, max_new_tokens=max_new_tokens,
                              batch_size=batch_size, batch_tokens=batch_tokens, seed=seed,
                              mspoe={"ratios": (lo_r, hi_r), "layers": mspoe_layers, "order": mspoe_head_order},
                              distractors=distractors,
                              references=references, samples=bias_samples, min_bucket=min_bucket,
                              floor=quality_floor, progress=progress, t0=t0)


def _check_apart(cache_dir: Path, output_dir: Path) -> None:
    """Refuse a cache inside the output folder (or the other way round): the output folder is replaced
    whole when the diagnosis is written, which would delete the scores it kept."""
    cache, out = cache_dir.expanduser().resolve(), output_dir.expanduser().resolve()
    if cache == out or out in cache.parents or cache in out.parents:
        raise ConfigError(f"--cache-dir {cache_dir} and --output-dir {output_dir} overlap: the output folder is "
                          "replaced when the report is written, and the scores kept in the cache would go with it; "
                          "give them separate folders")


def _check_context(lm, scorings, max_prompt_tokens, max_new_tokens) -> None:
    """The prompt budget and the generated answer must fit the model's context (one line, before any scoring)."""
    ctx = int(lm.context_length)
    if max_prompt_tokens is not None and max_prompt_tokens > ctx:
        raise ConfigError(f"--max-prompt-tokens {max_prompt_tokens} is more than {lm.source}'s context of {ctx} "
                          "tokens")
    if "generation" in scorings and max_new_tokens >= ctx:
        raise ConfigError(f"--max-new-tokens {max_new_tokens} does not fit {lm.source}'s context of {ctx} tokens")


def check_fits(encoded, context: int, source: str, extra: int | None = None) -> None:
    """Every prompt with its answer (log-likelihood) or its `extra` generated tokens (generation) within the
    model's `context`, else one line naming the longest: a longer input would index past a learned position
    table (an IndexError deep inside the model) or read positions the model was never trained on."""
    need = [len(e.prompt) + (len(e.answer) if extra is None else extra) for e in encoded]
    if need and max(need) > context:
        i = max(range(len(need)), key=need.__getitem__)
        what = "its gold answer" if extra is None else f"{extra} new tokens"
        raise ConfigError(f"a prompt of {len(encoded[i].prompt):,} tokens with {what} needs {need[i]:,} positions; "
                          f"{source}'s context holds {context:,}: lower --max-prompt-tokens (or --k, "
                          "--max-new-tokens)")


def _open_diagnose(lm, ds, usable, output_dir, cache_dir, *, k, scorings, mitigations, max_questions, max_prompt_tokens,
                   lengths, depths, template, chat, max_new_tokens, batch_size, batch_tokens, seed, mspoe, references,
                   distractors,
                   samples, min_bucket, floor, progress, t0) -> dict:
    """`diagnose` once its model is open: the question set, the scoring, the report."""
    if "mspoe" in mitigations:  # refused before any scoring: a model Ms-PoE cannot patch, a bad layer list
        mspoe = {**mspoe, "layers": resolve_layers(lm.model, mspoe["layers"])}
        with ms_poe(lm.model, min_ratio=mspoe["ratios"][0], max_ratio=mspoe["ratios"][1], layers=mspoe["layers"],
                    order=mspoe["order"]):
            pass
        mspoe["resolved"] = list(mspoe["layers"])
        mspoe["authors_layers"] = resolve_layers(lm.model, "all")
    _check_context(lm, scorings, max_prompt_tokens, max_new_tokens)
    use_chat = lm.chat_template if chat == "auto" else chat == "on"
    if use_chat and not lm.chat_template:
        raise ConfigError(f"diagnose generation: --chat on, but {lm.source}'s tokenizer has no chat template")
    room = max_new_tokens if "generation" in scorings else 0  # the generated answer shares the context
    budget = (max_prompt_tokens or min(int(lm.context_length) - room, 4096)) - ROOM
    ids = None
    if max_questions and max_questions < len(usable):  # a seeded draw over the whole file, kept in file order
        pick = sorted(random.Random(f"questions:{seed}").sample(range(len(usable)), max_questions))
        ids = [usable[i].id for i in pick]
    mset = B.multi_document_qa(ds.examples, lm.count_tokens, k=k, max_doc_tokens=budget, seed=seed, question_ids=ids,
                               distractors=distractors)
    if not mset.questions:
        raise ConfigError(f"{ds.path}: no question fits {k} documents in {budget} tokens "
                          f"({', '.join(f'{r} {n}' for r, n in mset.stats.get('left_out', {}).items())})")
    if hasattr(lm, "check_tokenizer"):  # a local tokenizer against the server's, on real prompts
        tmpl = B.TEMPLATES[template]
        lm.check_tokenizer([render(lm.tokenizer, B.prompt(q.question, q.documents(1), template=tmpl), use_chat)
                            for q in mset.questions[:CHECK_SAMPLE]], chat=use_chat)
    scorer = Scorer(lm, cache_dir, batch_size=batch_size, max_new_tokens=max_new_tokens, progress=progress,
                    batch_tokens=batch_tokens)
    with staged_output(output_dir, names=OUTPUTS) as out:
        return _diagnose(lm, ds, mset, scorer, out, Path(output_dir), scorings=scorings, mitigations=mitigations,
                         lengths=tuple(lengths), depths=tuple(depths), template=template, chat=use_chat, seed=seed,
                         mspoe=mspoe, references=bool(references), samples=samples, min_bucket=min_bucket,
                         floor=float(floor), t0=t0, budget=budget)


def _diagnose(lm, ds, mset, scorer: Scorer, out: Path, final: Path, *, scorings, mitigations, lengths, depths, template,
              chat, seed, mspoe, references, samples, min_bucket, floor, t0, budget) -> dict:
    qs = mset.questions
    tmpl = B.TEMPLATES[template]
    k = qs[0].k
    layouts = {"original": lambda q, p: q.documents(p), "reorder": reorder_layout, "mspoe": lambda q, p: q.documents(p)}
    ratios = mspoe["ratios"]
    contexts = {"mspoe": lambda: ms_poe(lm.model, min_ratio=ratios[0], max_ratio=ratios[1], layers=mspoe["layers"],
                                        order=mspoe["order"])}
    tags = {"original": "original", "reorder": "reorder-bm25",
            "mspoe": mspoe_tag(mspoe)}
    scores: dict[str, dict[str, dict]] = {}  # scoring -> condition -> metric -> (q, k)
    for kind in scorings:
        scores[kind] = {}
        for cond in ("original", *mitigations):
            scores[kind][cond] = score_matrix(scorer, kind, qs, layouts[cond], tags[cond], chat,
                                              contexts.get(cond, contextlib.nullcontext), template=tmpl)
    refs = {kind: reference_scores(scorer, kind, qs, chat, template=tmpl) for kind in scorings} if references else {}
    metrics = [m for kind in scorings for m in (("loglik",) if kind == "loglik" else ("accuracy", "exact", "f1"))]
    kind_of = {"loglik": "loglik", "accuracy": "generation", "exact": "generation", "f1": "generation"}
    res = {"model": lm.describe(), "data": str(ds.path), "k": k, "set": mset.stats, "template": template,
           "chat_template": bool(chat), "scorings": list(scorings), "mitigations": list(mitigations),
           "bootstrap_samples": samples, "min_bucket": min_bucket, "verdicts": {}, "overall": {},
           "mitigation_effects": {}, "references": {}, "heatmap": None,
           "mspoe": ({"ratios": list(mspoe["ratios"]), "layers": mspoe["resolved"], "head_order": mspoe["order"],
                      "authors_layers": mspoe["resolved"] == mspoe["authors_layers"]}
                     if "mspoe" in mitigations else None)}
    for m in metrics:
        per = scores[kind_of[m]]
        res["verdicts"][m] = {c: position_verdict(per[c][m], samples=samples, seed=seed, min_size=min_bucket)
                              for c in per}
        res["overall"][m] = {c: float(per[c][m].mean()) for c in per}
        res["mitigation_effects"][m] = {c: paired_difference(per[c][m], per["original"][m], samples=samples, seed=seed)
                                        for c in per if c != "original"}
        if refs:
            res["references"][m] = {r: mean_interval(v[m], samples=samples, seed=seed)
                                    for r, v in refs[kind_of[m]].items()}
    if "loglik" in scorings:
        res["mean_logprob"] = {c: float(v["logprob"].mean()) for c, v in scores["loglik"].items()}
    if lengths:
        res["heatmap"] = _heatmap(scorer, ds, qs, lengths, depths, seed, chat, tmpl, samples=samples,
                                  min_bucket=min_bucket)
    res["model"] = lm.describe()  # after the scoring: a server's request count
    primary = "accuracy" if "generation" in scorings else "loglik"
    res["primary"] = primary
    res["quality"] = V.quality(res["overall"]["accuracy"]["original"], floor, metric="accuracy") \
        if "accuracy" in metrics else {"score": None, "floor": floor, "metric": "accuracy", "below": False}
    n_prompts = len(qs) * k
    res["timings_s"] = {name: round(s, 2) for name, s in scorer.seconds.items()}
    res["seconds_per_prompt"] = {name: round(scorer.seconds[name] / n, 4) for name, n in scorer.computed.items() if n}
    res["prompts_computed"] = dict(scorer.computed)
    res["prompts"], res["questions"] = n_prompts, len(qs)
    res["seconds"] = round(time.time() - t0, 2)
    check_ranges({"overall": res["overall"], "verdicts": res["verdicts"], "references": res["references"]},
                 frozenset({"score"}), "generation metrics")
    plots = _plots(res, out)
    res["verdict_lines"] = _terminal(res, final, len(plots))
    _report(res, out, plots)
    atomic_write_json(out / "scores.json", {
        "question_ids": [q.id for q in qs], "positions": list(range(1, k + 1)),
        **{f"{kind}/{cond}/{m}": v.tolist() for kind, per in scores.items() for cond, ms in per.items()
           for m, v in ms.items() if m != "predictions"},
        **{f"{kind}/{ref}/{m}": v.tolist() for kind, per in refs.items() for ref, ms in per.items()
           for m, v in ms.items() if m != "predictions"}})
    if "generation" in scorings:
        atomic_write_json(out / "predictions.json", {
            **{cond: {q.id: list(ms["predictions"][i]) for i, q in enumerate(qs)}
               for cond, ms in scores["generation"].items()},
            **{ref: {q.id: [ms["predictions"][i]] for i, q in enumerate(qs)}
               for ref, ms in refs.get("generation", {}).items()}})
    atomic_write_json(out / "diagnosis.json", res)
    atomic_write_json(out / "run_info.json", {"command": "diagnose generation", "model": lm.source,
                                              "data": str(ds.path), "finished": now_iso(), "seconds": res["seconds"],
                                              "seed": seed, "k": k, "budget_tokens": budget,
                                              "scorings": list(scorings), "mitigations": list(mitigations),
                                              "mspoe_ratios": list(ratios), "mspoe_layers": mspoe.get("resolved"),
                                              "mspoe_head_order": mspoe["order"], "template": template, "chat": chat,
                                              "distractors": mset.stats.get("distractors"),
                                              "references": bool(refs),
                                              "lengths": list(lengths), "depths": list(depths),
                                              "max_new_tokens": scorer.max_new_tokens, "batch_size": scorer.batch_size,
                                              "batch_tokens": scorer.batch_tokens,
                                              "versions": versions(), **lm.describe()})
    return res


def _heatmap(scorer: Scorer, ds, qs, lengths, depths, seed: int, chat: bool, tmpl: str, *,
             samples: int = V.DEFAULT_SAMPLES, min_bucket: int = V.MIN_BUCKET) -> dict:
    """Log-likelihood scores over the depth × length grid, for the questions of the multi-document set;
    per length, the position verdict over depths (paired over the questions whose haystack has every
    depth, as the multi-document verdict is over positions)."""
    hs = B.haystacks(ds.examples, scorer.lm.count_tokens, lengths=lengths, depths=depths, seed=seed,
                     question_ids=[q.id for q in qs])
    texts, answers, where = [], [], []
    for h in hs.haystacks:
        for i in range(len(h.depths)):
            texts.append(B.prompt(h.question, h.documents(i), template=tmpl))
            answers.append(h.answers[0])
            where.append((h.length, i, h.actual_depths[i], h.id))
    vals = scorer.score("loglik", _encode(scorer.lm, texts, answers, chat), "haystack") if texts else []
    cells: dict[tuple[int, int], list[float]] = {}
    actual: dict[tuple[int, int], list[float]] = {}
    rows: dict[int, dict[str, list[float]]] = {}  # length -> haystack's question -> its score at each depth
    for (L, i, a, qid), v in zip(where, vals):
        cells.setdefault((L, i), []).append(100.0 * math.exp(v))
        actual.setdefault((L, i), []).append(a)
        rows.setdefault(L, {}).setdefault(qid, [math.nan] * len(depths))[i] = 100.0 * math.exp(v)
    grid = [[{"n": len(cells.get((L, i), [])),
              "score": float(np.mean(cells[(L, i)])) if cells.get((L, i)) else None,
              "actual_depth": float(np.mean(actual[(L, i)])) if actual.get((L, i)) else None}
             for i in range(len(depths))] for L in lengths]
    verdicts = []
    for L in lengths:
        full = [r for r in rows.get(L, {}).values() if not any(math.isnan(x) for x in r)]
        mat = np.array(full, dtype=np.float64).reshape(len(full), len(depths))
        verdicts.append({"length": L, **position_verdict(mat, samples=samples, seed=seed, min_size=min_bucket)})
    return {"lengths": list(lengths), "depths": list(depths), "cells": grid, "set": hs.stats, "verdicts": verdicts}


# ------------------------------------------------------------------------------------------ report
def _metric_name(m: str) -> str:
    return METRICS[m][0]


HEADLINE = ("accuracy", "loglik")
"""The scores the verdict speaks in (EM and F1 are in the tables): Liu et al.'s accuracy, the answer's probability."""


def _terminal(res: dict, final: Path, plots: int) -> list[str]:
    lines = [f"Position diagnosis of {res['model']['model']} on {data_label(res['data'])} (generation, "
             f"{res['k']} documents, {res['questions']:,} questions)"]
    warn = V.quality_text(res["quality"])
    if warn:
        lines.append("  " + warn)
    for m in (x for x in HEADLINE if x in res["verdicts"]):
        name = _metric_name(m)
        v = res["verdicts"][m]["original"]
        lines.append(f"  {name}: {sentence(v, name)}")
        if v.get("effect") is not None:
            lines.append("    " + "; ".join([u_text(v, name), V.trend_text(v.get("trend"), name), V.psi_text(
                {"psi": v["psi"], "psi_ci": v["psi_ci"], "curve": v["curve"]}).replace("copies", "positions")]))
        if res.get("references", {}).get(m):
            lines.append("    " + _reference_text(res, m))
        for cond, d in res["mitigation_effects"][m].items():
            lines.append(f"    {CONDITIONS[cond]} − unmodified: {V.minus_signed(d['effect'])} {name} "
                         f"[{V.ci_words(d['ci'])}] over all positions"
                         + (f", {V.minus_signed(d['middle']['effect'])} in the middle" if d["middle"] else ""))
    lines.append(V.report_line(final, plots))
    return lines


def _reference_text(res: dict, m: str) -> str:
    """One line: the references of metric m beside the k-document mean."""
    r = res["references"][m]
    return (f"references: {REFERENCES['closed_book']} {fmt(r['closed_book']['score'])}, "
            f"{REFERENCES['oracle']} {fmt(r['oracle']['score'])}; {res['k']} documents, mean of the positions "
            f"{fmt(res['overall'][m]['original'])} ({_metric_name(m)})")


def _plots(res: dict, out: Path) -> list[Path]:
    plt = pyplot()
    paths = []
    metrics = list(res["verdicts"])
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.4), squeeze=False)
    for ax, m in zip(axes[0], metrics):
        for cond, v in res["verdicts"][m].items():
            xs = [c["position"] for c in v["curve"]]
            ys = [c["score"] for c in v["curve"]]
            line = ax.plot(xs, ys, marker="o", label=CONDITIONS[cond])[0]
            if all(c["ci"] for c in v["curve"]):
                ax.fill_between(xs, [c["ci"][0] for c in v["curve"]], [c["ci"][1] for c in v["curve"]],
                                color=line.get_color(), alpha=0.15)
        ax.set_xlabel("position of the gold document")
        ax.set_ylabel(_metric_name(m))
        ax.set_xticks(range(1, res["k"] + 1))
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "score_by_position.png", dpi=110)
    plt.close(fig)
    paths.append(out / "score_by_position.png")
    h = res["heatmap"]
    if h and any(c["n"] for row in h["cells"] for c in row):
        data = np.array([[np.nan if c["score"] is None else c["score"] for c in row] for row in h["cells"]])
        fig, ax = plt.subplots(figsize=(1.0 + 0.7 * len(h["depths"]), 1.2 + 0.6 * len(h["lengths"])))
        im = ax.imshow(data, aspect="auto", cmap="viridis")
        ax.set_xticks(range(len(h["depths"])), [f"{d:.0%}" for d in h["depths"]])
        ax.set_yticks(range(len(h["lengths"])), [f"{L:,}" for L in h["lengths"]])
        for i, row in enumerate(h["cells"]):
            for j, c in enumerate(row):
                if c["n"]:
                    ax.text(j, i, f"{c['score']:.0f}\nn={c['n']}", ha="center", va="center", fontsize=6, color="white")
        ax.set_xlabel("depth of the gold paragraph")
        ax.set_ylabel("haystack tokens")
        fig.colorbar(im, ax=ax, label="answer probability, %")
        fig.tight_layout()
        fig.savefig(out / "depth_length.png", dpi=110)
        plt.close(fig)
        paths.append(out / "depth_length.png")
    return paths


PROTOCOLS = {"echo": "the prompt's log-probabilities echoed by /v1/completions (echo with logprobs)",
             "prompt_logprobs": "vLLM's prompt_logprobs", "forced": "forced tokens (llama.cpp's /completion with "
             "logit_bias and n_probs, one request per answer token)", None: "not used"}


def _server_text(srv: dict) -> str:
    """The Setup line of a model behind a server: how each score was asked for."""
    greedy = ", ".join(f"{k} {v}" for k, v in srv["greedy_settings"].items())
    return md_escape(f"server: {srv['kind']} at {srv['url']}, model {srv['model']}; log-likelihood: "
                     f"{PROTOCOLS.get(srv['loglik_protocol'], srv['loglik_protocol'])}; greedy generation through "
                     f"/v1/completions with {greedy}; prompts sent as {srv['prompts_as']}; tokens counted by "
                     f"{srv['tokenizer']} ({srv['tokenizer_check'] or 'not checked'}); {srv['concurrency']} requests "
                     f"at a time, {srv['requests']:,} requests in this run")


def _ci_cell(x: float, ci, digits: int = 2) -> str:
    return V.minus_signed(x, digits) + (f" [{V.minus_signed(ci[0], digits)}, {V.minus_signed(ci[1], digits)}]" if ci else "")


def _report(res: dict, out: Path, plots: list[Path]) -> None:
    mod = res["model"]
    doc = Document(f"Position diagnosis of {mod['model']} on {data_label(res['data'])} (generation)")
    doc.heading("Position bias")
    for m in (x for x in HEADLINE if x in res["verdicts"]):
        v = res["verdicts"][m]["original"]
        doc.paragraph(f"**{md_escape(_metric_name(m).capitalize())}: {md_escape(sentence(v, _metric_name(m)))}** "
                      f"({md_escape(u_text(v, _metric_name(m)))})")
    warn = V.quality_text(res["quality"])
    if warn:
        doc.warning(warn)
    rows = []
    for m, per in ((x, res["verdicts"][x]) for x in HEADLINE if x in res["verdicts"]):
        for cond, v in per.items():
            row = V.table_row(f"{_metric_name(m)}, {CONDITIONS[cond]}", v, _metric_name(m))
            u = v.get("u_shape")
            rows.append(row[:4] + [_ci_cell(u["effect"], u["ci"]) + f" ({u['edge']})" if u else "–"] + row[4:])
    doc.table(["scoring, model", "first", "last", "first − last [95% CI]", "middle − best edge [95% CI]",
               "trend per position [95% CI]", "PSI [95% CI]", "evidence"], rows)
    doc.paragraph("Every question is scored with its gold document at every position (paired), so differences are "
                  "taken within questions and intervals resample questions (percentile bootstrap, "
                  f"{res['bootstrap_samples']:,} resamples, fixed seed). First − last: positive when the last position "
                  "scores lower; it alone decides the evidence word (\"yes\": its interval above 0, \"reversed\": below "
                  f"0, \"no\": covers 0, \"too few\": under {res['min_bucket']} questions). Middle − best edge: the "
                  "mean of positions 2..k−1 minus the better edge (chosen on the data); negative: the middle is lost "
                  "(Liu et al.'s U-shape). Trend: mean per-question least-squares slope. PSI = 1 − worst/best position "
                  "mean.")
    doc.heading("Score by position")
    k = res["k"]
    head = ["scoring, model"] + [f"{p}" for p in range(1, k + 1)] + ["all"]
    body = []
    for m, per in res["verdicts"].items():
        for cond, v in per.items():
            body.append([f"{_metric_name(m)}, {CONDITIONS[cond]}"] + [fmt(c["score"]) for c in v["curve"]]
                        + [fmt(res["overall"][m][cond])])
    doc.table(head, body)
    doc.paragraph("Columns: the gold document's position among the k documents. "
                  + " ".join(f"{METRICS[m][0]}: {METRICS[m][1]}." for m in res["verdicts"]))
    if res.get("references"):
        doc.heading("References: no documents, the gold document alone")
        doc.table(["scoring", REFERENCES["closed_book"] + " [95% CI]", REFERENCES["oracle"] + " [95% CI]",
                   f"{k} documents, mean of the positions"],
                  [[_metric_name(m), _ci_cell(r["closed_book"]["score"], r["closed_book"]["ci"]),
                    _ci_cell(r["oracle"]["score"], r["oracle"]["ci"]), fmt(res["overall"][m]["original"])]
                   for m, r in res["references"].items()])
        doc.paragraph("Liu et al.'s reference points, with the unmodified model on the same questions: the question "
                      "alone (their closed-book prompt), what the model answers from its weights, and the gold "
                      "document alone (their oracle), what it answers when nothing distracts it. A position curve "
                      "near the closed-book score means the documents add little at that position.")
    if any(res["mitigation_effects"][m] for m in res["mitigation_effects"]):
        doc.heading("Mitigations against the unmodified model")
        body = []
        for m, per in res["mitigation_effects"].items():
            for cond, d in per.items():
                body.append([f"{_metric_name(m)}, {CONDITIONS[cond]}", _ci_cell(d["effect"], d["ci"]),
                             _ci_cell(d["middle"]["effect"], d["middle"]["ci"]) if d["middle"] else "–",
                             _ci_cell(d["by_position"][0]["effect"], d["by_position"][0]["ci"]),
                             _ci_cell(d["by_position"][-1]["effect"], d["by_position"][-1]["ci"])])
        doc.table(["scoring, mitigation", "all positions [95% CI]", "middle positions", "position 1", f"position {k}"],
                  body)
        doc.paragraph("Mitigated minus unmodified score on the same questions and gold positions, in points, "
                      "bootstrap over questions. Reordering places the documents by BM25 relevance to the question, "
                      "most relevant at the edges (LangChain's LongContextReorder), wherever the gold one started; "
                      "Ms-PoE rescales each attention head's position indices (Zhang et al. 2024)"
                      + (f": ratios {res['mspoe']['ratios'][0]:g} to {res['mspoe']['ratios'][1]:g}, layers "
                         f"{', '.join(map(str, res['mspoe']['layers']))}, {res['mspoe']['head_order']} head order."
                         if res.get("mspoe") else "."))
    h = res["heatmap"]
    if h:
        doc.heading("Depth × length")
        body = [[f"{L:,}"] + [("–" if c["n"] == 0 else f"{c['score']:.1f} (n={c['n']})") for c in row]
                for L, row in zip(h["lengths"], h["cells"])]
        doc.table(["haystack tokens"] + [f"depth {d:.0%}" for d in h["depths"]], body)
        lo = h["set"].get("left_out_haystacks", {})
        doc.paragraph("Answer probability (per token, %) with the gold paragraph at each depth of a haystack of other "
                      "articles' paragraphs (log-likelihood scoring, unmodified model); the depth is taken at the "
                      "nearest paragraph boundary. Haystacks left out: "
                      + md_escape(", ".join(f"{r} {n}" for r, n in lo.items() if n) or "none") + ".")
        if h.get("verdicts"):
            vrows = []
            def pm(x):  # noqa: E306
                return ("+" if x > 0 else "") + V.minus_signed(x)
            for v in h["verdicts"]:
                u, t = v.get("u_shape"), v.get("trend")
                vrows.append([f"{v['length']:,}", f"{v['questions']:,}",
                              "–" if v.get("effect") is None else f"{pm(v['effect'])} [{V.ci_words(v['ci'])}]",
                              "–" if not u else f"{pm(u['effect'])} ({u['edge']}) [{V.ci_words(u['ci'])}]",
                              "–" if not t else f"{pm(t['slope'])} [{V.ci_words(t['ci'])}]",
                              V.EVIDENCE_WORDS[v["evidence"]]])
            doc.table(["haystack tokens", "questions", "shallowest − deepest [95% CI]",
                       "middle − best edge [95% CI]", "trend per depth step [95% CI]", "evidence"], vrows)
            doc.paragraph("Per length, the verdict over depths, paired over the questions whose haystack has every "
                          "depth (bootstrap over questions), as the multi-document verdict is over positions.")
    doc.heading("Setup")
    st = res["set"]
    left = st.get("left_out", {})
    doc.bullets([
        f"model: {md_escape(mod['model'])} ({md_escape(mod['kind'])}), on {md_escape(mod['device'])} in "
        f"{mod['precision']['precision']} ({md_escape(mod['precision']['reason'])}); chat template: "
        f"{'yes' if res['chat_template'] else 'no'}",
        f"data: {md_escape(data_label(res['data']))}: {res['questions']:,} "
        f"questions, k = {k} documents each ({'BM25-retrieved' if st.get('distractors') == 'bm25' else 'random'} "
        f"distractors), {st['tokens_mean']:.0f} tokens of documents on average (max "
        f"{st['tokens_max']:,}); left out: {md_escape(', '.join(f'{r} {n}' for r, n in left.items() if n) or 'none')}",
        f"prompt: Liu et al.'s {md_escape(res['template'])} template; {res['prompts']:,} prompts per scoring and model",
        "seconds per prompt: " + (", ".join(f"{md_escape(n)} {s:.3f}" for n, s in res["seconds_per_prompt"].items())
                                  or "all from the score cache"),
        *([_server_text(mod["server"])] if mod.get("server") else []),
    ])
    captions = {"score_by_position": "Score by the gold document's position (95% intervals)",
                "depth_length": "Answer probability by depth and haystack length"}
    doc.figures([(captions.get(p.stem, p.stem), p) for p in plots])
    doc.write(out, "diagnosis")
