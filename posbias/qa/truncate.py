"""Train-short / test-long data sets (Random Padding paper §4.1, App. B.2) from any SQuAD-format file.

- D_L: every context truncated to its first L words.
- D_{L1~L2}: each instance truncated to its own random length k ~ U{L1 .. L2} words (seeded).
- A random split of an evaluation set into validation and test halves (seeded; by article optional),
  made before truncation, as §4.1 splits the official dev set and then truncates (Table 9's halves
  differ in size after filtering): D_L and D_{L1~L2} built from one file with one seed share halves.

Words are counted with a regex tokenizer (runs of word characters, or single punctuation marks),
close to NLTK's word_tokenize but needing no downloaded data. Gold answers cut off by truncation are
removed; an instance left without any gold answer becomes unanswerable: the paper drops those from
validation/test and keeps them in training (`keep_unanswerable`). Kept, they do not make a v1 file
v2: it still says version "1.1", so a model trained on it labels their windows [CLS] (BERT's
pre-processing, `data.unanswerable_windows: cls`) and is evaluated as v1.

Answer-sentence sets (Ko et al., EMNLP 2020, "Look at the First Sentence": SQuAD-train^(k)): keep the
questions whose first gold answer starts in sentence k (or k and later) of the context as written out,
sentences by `posbias.qa.sentences`; every build reports that sentence's distribution (1, 2, 3, 4, 5+).
"""
from __future__ import annotations

import random
import re
from dataclasses import replace
from pathlib import Path

from ..errors import ConfigError
from ..outputs import check_not_input, safe_name, staged_output
from ..render import md_escape
from ..utils import atomic_write_json, atomic_write_text
from .examples import QAExample
from .readers import read_dataset
from .sentences import DEFAULT_LAST, NO_ANSWER, answer_sentence, sentence_label

WORD = re.compile(r"\w+|[^\w\s]", re.UNICODE)


def word_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of the words of `text`."""
    return [m.span() for m in WORD.finditer(text)]


def count_words(text: str) -> int:
    return sum(1 for _ in WORD.finditer(text))


def truncate_example(example: QAExample, n_words: int) -> QAExample:
    """The example with its context cut after `n_words` words and the answers that no longer fit
    removed (unanswerable, `is_impossible`, when none is left)."""
    spans = word_spans(example.context)
    if len(spans) <= n_words:
        return example
    end = spans[n_words - 1][1] if n_words > 0 else 0
    context = example.context[:end]
    answers = [a for a in example.answers if a.end <= end]
    meta = dict(example.meta, truncated_to_words=n_words, original_context_words=len(spans))
    return replace(example, context=context, answers=answers, score_texts=None,
                   is_impossible=example.is_impossible or not answers, meta=meta)


def truncate_fixed(examples: list[QAExample], n_words: int, keep_unanswerable: bool) -> list[QAExample]:
    """D_L."""
    out = [truncate_example(e, n_words) for e in examples]
    return out if keep_unanswerable else [e for e in out if not e.is_impossible]


def truncate_range(examples: list[QAExample], low: int, high: int, seed: int,
                   keep_unanswerable: bool) -> list[QAExample]:
    """D_{low~high}: each instance gets its own length k ~ U{low .. high} (seeded, in file order)."""
    if not 0 < low <= high:
        raise ValueError(f"truncation range must satisfy 0 < low <= high, got {low}~{high}")
    rng = random.Random(seed)
    out = [truncate_example(e, rng.randint(low, high)) for e in examples]
    return out if keep_unanswerable else [e for e in out if not e.is_impossible]


def split_halves(examples: list[QAExample], seed: int, by_article: bool = False) -> tuple[list, list]:
    """Random validation / test halves (the paper's split of an official dev set)."""
    rng = random.Random(seed)
    if not by_article:
        idx = list(range(len(examples)))
        rng.shuffle(idx)
        half = set(idx[: len(idx) // 2])
        return ([e for i, e in enumerate(examples) if i in half],
                [e for i, e in enumerate(examples) if i not in half])
    titles = sorted({e.title for e in examples})
    rng.shuffle(titles)
    val_titles, n = set(), 0
    for t in titles:  # whole articles into validation until it holds half the questions
        if n >= len(examples) / 2:
            break
        val_titles.add(t)
        n += sum(e.title == t for e in examples)
    return ([e for e in examples if e.title in val_titles], [e for e in examples if e.title not in val_titles])


def sample_examples(examples: list[QAExample], n: int, seed: int) -> list[QAExample]:
    """A seeded random subset of `n` examples (all when fewer), kept in their original order."""
    if n >= len(examples):
        return list(examples)
    keep = set(random.Random(seed).sample(range(len(examples)), n))
    return [e for i, e in enumerate(examples) if i in keep]


ANSWER_SENTENCE = re.compile(r"([0-9]+)(\+?)")


def parse_answer_sentence(spec) -> tuple[int, bool]:
    """`--answer-sentence` "K" or "K+" (an int K too) -> (K, whether later sentences count as well)."""
    m = None if isinstance(spec, bool) else ANSWER_SENTENCE.fullmatch(str(spec))
    if m is None or int(m.group(1)) < 1:
        raise ConfigError(f"--answer-sentence must be K or K+ with K a positive integer (e.g. 1, 3, 2+), got {spec!r}")
    return int(m.group(1)), m.group(2) == "+"


def select_answer_sentence(examples: list[QAExample], k: int, and_later: bool = False) -> list[QAExample]:
    """The questions whose first gold answer starts in sentence `k` (or later, `and_later`) of their
    context as given; questions without an answer never match."""
    def keep(e: QAExample) -> bool:
        i = answer_sentence(e)
        return i is not None and (i >= k if and_later else i == k)

    return [e for e in examples if keep(e)]


def answer_sentence_distribution(examples: list[QAExample], last: int = DEFAULT_LAST) -> dict:
    """Bucket ("1" .. "last-1", "last+", NO_ANSWER) -> count and share of `examples`, every bucket listed."""
    counts = dict.fromkeys([sentence_label(i, last) for i in range(1, last + 1)] + [NO_ANSWER], 0)
    for e in examples:
        counts[sentence_label(answer_sentence(e), last)] += 1
    n = len(examples)
    return {b: {"count": c, "share": c / n if n else 0.0} for b, c in counts.items()}


def to_squad_json(examples: list[QAExample], version: str = "1.1") -> dict:
    """SQuAD JSON, one paragraph per question (truncated contexts differ per question)."""
    articles: dict[str, list] = {}
    for e in examples:
        qa = {"id": e.id, "question": e.question,
              "answers": [{"text": a.text, "answer_start": a.start} for a in e.answers]}
        if e.is_impossible:
            qa["is_impossible"] = True
        for k in ("truncated_to_words", "original_context_words", "answer_start_ambiguous"):
            if k in e.meta:
                qa[k] = e.meta[k]
        articles.setdefault(e.title or "untitled", []).append({"context": e.context, "qas": [qa]})
    return {"version": version, "data": [{"title": t, "paragraphs": ps} for t, ps in articles.items()]}


def statistics(examples: list[QAExample]) -> dict:
    """A row of the paper's Table 9: average question and context length in words, instances."""
    n = len(examples)
    return {"instances": n,
            "answerable": sum(not e.is_impossible for e in examples),
            "avg_question_words": sum(count_words(e.question) for e in examples) / max(n, 1),
            "avg_context_words": sum(count_words(e.context) for e in examples) / max(n, 1)}


def build_dataset(inputs, out_dir, *, truncate: int | None = None, truncate_range: tuple[int, int] | None = None,
                  split: bool = False, by_article: bool = False, seed: int = 13, keep_unanswerable: bool = False,
                  exclude_ambiguous: bool = False, name: str = "data", sample: int | None = None,
                  answer_sentence: str | int | None = None) -> dict:
    """Read SQuAD/MRQA file(s), optionally split into val/test halves, truncate each part (dropping
    the instances truncation leaves unanswerable unless `keep_unanswerable`), write SQuAD JSON plus a
    statistics table (stats.md, stats.json). `sample` keeps a seeded random subset of that many
    instances of each written part (in file order), for CPU-sized experiments. Returns the statistics.

    The halves are drawn from the file before truncation (§4.1: the dev set is split, then
    truncated), so they depend on the file, `seed` and `by_article` only; a D_{L1~L2} instance's
    length k is drawn in file order, the same with or without `split`. A written part says version
    "2.0" only when the input is SQuAD v2 data (`QADataset.null_answers`) and the part keeps
    unanswerable instances; a v1 input stays "1.1" with its kept answer-less instances.

    `answer_sentence` ("K", or "K+" for K and later; 1-based) keeps the questions whose first gold
    answer starts in sentence K of the context as written out: after the split and after truncation
    (and its dropping of the unanswerable), before `sample`; questions without an answer never match.
    It implies `exclude_ambiguous`: a rebuilt SQuAD train answer_start flagged ambiguous is the text's
    first occurrence and may lie in an earlier sentence than the annotated one. Its matching random
    control is the same build without `answer_sentence`, with `exclude_ambiguous` and `sample` set to
    the number of instances this one wrote (stats.md names it)."""
    safe_name(name, "--name")  # the file name of the set written
    check_not_input(out_dir, inputs, "--out")
    if truncate is not None and truncate_range is not None:
        raise ConfigError("choose --truncate L or --truncate-range L1 L2, not both")
    if sample is not None and sample <= 0:
        raise ConfigError(f"--sample must be positive, got {sample}")
    implied = False
    if answer_sentence is not None:
        k, and_later = parse_answer_sentence(answer_sentence)
        answer_sentence = f"{k}+" if and_later else str(k)
        implied, exclude_ambiguous = not exclude_ambiguous, True
    ds = read_dataset(list(inputs) if len(inputs) > 1 else inputs[0])
    examples = ds.examples
    n_read = len(examples)
    if exclude_ambiguous:
        examples = [e for e in examples if not e.meta.get("answer_start_ambiguous")]
    before = statistics(examples)
    parts = dict(zip(("val", "test"), split_halves(examples, seed, by_article))) if split else {name: examples}
    halves = {part: [e.id for e in exs] for part, exs in parts.items()}
    if truncate is not None:
        label, cut = f"D_{truncate}", {e.id: e for e in truncate_fixed(examples, truncate, True)}
    elif truncate_range is not None:
        label = f"D_{truncate_range[0]}~{truncate_range[1]}"
        cut = {e.id: e for e in truncate_range_fn(examples, *truncate_range, seed, True)}
    else:
        label, cut = "original", None  # nothing truncated: nothing filtered (a v2 file keeps its nulls)
    if cut is not None:
        parts = {part: [cut[q] for q in ids] for part, ids in halves.items()}
        if not keep_unanswerable:
            parts = {part: [e for e in exs if not e.is_impossible] for part, exs in parts.items()}
    selection = {"answer_sentence": answer_sentence, "exclude_ambiguous": exclude_ambiguous,
                 "exclude_ambiguous_implied": implied, "answer_sentence_kept": None}
    if answer_sentence is not None:
        # Filtering the text as written (not refusing --truncate/--split): the halves stay drawn before
        # any filter, so one --seed gives every set the same halves; a cut keeps the sentences before
        # it, so a truncated set's answer sentences are the original ones but for the rare boundary
        # the cut itself changes; and the filter agrees with the distribution stats.md reports.
        of = {part: len(exs) for part, exs in parts.items()}
        parts = {part: select_answer_sentence(exs, k, and_later) for part, exs in parts.items()}
        selection["answer_sentence_kept"] = {part: {"kept": len(parts[part]), "of": of[part]} for part in parts}
    available = {part: len(exs) for part, exs in parts.items()}
    if sample is not None:
        parts = {part: sample_examples(exs, sample, seed) for part, exs in parts.items()}
    with staged_output(out_dir, {"stats.md", "stats.json", *(f"{part}.json" for part in parts)}, "--out") as out:
        return _write_build(out, parts, inputs, label, seed, n_read, before, available, sample,
                            {part: len(ids) for part, ids in halves.items()}, ds.null_answers, selection)


def _write_build(out: Path, parts: dict, inputs, label, seed, n_read, before, available, sample,
                 before_filtering: dict, v2_input: bool, selection: dict) -> dict:
    """The split files, stats.md and stats.json of `build_dataset`, into the staged folder `out`."""
    from importlib.metadata import version as package_version

    stats = {"inputs": [str(p) for p in inputs], "label": label, "seed": seed, "read": n_read,
             "excluded_ambiguous": n_read - before["instances"], "before_truncation": before,
             "before_filtering": before_filtering, "available": available, "sample": sample, **selection,
             "sentence_splitter": f"sentencex {package_version('sentencex')}", "splits": {}}
    for part, exs in parts.items():
        version = "2.0" if v2_input and any(e.is_impossible for e in exs) else "1.1"
        atomic_write_json(out / f"{part}.json", to_squad_json(exs, version), indent=None)
        stats["splits"][part] = {**statistics(exs), "version": version,
                                 "answer_sentences": answer_sentence_distribution(exs)}
    rows = ["| data set | split | avg question words | avg context words | instances | answerable |",
            "|---|---|---|---|---|---|"]
    rows.append(f"| original | all | {before['avg_question_words']:.2f} | {before['avg_context_words']:.2f} | "
                f"{before['instances']:,} | {before['answerable']:,} |")
    for part, s in stats["splits"].items():  # a part is named by --name: users' text, escaped
        rows.append(f"| {label} | {md_escape(part)} | {s['avg_question_words']:.2f} | {s['avg_context_words']:.2f} | "
                    f"{s['instances']:,} | {s['answerable']:,} |")
    rows += ["", _answer_sentence_table(stats), *_selection_notes(stats)]
    atomic_write_text(out / "stats.md", "\n".join(rows) + "\n")
    atomic_write_json(out / "stats.json", stats)
    return stats


def _answer_sentence_table(stats: dict) -> str:
    """stats.md's answer-sentence table: count (share) per bucket and written part."""
    buckets = list(next(iter(stats["splits"].values()))["answer_sentences"]) if stats["splits"] else []
    rows = [f"Sentence of the first gold answer ({stats['sentence_splitter']}):", "",
            "| data set | split | " + " | ".join(buckets) + " |", "|---|---|" + "---|" * len(buckets)]
    for part, s in stats["splits"].items():
        cells = [f"{d['count']:,} ({100 * d['share']:.1f}%)" for d in s["answer_sentences"].values()]
        rows.append(f"| {stats['label']} | {md_escape(part)} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _selection_notes(stats: dict) -> list[str]:
    """stats.md's lines on the answer-sentence filter, the excluded questions and the random control."""
    notes = []
    if stats["exclude_ambiguous"]:
        why = " (implied by --answer-sentence)" if stats["exclude_ambiguous_implied"] else ""
        notes.append(f"- Excluded {stats['excluded_ambiguous']:,} answer_start_ambiguous question(s){why}.")
    if stats["answer_sentence"] is None:
        return [""] + notes if notes else []
    for part, c in stats["answer_sentence_kept"].items():
        notes.append(f"- Answer-sentence filter {stats['answer_sentence']}: kept {c['kept']:,} of {c['of']:,} "
                     f"question(s) ({md_escape(part)}).")
    written = sorted({s["instances"] for s in stats["splits"].values()})
    each = (f"--sample {written[0]}" if len(written) == 1 else  # one --sample sizes every part alike
            "--sample " + ", ".join(f"{s['instances']} ({md_escape(part)})" for part, s in stats["splits"].items()))
    notes.append(f"- Matching random control: the same command without --answer-sentence, with "
                 f"--exclude-ambiguous and {each} (the instances written here; same --seed).")
    return [""] + notes


truncate_range_fn = truncate_range  # `build_dataset` has a parameter of that name
