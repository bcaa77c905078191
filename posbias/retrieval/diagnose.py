"""`posbias diagnose retrieval`: where in a passage an embedding model stops finding the answer.

For SQuAD-format data (`benchmark.py`), every question is ranked against the corpus of all passages
by the model's embeddings (dot product of normalised vectors: cosine), by BM25 and by the common
mitigation of splitting each passage into chunks of `chunk_tokens` tokens and scoring it by its best
chunk (max-sim). Per question: the gold passage's rank -> NDCG@10, recall@1/10, MRR (`metrics.py`).
Then, as the QA and tagging diagnoses do (`posbias.analysis.verdict`): NDCG@10 per position bucket
of the answer (SQuAD-PosQ's character buckets, and the token buckets of the model's tokenizer),
buckets merged to at least `min_bucket` questions, front − rear with a bootstrap interval, the trend
per 100 characters, PSI = 1 − worst/best (Zeng et al.'s Position Sensitivity Index) with its interval.
The paired variant scores the same questions with their paragraph at the start, middle and end of a
document; its differences are paired by question (bootstrap over questions).

Shape legend: q queries, p passages, c chunks, d embedding width, b a block of queries.
"""
from __future__ import annotations

import time
from pathlib import Path, PurePath

import numpy as np

from ..analysis import verdict as V
from ..errors import ConfigError
from ..outputs import staged_output
from ..qa.readers import read_dataset
from ..render import Document, data_label, fmt, md_escape, pyplot
from ..utils import atomic_write_json, now_iso, versions
from .bm25 import bm25_scores, check_available
from .benchmark import (
    CHAR_EDGES,
    POSITIONS,
    TOKEN_EDGES,
    RetrievalSet,
    bucket_label,
    from_examples,
    positioned_sets,
)
from .embed import Embedder, load_embedder
from .metrics import METRICS, gold_ranks, per_query

OUTPUTS = frozenset({"diagnosis.md", "diagnosis.html", "diagnosis.json", "run_info.json", "ranks.json",
                     "ndcg_by_position.png", "paired_positions.png"})
METHOD_NAMES = {"dense": "embedding (single vector)", "chunks": "embedding, best chunk (max-sim)", "bm25": "BM25"}
BLOCK = 1024


# ------------------------------------------------------------------------------------------ scoring
def ranks_from_blocks(blocks, gold: np.ndarray) -> np.ndarray:
    """Gold ranks (q,) from (first query, (b, p) scores) blocks covering the queries in order."""
    ranks = np.empty(len(gold), dtype=np.float64)
    for lo, scores in blocks:
        ranks[lo:lo + len(scores)] = gold_ranks(scores, gold[lo:lo + len(scores)])
    return ranks


def dense_blocks(queries: np.ndarray, passages: np.ndarray, block: int = BLOCK):
    """(first query, (b, p) dot products) in query blocks: a matrix product, never a Python loop."""
    for lo in range(0, len(queries), block):
        yield lo, queries[lo:lo + block] @ passages.T


def maxsim_blocks(queries: np.ndarray, chunks: np.ndarray, owner: np.ndarray, n_passages: int, block: int = BLOCK):
    """(first query, (b, p)) blocks of each passage's best chunk score; `owner` (c,) is each chunk's
    passage, sorted, every passage owning at least one chunk."""
    starts = np.searchsorted(owner, np.arange(n_passages))  # first chunk of each passage
    for lo in range(0, len(queries), block):
        sims = queries[lo:lo + block] @ chunks.T  # (b, c)
        yield lo, np.maximum.reduceat(sims, starts, axis=1)  # (b, p)


def chunk_passages(passages: list[str], tokenizer, chunk_tokens: int) -> tuple[list[str], np.ndarray]:
    """Each passage cut into consecutive pieces of `chunk_tokens` tokens (character spans from the
    tokenizer's offsets, so a chunk is the passage's own text): (chunk texts, (c,) owner passage)."""
    texts, owner = [], []
    for i, p in enumerate(passages):
        offsets = tokenizer(p, add_special_tokens=False, return_offsets_mapping=True, verbose=False)["offset_mapping"]
        if not offsets:
            texts.append(p)
            owner.append(i)
            continue
        for lo in range(0, len(offsets), chunk_tokens):
            piece = offsets[lo:lo + chunk_tokens]
            start = 0 if lo == 0 else piece[0][0]
            end = len(p) if lo + chunk_tokens >= len(offsets) else offsets[lo + chunk_tokens][0]
            texts.append(p[start:end])
            owner.append(i)
    return texts, np.asarray(owner, dtype=np.int64)


def token_positions(rset: RetrievalSet, tokenizer) -> np.ndarray:
    """(q,) index of the token (no special tokens) holding each query's answer start in its passage."""
    starts: dict[int, list[int]] = {}
    out = np.empty(len(rset.gold), dtype=np.int64)
    for j, (g, ch) in enumerate(zip(rset.gold, rset.answer_char)):
        if g not in starts:
            offs = tokenizer(rset.passages[g], add_special_tokens=False, return_offsets_mapping=True, verbose=False)["offset_mapping"]
            starts[g] = [e for _, e in offs]
        ends = starts[g]
        out[j] = int(np.searchsorted(np.asarray(ends), ch, side="right")) if ends else 0
    return out


def finite(emb: np.ndarray, embedder, what: str) -> np.ndarray:
    """`emb` as `embedder.encode` returned it, refused in one line when it holds NaN or inf: any
    embedder's (a user's own object too; `Embedder` refuses them per batch already)."""
    if not np.isfinite(emb).all():
        raise ConfigError(f"{embedder.source}: its {what} embeddings are NaN or infinite; posbias does not rank "
                          "by them")
    return emb


def score_set(rset: RetrievalSet, embedder: Embedder | None, methods: tuple[str, ...], *, batch_size: int,
              chunk_tokens: int, cache_dir, timings: dict, progress: bool = False,
              q_emb: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Gold ranks (q,) of `rset`'s queries for each method; `q_emb`: their embeddings, when already made."""
    ranks = {}
    if q_emb is None and ("dense" in methods or "chunks" in methods):
        t = time.perf_counter()
        q_emb = finite(embedder.encode(rset.queries, "query", batch_size=batch_size, cache_dir=cache_dir,
                                       progress=progress), embedder, "query")
        timings[f"{rset.name}: encode queries"] = time.perf_counter() - t
    if "dense" in methods:
        t = time.perf_counter()
        p_emb = finite(embedder.encode(rset.passages, "document", batch_size=batch_size, cache_dir=cache_dir,
                                       progress=progress), embedder, "passage")
        timings[f"{rset.name}: encode passages"] = time.perf_counter() - t
        ranks["dense"] = ranks_from_blocks(dense_blocks(q_emb, p_emb), rset.gold)
        timings.setdefault("gold_similarity", {})[rset.name] = float(np.einsum("qd,qd->q", q_emb, p_emb[rset.gold]).mean())
    if "chunks" in methods:
        texts, owner = chunk_passages(rset.passages, embedder.tokenizer, chunk_tokens)
        t = time.perf_counter()
        c_emb = finite(embedder.encode(texts, "document", batch_size=batch_size, cache_dir=cache_dir,
                                       progress=progress), embedder, "chunk")
        timings[f"{rset.name}: encode {len(texts):,} chunks"] = time.perf_counter() - t
        ranks["chunks"] = ranks_from_blocks(maxsim_blocks(q_emb, c_emb, owner, len(rset.passages)), rset.gold)
    if "bm25" in methods:
        t = time.perf_counter()
        ranks["bm25"] = ranks_from_blocks(bm25_scores(rset.passages, rset.queries), rset.gold)
        timings[f"{rset.name}: BM25"] = time.perf_counter() - t
    return ranks


# ----------------------------------------------------------------------------------------- analysis
def method_summary(ranks: np.ndarray) -> dict:
    """Mean of each metric (points) over the queries."""
    return {name: float(v.mean()) if len(v) else None for name, v in per_query(ranks).items()}


def bucket_table(ranks: np.ndarray, labels: list[str]) -> list[dict]:
    """Per bucket (in position order): n and each metric's mean (points)."""
    metrics = per_query(ranks)
    out = []
    for lab in sorted(set(labels), key=lambda k: (V.bucket_rank(k), k)):
        idx = np.array([i for i, x in enumerate(labels) if x == lab])
        out.append({"label": lab, "n": len(idx), **{m: float(v[idx].mean()) for m, v in metrics.items()}})
    return out


def position_axis(ranks: np.ndarray, labels: list[str], positions: np.ndarray | None, name: str, *, per: float,
                  unit: str, min_bucket: int, samples: int) -> dict:
    """The verdict along one axis, on per-query NDCG@10 in points (`posbias.analysis.verdict`)."""
    ndcg = per_query(ranks)["NDCG@10"]
    ids = [str(i) for i in range(len(ranks))]
    return V.position_axis(dict(zip(ids, labels)), dict(zip(ids, ndcg.tolist())),
                           positions=None if positions is None else dict(zip(ids, positions.tolist())),
                           per=per, unit=unit, name=name, min_size=min_bucket, samples=samples)


def paired_positions(ranks: dict[str, np.ndarray], samples: int, seed: int = 0) -> dict:
    """The paired variant of one method: each position's metrics, and start − middle, start − end
    NDCG@10 paired by question with a bootstrap interval over questions; PSI over the positions."""
    scores = {pos: per_query(r)["NDCG@10"] for pos, r in ranks.items()}
    out = {"positions": {pos: method_summary(r) for pos, r in ranks.items()}, "differences": {}}
    rng = np.random.default_rng(seed)
    if "start" in scores:
        for other in [p for p in scores if p != "start"]:
            d = scores["start"] - scores[other]
            ci = None
            if samples > 0 and len(d):
                boot = np.array([d[rng.integers(0, len(d), len(d))].mean() for _ in range(samples)])
                ci = [float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))]
            out["differences"][f"start − {other}"] = {"effect": float(d.mean()) if len(d) else None, "ci": ci,
                                                      "n": len(d)}
    means = [v["NDCG@10"] for v in out["positions"].values() if v["NDCG@10"] is not None]
    out["psi"] = V.psi(means) if means else None
    return out


# ----------------------------------------------------------------------------------------- the command
def diagnose(model, data, output_dir, *, device: str = "auto", precision: str = "auto", max_length: int | None = None,
             batch_size: int = 64, bm25: bool = True, chunks: bool = True, chunk_tokens: int = 128,
             paired: bool = True, seed: int = 0, max_queries: int | None = None, cache_dir=None,
             bias_samples: int = V.DEFAULT_SAMPLES, min_bucket: int = V.MIN_BUCKET,
             quality_floor: float = V.QUALITY_FLOOR, progress: bool = True) -> dict:
    """Diagnose a sentence-embedding model's position bias on SQuAD-format `data` (module docstring);
    writes diagnosis.md/.html/.json, ranks.json and plots into `output_dir`. Returns the diagnosis
    dict with `verdict_lines`, what the CLI prints."""
    for name, value, low in (("batch_size", batch_size, 1), ("chunk_tokens", chunk_tokens, 8)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"diagnose retrieval: {name} must be an integer >= {low}, got {value!r}")
    if max_queries is not None and (isinstance(max_queries, bool) or not isinstance(max_queries, int) or max_queries < 1):
        raise ConfigError(f"diagnose retrieval: max_queries must be a positive integer, got {max_queries!r}")
    if bm25:  # an optional dependency is checked before minutes of embedding, not after
        check_available()
    t0 = time.time()
    ds = read_dataset(data)
    examples = ds.examples[:max_queries] if max_queries else ds.examples
    # Any object with Embedder's members (encode, tokenizer, count_tokens, max_length, specials, source,
    # describe) is used as it is: a user's own encoder, or a scorer built to test the analysis.
    if isinstance(model, (str, PurePath)):
        embedder = load_embedder(str(model), device=device, precision=precision, max_length=max_length)
    else:
        embedder = model
    methods = ("dense",) + (("chunks",) if chunks else ()) + (("bm25",) if bm25 else ())
    with staged_output(output_dir, names=OUTPUTS) as out:
        return _diagnose(embedder, ds, examples, out, Path(output_dir), methods, batch_size=batch_size,
                         chunk_tokens=chunk_tokens, paired=paired, seed=seed, cache_dir=cache_dir,
                         samples=bias_samples, min_bucket=min_bucket, floor=float(quality_floor), t0=t0,
                         progress=progress)


def _diagnose(embedder: Embedder, ds, examples, out: Path, final: Path, methods, *, batch_size, chunk_tokens, paired,
              seed, cache_dir, samples, min_bucket, floor, t0, progress=False) -> dict:
    timings: dict[str, float] = {}
    rset = from_examples(examples)
    if not rset.queries:
        raise ConfigError(f"{ds.path}: no answerable question to rank (diagnose retrieval needs answers with offsets)")
    ranks = score_set(rset, embedder, methods, batch_size=batch_size, chunk_tokens=chunk_tokens,
                      cache_dir=cache_dir, timings=timings, progress=progress)
    char_labels = [bucket_label(c, CHAR_EDGES) for c in rset.answer_char]
    tok = token_positions(rset, embedder.tokenizer)
    tok_labels = [bucket_label(t, TOKEN_EDGES) for t in tok]
    window = embedder.max_length - embedder.specials
    beyond = tok >= window
    res = {"model": embedder.describe(), "data": str(ds.path), "questions": len(rset.queries),
           "passages": len(rset.passages), "set": rset.stats, "methods": list(methods),
           "answers_beyond_window": {"n": int(beyond.sum()), "window_tokens": int(window),
                                     "by_char_bucket": {lab: int(sum(1 for x, b in zip(char_labels, beyond) if x == lab and b))
                                                        for lab in sorted(set(char_labels), key=V.bucket_rank)}},
           "overall": {m: method_summary(r) for m, r in ranks.items()},
           "char_buckets": {m: bucket_table(r, char_labels) for m, r in ranks.items()},
           "token_buckets": {m: bucket_table(r, tok_labels) for m, r in ranks.items()},
           "axes": {}, "paired": None}
    for m, r in ranks.items():
        res["axes"][f"{m}: answer character"] = position_axis(
            r, char_labels, rset.answer_char.astype(float), "answer position (characters)", per=100.0,
            unit="character", min_bucket=min_bucket, samples=samples)
    res["axes"]["dense: answer token"] = position_axis(
        ranks["dense"], tok_labels, tok.astype(float), "answer position (tokens)", per=100.0, unit="token",
        min_bucket=min_bucket, samples=samples)
    if paired:
        sets = positioned_sets(examples, embedder.count_tokens, window, seed=seed)
        if sets[POSITIONS[0]].queries:
            # the same questions at every position: embedded once
            q_emb = finite(embedder.encode(sets[POSITIONS[0]].queries, "query", batch_size=batch_size,
                                           cache_dir=cache_dir, progress=progress), embedder, "query")
            pranks = {pos: score_set(s, embedder, methods, batch_size=batch_size, chunk_tokens=chunk_tokens,
                                     cache_dir=cache_dir, timings=timings, progress=progress, q_emb=q_emb)
                      for pos, s in sets.items()}
            res["paired"] = {"set": sets[POSITIONS[0]].stats,
                             "methods": {m: paired_positions({pos: pranks[pos][m] for pos in sets}, samples, seed)
                                         for m in methods}}
            res["paired"]["gold_similarity"] = {pos: timings["gold_similarity"][pos] for pos in sets}
        else:
            res["paired"] = {"set": sets[POSITIONS[0]].stats, "methods": {}, "gold_similarity": {}}
    res["quality"] = V.quality(res["overall"]["dense"]["NDCG@10"], floor, metric="NDCG@10")
    res["gold_similarity"] = timings.pop("gold_similarity", {}).get(rset.name)
    res["timings_s"] = {k: round(v, 3) for k, v in timings.items()}
    res["seconds"] = round(time.time() - t0, 2)
    res["bootstrap_samples"], res["min_bucket"] = samples, min_bucket
    plots = _plots(res, out)
    axes = [(name, v, {"metric": "NDCG@10", "what": "answers"}) for name, v in res["axes"].items()]
    title = f"Position diagnosis of {embedder.source} on {data_label(ds.path)} (retrieval)"
    res["verdict_lines"] = V.terminal_block(title, axes,
                                            res["quality"], V.report_line(final, len(plots)), metric="NDCG@10")
    if res["paired"] and res["paired"]["methods"]:
        d = res["paired"]["methods"]["dense"]["differences"].get("start − end")
        if d and d["effect"] is not None:
            res["verdict_lines"].insert(-1, f"  paired (the same {d['n']:,} questions, their paragraph moved): start − end "
                                            f"NDCG@10 {V.minus_signed(d['effect'])} [{V.ci_words(d['ci'])}]")
    _report(res, out, plots)
    atomic_write_json(out / "ranks.json", {"query_ids": rset.query_ids, **{m: r.tolist() for m, r in ranks.items()}})
    atomic_write_json(out / "diagnosis.json", res)
    atomic_write_json(out / "run_info.json", {"command": "diagnose retrieval", "model": embedder.source,
                                              "data": str(ds.path), "finished": now_iso(), "seconds": res["seconds"],
                                              "seed": seed, "versions": versions(), **embedder.describe()})
    return res


# ------------------------------------------------------------------------------------------ report
def _plots(res: dict, out: Path) -> list[Path]:
    plt = pyplot()

    def save(fig, ax, xlabel: str, name: str) -> Path:
        ax.set_xlabel(xlabel)
        ax.set_ylabel("NDCG@10")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        return out / name

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for m, rows in res["char_buckets"].items():
        ax.plot([r["label"] for r in rows], [r["NDCG@10"] for r in rows], marker="o", label=METHOD_NAMES[m])
    paths = [save(fig, ax, "answer start (characters into the passage)", "ndcg_by_position.png")]
    if res["paired"] and res["paired"]["methods"]:
        fig, ax = plt.subplots(figsize=(6.4, 3.6))
        ms = list(res["paired"]["methods"])
        width = 0.8 / len(ms)
        for i, m in enumerate(ms):
            pos = res["paired"]["methods"][m]["positions"]
            ax.bar(np.arange(len(pos)) + i * width, [v["NDCG@10"] for v in pos.values()], width, label=METHOD_NAMES[m])
        ax.set_xticks(np.arange(len(POSITIONS)) + 0.4 - width / 2, list(POSITIONS))
        paths.append(save(fig, ax, "the answer's paragraph in its document", "paired_positions.png"))
    return paths


def _report(res: dict, out: Path, plots: list[Path]) -> None:
    m = res["model"]
    doc = Document(f"Position diagnosis of {m['model']} on {data_label(res['data'])} (retrieval)")
    doc.heading("Position bias")
    first = next(iter(res["axes"].values()))
    doc.paragraph(f"**{V.sentence(first, metric='NDCG@10', what='answers')}** (single-vector embedding, answer start "
                  "in characters, SQuAD-PosQ's buckets)")
    warn = V.quality_text(res["quality"])
    if warn:  # above the tables it qualifies
        doc.warning(warn)
    doc.table(V.VERDICT_HEAD, [V.table_row(name, v, "NDCG@10") for name, v in res["axes"].items()])
    doc.paragraph(V.note(res["min_bucket"], res["bootstrap_samples"]) + " Score per question: NDCG@10 of its one "
                  "relevant passage, in points; trend per 100 characters (tokens).")
    b = res["answers_beyond_window"]
    doc.paragraph(f"{b['n']:,} of {res['questions']:,} answers start at or after token {b['window_tokens']} of their "
                  "passage, past what the model reads (its max length less special tokens): for them the embedding "
                  "cannot see the answer, a truncation effect inside the position effect.")
    doc.heading("By answer position")
    ms = list(res["char_buckets"])
    head = ["answer start (characters)", "questions"] + [f"NDCG@10 {METHOD_NAMES[x]}" for x in ms]
    rows = []
    for i, r in enumerate(res["char_buckets"][ms[0]]):
        rows.append([r["label"], f"{r['n']:,}"] + [fmt(res["char_buckets"][x][i]["NDCG@10"]) for x in ms])
    doc.table(head, rows)
    rows = [[r["label"], f"{r['n']:,}"] + [fmt(res["token_buckets"][x][i]["NDCG@10"]) for x in ms]
            for i, r in enumerate(res["token_buckets"][ms[0]])]
    doc.table(["answer start (tokens)", "questions"] + head[2:], rows)
    doc.table(["method"] + list(METRICS), [[METHOD_NAMES[x]] + [fmt(v) for v in res["overall"][x].values()] for x in ms])
    if res["paired"] is not None:
        doc.heading("Paired: the same questions, their paragraph at the start, middle or end")
        st = res["paired"]["set"]
        doc.paragraph(f"{st['questions']:,} questions over {st['passages']:,} documents of at most {st['max_tokens']} "
                      "tokens (each question's paragraph plus sentences of its article's other paragraphs); left "
                      f"out: {st['left_out_questions']:,} questions ({', '.join(f'{k} {v}' for k, v in st['left_out_passages'].items())} "
                      "passages).")
        pm = res["paired"]["methods"]
        if pm:
            rows = []
            for x, v in pm.items():
                diffs = [f"{V.minus_signed(d['effect'], 2)} [{V.minus_signed(d['ci'][0], 2)}, {V.minus_signed(d['ci'][1], 2)}]" if d["ci"]
                         else (V.minus_signed(d["effect"], 2) if d["effect"] is not None else "–") for d in v["differences"].values()]
                rows.append([METHOD_NAMES[x]] + [fmt(p["NDCG@10"]) for p in v["positions"].values()] + diffs
                            + [f"{v['psi']:.3f}" if v["psi"] is not None else "–"])
            doc.table(["method"] + [f"NDCG@10 {p}" for p in POSITIONS] + list(next(iter(pm.values()))["differences"])
                      + ["PSI"], rows)
            sims = res["paired"]["gold_similarity"]
            doc.paragraph("Mean similarity of a question to its own document: "
                          + ", ".join(f"{p} {v:.4f}" for p, v in sims.items()) + ".")
    doc.heading("Setup")
    # The bullets are Markdown: the user's model and file names (and an embedder's own words) escaped.
    doc.bullets([(f"model: {md_escape(m['model'])} ({md_escape(m['kind'])}, {m['similarity']} similarity, max "
                  f"length {m['max_length']} tokens), on {md_escape(m['device'])} in {m['precision']['precision']} "
                  f"({md_escape(m['precision']['reason'])})"),
                 f"data: {md_escape(data_label(res['data']))}: {res['questions']:,} answerable questions over "
                 f"{res['passages']:,} passages",
                 "times: " + ", ".join(f"{k} {v:.1f} s" for k, v in res["timings_s"].items())])
    captions = {"ndcg_by_position": "NDCG@10 by answer position",
                "paired_positions": "NDCG@10 with the same paragraph at the start, middle or end"}
    doc.figures([(captions.get(p.stem, p.stem.replace("_", " ")), p) for p in plots])
    doc.write(out, "diagnosis")
