"""What the diagnoses of models no task trains share (`posbias.registry.DIAGNOSES`: retrieval, generation,
a plug-in's): so that no diagnosis imports another.

- `run`: the steps every diagnosis's `diagnose` takes before its own work (one diagnosis per output
  folder at a time, the verdict's options checked), then its call.
- `answerable`: the QA examples a diagnosis can ask (a question with a located answer).
- `check_cache_dir`: a `--cache-dir` that can become a folder.
- `tokenize`: the words BM25 matches (lowercased runs of letters and digits, Lucene's English stop words
  removed, no stemming), for the retrieval baseline and for the generation diagnosis's relevance orders.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from .errors import ConfigError
from .outputs import one_process

STOP_WORDS = frozenset(
    ["a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is", "it", "no", "not", "of",
     "on", "or", "such", "that", "the", "their", "then", "there", "these", "they", "this", "to", "was", "will",
     "with"])
"""Lucene's English stop words (EnglishAnalyzer's default set; bm25s's `STOPWORDS_EN`)."""

_WORD = re.compile(r"[^\W_]+")  # a run of Unicode letters and digits


def tokenize(text: str, stop_words: frozenset[str] | set[str] = STOP_WORDS) -> list[str]:
    """BM25 tokens of `text`: lowercased runs of letters/digits, without `stop_words`."""
    return [t for t in _WORD.findall(text.lower()) if t not in stop_words]


def answerable(examples) -> list:
    """The examples a diagnosis can ask: a question with at least one located answer in a non-empty context."""
    return [e for e in examples if e.answers and not e.is_impossible and e.question.strip() and e.context.strip()]


def check_cache_dir(cache_dir) -> None:
    """Refuse a `--cache-dir` that cannot become a folder (an existing file, or a path through one)."""
    for p in (Path(cache_dir), *Path(cache_dir).parents):
        if p.exists():
            if not p.is_dir():
                raise ConfigError(f"--cache-dir {cache_dir}: {p} is an existing file, not a folder"
                                  if p == Path(cache_dir) else f"--cache-dir {cache_dir}: {p} is an existing file")
            return


def run(diagnose: Callable, model, data, output_dir, *, progress: bool, bootstrap_samples: int, min_bucket: int,
        quality_floor: float, **options) -> dict:
    """A diagnosis's call as `posbias.diagnose` makes it: one diagnosis per output folder at a time, the
    verdict's options refused in one line when out of range, then `diagnose(model, data, output_dir,
    bias_samples=, min_bucket=, quality_floor=, progress=, **options)`."""
    from .analysis.verdict import check_verdict_options

    one_process("diagnose")
    check_verdict_options(bootstrap_samples, min_bucket, quality_floor)
    return diagnose(model, data, output_dir, bias_samples=bootstrap_samples, min_bucket=min_bucket,
                    quality_floor=float(quality_floor), progress=progress, **options)
