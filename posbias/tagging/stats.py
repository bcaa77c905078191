"""`posbias data stats`: what a tagging data set looks like (the token-positional-bias paper §3.1).

Sentence and word counts, the sentence-length distribution (quantiles, the shares of sentences
of at most 25 and at least 50 words, as in the paper's Table 1) and the classes: entities per
type for entity schemes, words per tag otherwise.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

from ..utils import atomic_write_json, atomic_write_text


def dataset_stats(dataset) -> dict:
    """The statistics of one read dataset (see the module docstring)."""
    from .metrics import entities

    lengths = np.array([len(e.words) for e in dataset.examples], dtype=np.int64)
    out = {"path": dataset.path, "format": dataset.format, "scheme": dataset.scheme,
           "source_scheme": dataset.source_scheme, "sentences": int(len(lengths)), "words": int(lengths.sum()),
           "skipped_records": len(dataset.skipped)}
    if len(lengths):
        q = np.percentile(lengths, [25, 50, 75])
        out["length"] = {"min": int(lengths.min()), "q1": float(q[0]), "median": float(q[1]), "q3": float(q[2]),
                         "max": int(lengths.max()), "mean": float(lengths.mean()),
                         "share_le_25": float(np.mean(lengths <= 25)), "share_ge_50": float(np.mean(lengths >= 50))}
    tagged = [e.tags for e in dataset.examples if e.tags is not None]
    if tagged and dataset.scheme != "none":
        counts = Counter(t for sent in entities(tagged, dataset.scheme) for t, _, _ in sent)
        out["classes"], out["class_unit"] = dict(sorted(counts.items())), "entities"
    elif tagged:
        counts = Counter(t for sent in tagged for t in sent)
        out["classes"], out["class_unit"] = dict(counts.most_common()), "words"
    return out


def markdown(stats: list[dict]) -> str:
    """One section per file: counts, length distribution, classes."""
    md = []
    for s in stats:
        md += [f"## `{s['path']}`", "",
               f"{s['format']}, scheme {s['scheme']}" + (f" (read as {s['source_scheme']})"
                                                        if s.get("source_scheme") not in (None, s["scheme"]) else "")
               + f": {s['sentences']:,} sentences, {s['words']:,} words"
               + (f", {s['skipped_records']} skipped" if s["skipped_records"] else "") + ".", ""]
        if "length" in s:
            L = s["length"]
            md += ["| words per sentence | min | Q1 | median | Q3 | max | mean | ≤ 25 | ≥ 50 |",
                   "|---|---|---|---|---|---|---|---|---|",
                   f"| | {L['min']} | {L['q1']:g} | {L['median']:g} | {L['q3']:g} | {L['max']} | {L['mean']:.1f} | "
                   f"{100 * L['share_le_25']:.1f}% | {100 * L['share_ge_50']:.1f}% |", ""]
        if s.get("classes"):
            total = sum(s["classes"].values())
            md += [f"| class | {s['class_unit']} | share |", "|---|---|---|"]
            md += [f"| {k} | {v:,} | {100 * v / total:.1f}% |" for k, v in s["classes"].items()]
            md.append("")
    return "\n".join(md) + "\n"


def data_stats(data, output_dir=None, *, format: str = "auto", tag: str = "upos", tag_column: int = -1,
               scheme: str = "auto", word_column: int = 0) -> dict:
    """Statistics of each file in `data` (a path or a list); with `output_dir`, writes stats.md and
    stats.json there. Returns {"files": [...], "markdown": str}."""
    from ..config import resolve_path
    from .readers import read_tagging

    paths = [data] if isinstance(data, (str, Path)) else list(data)
    stats = [dataset_stats(read_tagging(resolve_path(str(p)), format=format, tag=tag, tag_column=tag_column,
                                        scheme=scheme, word_column=word_column)) for p in paths]
    md = markdown(stats)
    if output_dir is not None:
        atomic_write_text(Path(output_dir) / "stats.md", md)
        atomic_write_json(Path(output_dir) / "stats.json", stats)
    return {"files": stats, "markdown": md}
