"""Every report escapes users' text with the one escaper (`posbias.render.md_escape`; the page: HTML
escaping): the same planted strings in file, model, method, data set and experiment names come out
as text in the three diagnoses (qa, tagging, retrieval) and the experiment report, Markdown and HTML,
never as HTML, a link, code, emphasis, math or an extra table column; so does `data build`'s stats.md."""
from __future__ import annotations

import html
import json
import re
import shutil
import sqlite3

import pytest
import torch
import yaml
from helpers import DEMO_DEV, save_tiny_checkpoints
from transformers import BertConfig, BertModel

import posbias
import posbias.api
from posbias.config import resolve_path
from posbias.encoders import open_tokenizer
from posbias.render import md_escape

PLANTED = ["<svg onload=alert(1)>", "$\\undefinedcmd$", "a|b", "`x`", "[x](javascript:y)", "*b*"]
NAME = " ".join(PLANTED)  # one file or folder name holding every one of them


def assert_escaped(folder, stem: str, name: str = NAME, page: bool = True) -> None:
    """`folder/stem.md` and `.html` (when `page`) show `name` as text: the escaped name is there, no
    planted string is there raw, no `$` opens math, every table row keeps its header's columns, the
    page holds no tag from it (and, rendered, neither does the Markdown)."""
    md = (folder / f"{stem}.md").read_text(encoding="utf-8")
    assert md_escape(name) in md
    for raw in PLANTED:
        assert raw not in md, raw
    assert not re.search(r"(?<!\\)(?:\\\\)*\$", md), "an unescaped $ starts math"
    for block in re.findall(r"(?:^\|.*\|$\n?)+", md, re.M):
        counts = {len(re.findall(r"(?<!\\)(?:\\\\)*\|", line)) for line in block.splitlines()}
        assert len(counts) == 1, block  # no `|` of a name adds a column
    if page:
        text = (folder / f"{stem}.html").read_text(encoding="utf-8")
        assert html.escape(name) in text
        assert "<svg" not in text and "<a " not in text and "<code>x</code>" not in text and "<em>" not in text
    try:
        import markdown_it
    except ImportError:
        return
    shown = markdown_it.MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"]).render(md)
    assert "<svg" not in shown and "<a " not in shown and "<code>x</code>" not in shown and "<em>b</em>" not in shown
    assert name in html.unescape(re.sub(r"<[^>]+>", "", shown))  # the name itself, as text


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """Tiny random models and small data files, every path holding NAME: a QA and a tagging posbias
    checkpoint, a plain encoder folder, a SQuAD file and a CoNLL file."""
    root = tmp_path_factory.mktemp("esc") / NAME
    models = save_tiny_checkpoints(root)
    tok = open_tokenizer(resolve_path("tiny"))
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64, max_position_embeddings=160)).save_pretrained(root / "encoder")
    tok.save_pretrained(root / "encoder")
    squad = root / f"{NAME}.json.gz"
    shutil.copyfile(DEMO_DEV, squad)
    words = "Ann met Bob and then they went home with Carl".split()
    lines = []
    for i in range(16):
        for j in range(3 + i % 6):
            w = words[(i + j) % len(words)]
            lines.append(f"{w} {'B-person' if w[0].isupper() else 'O'}")
        lines.append("")
    conll = root / f"{NAME}.conll"
    conll.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return {**models, "encoder": str(root / "encoder"), "squad": str(squad), "conll": str(conll)}


def test_diagnose_qa(hostile, tmp_path):
    posbias.diagnose(hostile["qa"], hostile["squad"], tmp_path / "d", overrides=["data.max_eval_examples=24"],
                     progress=False, bootstrap_samples=0, min_bucket=5)
    assert_escaped(tmp_path / "d", "diagnosis")


def test_diagnose_tagging(hostile, tmp_path):
    posbias.diagnose(hostile["tagging"], hostile["conll"], tmp_path / "d", k_max=3, quantiles=None, progress=False,
                     bootstrap_samples=0, min_bucket=5)
    assert_escaped(tmp_path / "d", "diagnosis")


def test_diagnose_retrieval(hostile, tmp_path):
    posbias.diagnose(hostile["encoder"], hostile["squad"], tmp_path / "d", task="retrieval", progress=False,
                     max_queries=30, paired=False, bm25=False, chunks=False, bootstrap_samples=0, min_bucket=5,
                     device="cpu", precision="fp32")
    assert_escaped(tmp_path / "d", "diagnosis")
    md = (tmp_path / "d" / "diagnosis.md").read_text(encoding="utf-8")
    assert f"- data: {md_escape(hostile['squad'])}: 30 answerable questions" in md  # the Setup list: escaped too
    assert f"- model: {md_escape(hostile['encoder'])} (" in md


def test_experiment_report(tmp_path):
    """A finished two-method store (no training): the planted name as the experiment's, a method's,
    the data set's and the eval set's name."""
    from posbias.experiment import SCHEMA
    from posbias.experiment.report import write_report

    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / "experiment.yaml").write_text(yaml.safe_dump({"name": NAME, "baseline": "base",
                                                         "methods": {"base": {}, NAME: {}}}), encoding="utf-8")
    with sqlite3.connect(exp / "experiment.sqlite") as conn:
        conn.executescript(SCHEMA)
        for method, f1 in (("base", 60.0), (NAME, 64.0)):
            for seed in (1, 2):
                run = f"{method}/seed{seed}"
                metrics = {NAME: {"exact_match": f1 - 10, "f1": f1 + seed, "total": 80}}
                conn.execute("INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                             (run, method, seed, NAME, 100, "h", json.dumps({"task": "qa"}), "/nonexistent",
                              "finished", "", "", 60.0, 50.0, json.dumps(metrics), "{}"))
                conn.executemany("INSERT INTO segments VALUES (?, ?, ?, ?, ?, ?, ?)",
                                 [(run, NAME, "gold_position_quartile", q, 40, s, s)
                                  for q, s in (("Q1", f1 + 5 + seed), ("Q2", f1 - 5 - seed))])
    conn.close()
    write_report(exp, bootstrap_samples=0)
    assert_escaped(exp, "report")


def test_data_build_stats(tmp_path):
    """`data build --name`: the set's name (one path component: no backslash) in stats.md's tables."""
    name = NAME.replace("\\", "")
    out = tmp_path / "built"
    posbias.api.data_build([DEMO_DEV], out, name=name, truncate=50)
    assert (out / f"{name}.json").is_file()
    assert_escaped(out, "stats", name, page=False)
