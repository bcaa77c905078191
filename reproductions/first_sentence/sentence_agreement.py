"""Agreement of the answer-sentence splitter (sentencex, `posbias.qa.sentences`) with pySBD on SQuAD dev.

Both are rule-based English segmenters written independently (sentencex: Wikimedia, Rust core and
abbreviation lists; pySBD: a Python port of the Golden Rules / pragmatic_segmenter). Where they agree,
an answer's sentence index does not hinge on one splitter's rules. For every question this reports
whether both put its first gold answer's first character in the same sentence (index) and the same
bucket (1, 2, 3, 4, 5+), the bucket confusion, each splitter's index distribution, and a few
disagreeing examples with the context around the first boundary they place differently.

pySBD's `char_span=True` finds each sentence by searching its text in the context (a regex from the
end of the previous match), so a span can be misplaced or a sentence dropped; its spans are checked
to tile the context (leading whitespace aside: pySBD starts the first sentence after it, sentencex at
0) and to equal `text[start:end]`. A context failing the check has its pySBD sentences (the same
segmentation, without spans) located in order with `str.find`; the count is reported.

Usage:
    python reproductions/first_sentence/sentence_agreement.py \
        [--data $POSBIAS_SHARED_DATA/squad_v1.1/dev-v1.1.json.gz] [--examples 8]
Prints a markdown block; writes bench/out/sentence_agreement.json.
"""
from __future__ import annotations

import argparse
import bisect
import json
import os
import subprocess
import sys
import time
from collections import Counter
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from posbias.qa.readers import read_qa  # noqa: E402
from posbias.qa.sentences import DEFAULT_LAST, NO_ANSWER, sentence_label, sentence_starts  # noqa: E402
from posbias.utils import cpu_name, now_iso  # noqa: E402

SHARED = Path(os.environ.get("POSBIAS_SHARED_DATA", ROOT.parent / "shared" / "data"))
SQUAD_DEV = SHARED / "squad_v1.1" / "dev-v1.1.json.gz"
OUT = ROOT / "bench" / "out" / "sentence_agreement.json"
BUCKETS = [sentence_label(i) for i in range(1, DEFAULT_LAST + 1)] + [NO_ANSWER]


def lscpu_model() -> str:
    """lscpu's "Model name" (the brief asks for it), else /proc/cpuinfo's."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return cpu_name()


def tidy(text: str, starts) -> tuple[int, ...]:
    """Sentence starts as `posbias.qa.sentences` keeps them: 0 first, increasing, no whitespace-only
    sentence (leading whitespace goes with the first sentence)."""
    kept = [0]
    for s in sorted(starts):
        if s > kept[-1] and text[kept[-1]:s].strip() and text[s:].strip():
            kept.append(s)
    return tuple(kept)


class PySBD:
    """pySBD sentence starts, its char spans checked (see the module docstring)."""

    def __init__(self):
        import pysbd

        self.segmenter = pysbd.Segmenter(language="en", clean=False, char_span=True)
        self.relocated = 0  # contexts whose spans failed the check
        self.unlocated = 0  # sentences `str.find` could not place either (merged into the one before)

    def starts(self, text: str) -> tuple[int, ...]:
        spans = self.segmenter.segment(text)
        if (spans and not text[: spans[0].start].strip() and spans[-1].end == len(text)
                and all(a.end == b.start for a, b in zip(spans, spans[1:]))
                and all(text[s.start:s.end] == s.sent for s in spans)):
            return tidy(text, [s.start for s in spans])
        self.relocated += 1
        found, cursor = [], 0
        for sent in self.segmenter.processor(text).process():  # the segmentation, without spans
            i = text.find(sent.strip(), cursor)
            if i < 0:
                self.unlocated += 1
                continue
            found.append(i)
            cursor = i + len(sent.strip())
        return tidy(text, found)


def snippet(text: str, boundary: int, width: int = 70) -> str:
    """The context around `boundary`, marked with ‖."""
    left, right = text[max(0, boundary - width):boundary], text[boundary:boundary + width]
    return ("…" if boundary > width else "") + left + "‖" + right + ("…" if boundary + width < len(text) else "")


def first_difference(text: str, a: tuple, b: tuple, upto: int) -> tuple[int, str]:
    """The first boundary (<= upto) that one splitter has and the other not, and who has it."""
    only = sorted([(s, "sentencex") for s in set(a) - set(b) if s <= upto] +
                  [(s, "pySBD") for s in set(b) - set(a) if s <= upto])
    return only[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(SQUAD_DEV), help="SQuAD / MRQA file (default: SQuAD v1.1 dev)")
    ap.add_argument("--examples", type=int, default=8, help="disagreeing examples to show")
    args = ap.parse_args()

    ds = read_qa(args.data)
    contexts = list(dict.fromkeys(e.context for e in ds.examples))
    t0 = time.perf_counter()
    x_starts = {c: sentence_starts(c) for c in contexts}
    t_x = time.perf_counter() - t0
    pysbd = PySBD()
    t0 = time.perf_counter()
    p_starts = {c: pysbd.starts(c) for c in contexts}
    t_p = time.perf_counter() - t0

    same_index = same_bucket = 0
    confusion = {a: Counter() for a in BUCKETS}  # sentencex bucket -> pySBD bucket -> questions
    dist_x, dist_p, examples, shown = Counter(), Counter(), [], set()
    for e in ds.examples:
        xs, ps = x_starts[e.context], p_starts[e.context]
        start = e.answers[0].start if e.answers else None
        ix = None if start is None else bisect.bisect_right(xs, start)
        ip = None if start is None else bisect.bisect_right(ps, start)
        bx, bp = sentence_label(ix), sentence_label(ip)
        same_index += ix == ip
        same_bucket += bx == bp
        confusion[bx][bp] += 1
        dist_x[bx] += 1
        dist_p[bp] += 1
        if ix != ip and len(examples) < args.examples:
            boundary, who = first_difference(e.context, xs, ps, start)
            if (e.context, boundary) not in shown:  # one example per differing boundary
                shown.add((e.context, boundary))
                examples.append({"id": e.id, "answer": e.answers[0].text, "sentencex_index": ix,
                                 "pysbd_index": ip, "boundary_only_in": who, "context": snippet(e.context, boundary)})

    n = len(ds.examples)
    x_bounds = {(c, s) for c in contexts for s in x_starts[c][1:]}
    p_bounds = {(c, s) for c in contexts for s in p_starts[c][1:]}
    result = {
        "date": now_iso(), "cpu": lscpu_model(), "data": str(args.data), "questions": n, "contexts": len(contexts),
        "sentencex": version("sentencex"), "pysbd": version("pysbd"),
        "same_index": same_index / n, "same_bucket": same_bucket / n,
        "distribution": {name: {b: {"count": d[b], "share": d[b] / n} for b in BUCKETS}
                         for name, d in (("sentencex", dist_x), ("pysbd", dist_p))},
        "confusion_sentencex_rows_pysbd_columns": {a: {b: confusion[a][b] for b in BUCKETS} for a in BUCKETS},
        "sentences_per_context": {"sentencex": len(x_bounds) / len(contexts) + 1,
                                  "pysbd": len(p_bounds) / len(contexts) + 1},
        "boundaries": {"both": len(x_bounds & p_bounds), "only_sentencex": len(x_bounds - p_bounds),
                       "only_pysbd": len(p_bounds - x_bounds)},
        "pysbd_spans_relocated_contexts": pysbd.relocated, "pysbd_unlocated_sentences": pysbd.unlocated,
        "seconds": {"sentencex": t_x, "pysbd": t_p},
        "examples": examples,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(render(result))
    print(f"\nwrote {OUT.relative_to(ROOT)}")


def render(r: dict) -> str:
    pct = lambda v: f"{100 * v:.1f}%"  # noqa: E731
    b = r["boundaries"]
    lines = [f"### Answer-sentence agreement: sentencex {r['sentencex']} vs pySBD {r['pysbd']}", "",
             f"{Path(r['data']).name}: {r['questions']:,} questions, {r['contexts']:,} contexts; CPU {r['cpu']}; "
             f"{r['date']}", "",
             f"- same answer-sentence index: **{pct(r['same_index'])}**; same bucket (1, 2, 3, 4, 5+): "
             f"**{pct(r['same_bucket'])}**",
             f"- sentences per context: sentencex {r['sentences_per_context']['sentencex']:.2f}, "
             f"pySBD {r['sentences_per_context']['pysbd']:.2f}; boundaries in both {b['both']:,}, only sentencex "
             f"{b['only_sentencex']:,}, only pySBD {b['only_pysbd']:,}",
             f"- pySBD char spans failing the tiling check: {r['pysbd_spans_relocated_contexts']} context(s) "
             f"(relocated with str.find; {r['pysbd_unlocated_sentences']} sentence(s) not found)",
             f"- time over the contexts: sentencex {r['seconds']['sentencex']:.2f} s, "
             f"pySBD {r['seconds']['pysbd']:.2f} s (one thread, shared machine)", "",
             "| splitter | " + " | ".join(BUCKETS) + " |", "|---|" + "---|" * len(BUCKETS)]
    for name, d in r["distribution"].items():
        lines.append(f"| {name} | " + " | ".join(f"{d[k]['count']:,} ({pct(d[k]['share'])})" for k in BUCKETS) + " |")
    lines += ["", "Bucket confusion (rows sentencex, columns pySBD):", "",
              "| sentencex \\ pySBD | " + " | ".join(BUCKETS) + " |", "|---|" + "---|" * len(BUCKETS)]
    for a, row in r["confusion_sentencex_rows_pysbd_columns"].items():
        lines.append(f"| {a} | " + " | ".join(f"{row[k]:,}" for k in BUCKETS) + " |")
    lines += ["", "Disagreements (‖ = the first boundary only one splitter places before the answer):", ""]
    for x in r["examples"]:
        lines.append(f"- `{x['id']}` answer {x['answer']!r}: sentencex {x['sentencex_index']}, pySBD "
                     f"{x['pysbd_index']}; boundary only in {x['boundary_only_in']}: "
                     f"\"{x['context'].replace(chr(10), ' ')}\"")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
