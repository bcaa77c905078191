"""`posbias data stats`: what a tagging data set looks like (the token-positional-bias paper §3.1).

Sentence and word counts, the sentence-length distribution (quantiles, the shares of sentences
of at most 25 and at least 50 words, as in the paper's Table 1, and its density plot, Fig. 2), the
classes (entities per type for entity schemes, words per tag otherwise) and where in the sentence
each class occurs (word position of each entity start or tagged word: the paper's Figs. 3-5).
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from urllib.parse import quote

import numpy as np

from ..render import md_escape, plot_text, pyplot
from ..config import resolve_path
from ..outputs import staged_output
from ..utils import atomic_write_json, atomic_write_text
from .metrics import entities
from .readers import read_tagging


def class_positions(dataset) -> dict[str, np.ndarray]:
    """Per class, the 0-based word position of every entity start (entity schemes) or of every
    word with that tag (POS), over the whole dataset."""
    tagged = [e.tags for e in dataset.examples if e.tags is not None]
    pos: dict[str, list[int]] = {}
    if dataset.scheme != "none":
        for sent in entities(tagged, dataset.scheme):
            for t, a, _ in sent:
                pos.setdefault(t, []).append(a)
    else:
        for tags in tagged:
            for i, t in enumerate(tags):
                pos.setdefault(t, []).append(i)
    return {t: np.asarray(v, dtype=np.int64) for t, v in sorted(pos.items())}


def dataset_stats(dataset) -> dict:
    """The statistics of one read dataset (see the module docstring)."""
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
    if tagged:
        out["class_positions"] = {t: {"median": float(np.median(p)), "share_first_5": float(np.mean(p < 5)),
                                      "share_first_10": float(np.mean(p < 10)), "share_from_25": float(np.mean(p >= 25))}
                                  for t, p in class_positions(dataset).items() if len(p)}
    return out


def plot_length_density(lengths: dict[str, np.ndarray], path, bounds: dict | None = None) -> Path:
    """Density of sentence lengths in words, one curve per data set (Fig. 2); `bounds` name -> (lo,
    hi) shades a D* range."""
    from scipy.stats import gaussian_kde

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.8))
    top = max(int(np.percentile(x, 99.5)) for x in lengths.values() if len(x)) + 5
    grid = np.linspace(0, top, 400)
    for name, x in lengths.items():
        if len(x) > 1 and np.ptp(x) > 0:
            ax.plot(grid, gaussian_kde(x.astype(float))(grid), label=plot_text(f"{name} ({len(x):,})"))
        for lo, hi in ([(bounds or {}).get(name)] if (bounds or {}).get(name) else []):
            ax.axvspan(lo, hi, alpha=0.12)
    for v in (25, 50):
        ax.axvline(v, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("sentence length (words); dotted: 25 and 50 (Table 1)")
    ax.set_ylabel("density")
    ax.set_title("Sentence-length distribution")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def plot_class_positions(positions: dict[str, np.ndarray], path, title: str, max_classes: int = 8,
                         max_position: int = 60) -> Path:
    """Histograms of the word position of each class (entity starts or tagged words), the most
    frequent `max_classes` classes, positions beyond `max_position` in the last bin (Figs. 3-5)."""
    plt = pyplot()
    top = sorted(positions, key=lambda t: -len(positions[t]))[:max_classes]
    cols = min(4, max(len(top), 1))
    rows = (len(top) + cols - 1) // cols or 1
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.4 * rows), squeeze=False)
    bins = np.arange(0, max_position + 2)
    for ax, t in zip(axes.flat, top):
        # The histogram as one filled outline, not a bar per bin: the same picture, drawn in 0.55 s instead
        # of 0.9 s for 8 classes (a grid's position_eval draws one per run).
        counts, _ = np.histogram(np.minimum(positions[t], max_position), bins=bins)
        ax.stairs(counts, bins, fill=True, color="tab:blue")
        ax.set_title(plot_text(f"{t} (n={len(positions[t]):,})"), fontsize=9)
        ax.set_xlabel("word position", fontsize=8)
    for ax in list(axes.flat)[len(top):]:
        ax.axis("off")
    fig.suptitle(plot_text(title), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def markdown(stats: list[dict]) -> str:
    """One section per file: counts, length distribution, classes. The file's path and class names
    are users' text: escaped (`md_escape`), a class named `a|b` or `<b>` stays one cell of text."""
    md = []
    for s in stats:
        md += [f"## {md_escape(s['path'])}", "",
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
            cp = s.get("class_positions", {})
            md += [f"| class | {s['class_unit']} | share | median word position | in words 1-5 | 1-10 | from 26 |",
                   "|---|---|---|---|---|---|---|"]
            for k, v in s["classes"].items():
                p = cp.get(k)
                where = (f"{p['median']:g} | {100 * p['share_first_5']:.1f}% | {100 * p['share_first_10']:.1f}% | "
                         f"{100 * p['share_from_25']:.1f}%") if p else " | | | "
                md.append(f"| {md_escape(k)} | {v:,} | {100 * v / total:.1f}% | {where} |")
            md.append("")
        for title, name in s.get("plots", []):
            md += [f"![{title}]({quote(name)})", ""]
    return "\n".join(md) + "\n"


def data_stats(data, output_dir=None, *, format: str = "auto", tag: str = "upos", tag_column: int = -1,
               scheme: str = "auto", word_column: int = 0) -> dict:
    """Statistics of each file in `data` (a path or a list); with `output_dir`, writes stats.md and
    stats.json there. Returns {"files": [...], "markdown": str}."""
    paths = [data] if isinstance(data, (str, Path)) else list(data)
    datasets = [read_tagging(resolve_path(str(p)), format=format, tag=tag, tag_column=tag_column, scheme=scheme,
                             word_column=word_column) for p in paths]
    stats = [dataset_stats(d) for d in datasets]
    if output_dir is None:
        md = markdown(stats)
        return {"files": stats, "markdown": md}
    written = {"stats.md", "stats.json", "length_density.png", *(f"class_positions_{i + 1}.png" for i in range(len(paths)))}
    with staged_output(output_dir, written) as out:  # the whole set replaces the folder's, or nothing does
        names = [f"{i + 1}: {Path(str(p)).name}" for i, p in enumerate(paths)]
        density = plot_length_density({n: np.array([len(e.words) for e in d.examples]) for n, d in zip(names, datasets)},
                                      out / "length_density.png")
        for i, (s, d, n) in enumerate(zip(stats, datasets, names)):
            s["plots"] = [("Sentence-length density", density.name)] if i == 0 else []
            pos = class_positions(d)
            if pos:
                f = plot_class_positions(pos, out / f"class_positions_{i + 1}.png", f"Class positions, {n}")
                s["plots"].append(("Class positions", f.name))
        md = markdown(stats)
        atomic_write_text(out / "stats.md", md)
        atomic_write_json(out / "stats.json", stats)
    return {"files": stats, "markdown": md}
