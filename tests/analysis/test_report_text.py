"""Users' text in reports (`posbias.render`) and non-finite numbers in JSON outputs: a class,
file, model or method name holding matplotlib math (`$\\undefinedcmd$`), a `|` or HTML neither
breaks a plot nor a Markdown table nor reaches a page as HTML; NaN is written as null, and a NaN
no-answer probability is bad input."""
import html
import json
import math
import re
import sqlite3

import numpy as np
import pytest
import yaml

from helpers import cli_here, demo_v2_file, tiny_config
from posbias.config import RESOURCES
from posbias.render import md_table
from posbias.render import md_escape, plot_text
from posbias.utils import atomic_write_json

MATH = "$\\undefinedcmd$"
CLASSES = [MATH, "a|b", "<script>alert(1)</script>"]
HOSTILE = CLASSES + ["**bold** _it_ *x* ~~s~~", "`code` ``x``", "[link](javascript:alert(1))", "![img](http://x/y.png)",
                     "back\\slash \\| \\*", "&lt;b&gt; &amp; R&D", "two\nlines\r\nhere", "_lead", "trail_", "snake_case_name",
                     "<!-- c -->", "<http://x.org>", "a > b < c", "$5 and $6", "| lead", "end |", "<0.001", "x<y"]


def _markdown():
    markdown_it = pytest.importorskip("markdown_it")
    return markdown_it.MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"])


def _cells(page: str) -> list[list[str]]:
    """The rows of a rendered Markdown table, each a list of cell texts (tags stripped, unescaped)."""
    rows = re.findall(r"<tr>(.*?)</tr>", page, re.S)
    return [[html.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", r, re.S)]
            for r in rows]


def _one_line(text: str) -> str:
    return " ".join(text.split())


# --------------------------------------------------------------------------------------- Markdown
@pytest.mark.parametrize("text", HOSTILE)
def test_escaped_text_renders_as_itself_in_a_paragraph_and_a_table_cell(text):
    md = _markdown()
    page = md.render(f"x {md_escape(text)} y\n")
    inner = re.fullmatch(r"<p>(.*)</p>\n", page, re.S).group(1)
    assert "<" not in inner  # no tag of any kind: no HTML, emphasis, code, link or image
    assert _one_line(html.unescape(inner)) == _one_line(f"x {text} y")
    table = md.render(md_table(["name", "n"], [[text, "1"], ["other", "2"]]) + "\n")
    assert _cells(table) == [["name", "n"], [_one_line(text), "1"], ["other", "2"]]  # two columns, text as is
    assert "<script" not in table


def test_a_leading_bold_number_stays_bold_and_nothing_else_is_markup():
    page = _markdown().render(md_table(["Δ"], [["**+1.20** (3 paired seeds)"], ["**x**"]]) + "\n")
    assert "<strong>+1.20</strong> (3 paired seeds)" in page and "<strong>x</strong>" not in page


@pytest.mark.parametrize("text", HOSTILE)
def test_escaped_text_is_drawn_as_itself_by_matplotlib(text):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.cbook import is_math_text

    assert not is_math_text(plot_text(text))
    fig, ax = plt.subplots()
    ax.set_title(plot_text(text))
    ax.plot([0, 1], label=plot_text(text))
    ax.set_xticks([0, 1], [plot_text(text), "b"])
    ax.legend()
    try:
        fig.canvas.draw()  # math text is parsed here: an unknown command raises
        shown, math_mode = ax.title._preprocess_math(ax.title.get_text())
    finally:
        plt.close(fig)
    assert (shown, math_mode) == (text, False)


# ------------------------------------------------------------------------------- reports end to end
def _assert_safe_reports(folder, names=("*.md", "*.html")):
    """No raw HTML from users' text; every Markdown table row has its header's column count."""
    files = [p for pattern in names for p in folder.rglob(pattern)]
    assert files
    for p in files:
        text = p.read_text(encoding="utf-8")
        assert "<script" not in text, p
        if p.suffix == ".md":
            for block in re.findall(r"(?:^\|.*\|$\n?)+", text, re.M):
                counts = {len(re.findall(r"(?<!\\)\|", line)) for line in block.splitlines()}
                assert len(counts) == 1, (p, block)


@pytest.fixture(scope="module")
def hostile_tagging(tmp_path_factory):
    """A CoNLL file whose entity classes are CLASSES, and a random tiny BERT token classifier
    (TINY_ENCODER sizes, no training) whose labels are those classes in IOB2."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForTokenClassification

    out = tmp_path_factory.mktemp("hostile")
    labels = ["O"] + [f"{p}-{c}" for c in CLASSES for p in "BI"]
    tok = AutoTokenizer.from_pretrained(str(RESOURCES / "tiny_tokenizer"))
    torch.manual_seed(0)
    BertForTokenClassification(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                                          num_attention_heads=4, intermediate_size=64, num_labels=len(labels),
                                          id2label=dict(enumerate(labels)), label2id={t: i for i, t in enumerate(labels)})
                               ).save_pretrained(str(out / "model"))
    tok.save_pretrained(str(out / "model"))
    words = "the cat sat on the mat and then it went home".split()
    lines = []
    for i in range(16):
        lines += [f"{words[j % len(words)]} {'O' if j % 3 else 'B-' + CLASSES[(i + j) % 3]}" for j in range(3 + i % 7)]
        lines.append("")
    (out / "data.conll").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def test_data_stats_with_hostile_class_names(hostile_tagging, tmp_path):
    import posbias

    res = posbias.data_stats(hostile_tagging / "data.conll", tmp_path / "stats")
    assert set(res["files"][0]["classes"]) == set(CLASSES)
    _assert_safe_reports(tmp_path / "stats")
    md = (tmp_path / "stats" / "stats.md").read_text(encoding="utf-8")
    assert "| a\\|b | " in md and "| &lt;script&gt;alert(1)&lt;/script&gt; | " in md
    assert (tmp_path / "stats" / "class_positions_1.png").stat().st_size > 0


def test_diagnose_tagging_with_hostile_class_names(hostile_tagging, tmp_path):
    import posbias

    res = posbias.diagnose(hostile_tagging / "model", hostile_tagging / "data.conll", tmp_path / "diag", k_max=3,
                           progress=False, bootstrap_samples=20, min_bucket=5)
    assert set(res["duplicate"]["by_alpha"][0]["per_class"]) == set(CLASSES)
    _assert_safe_reports(tmp_path / "diag")
    md = (tmp_path / "diag" / "diagnosis.md").read_text(encoding="utf-8")
    per_class = md.split("## Per class")[1].split("##")[0]
    assert {line.split(" | ")[0] for line in per_class.splitlines() if line.startswith("| ") and "---" not in line} \
        == {"| class", "| a\\|b", "| &lt;script&gt;alert(1)&lt;/script&gt;", "| \\$\\\\undefinedcmd\\$"}
    page = (tmp_path / "diag" / "diagnosis.html").read_text(encoding="utf-8")
    assert "<td>&lt;script&gt;alert(1)&lt;/script&gt;</td>" in page and "<td>a|b</td>" in page
    assert all((tmp_path / "diag" / n).stat().st_size > 0 for n in ("per_class.png", "class_positions.png"))


def _hostile_store(exp_dir, method: str):
    """A finished two-method QA experiment store (no training): `method` against `base`, each with two
    seeds, answer-position segments and a loss curve; its data set and eval set names are hostile too."""
    from posbias.experiment import SCHEMA

    exp_dir.mkdir(parents=True)
    (exp_dir / "experiment.yaml").write_text(yaml.safe_dump({"name": "x|<b>y</b>", "baseline": "base",
                                                             "methods": {"base": {}, method: {}}}), encoding="utf-8")
    with sqlite3.connect(exp_dir / "experiment.sqlite") as conn:
        conn.executescript(SCHEMA)
        for m, f1 in (("base", 60.0), (method, 64.0)):
            for seed in (1, 2):
                name = f"{m}/seed{seed}"
                metrics = {"<i>val</i>": {"exact_match": f1 - 10, "f1": f1 + seed, "total": 80}}
                conn.execute("INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                             (name, m, seed, "data|$\\x$", 100, "h", json.dumps({"task": "qa"}), "/nonexistent",
                              "finished", "", "", 60.0, 50.0, json.dumps(metrics), "{}"))
                conn.executemany("INSERT INTO segments VALUES (?, ?, ?, ?, ?, ?, ?)",
                                 [(name, "<i>val</i>", "gold_position_quartile", q, 40, s, s)
                                  for q, s in (("Q1", f1 + 5 + seed), ("Q2", f1 - 5 - seed))])
                conn.executemany("INSERT INTO curves VALUES (?, ?, ?, ?)",
                                 [(name, "loss", step, 3.0 - step / 2) for step in range(1, 4)])


@pytest.mark.parametrize("method", [MATH, "rpp|x", "<script>alert(1)</script>"])
def test_experiment_report_with_a_hostile_method_name(tmp_path, method):
    from posbias.experiment.report import write_report

    _hostile_store(tmp_path / "exp", method)
    res = write_report(tmp_path / "exp", bootstrap_samples=0)
    assert len(res["plots"]) >= 3  # comparison, learning curves, segments: each drew the names
    _assert_safe_reports(tmp_path / "exp")
    md = (tmp_path / "exp" / "report.md").read_text(encoding="utf-8")
    assert f"| {md_escape(method)} |" in md and f"- {md_escape(method)} (2 runs)" in md
    assert "# Experiment x\\|&lt;b&gt;y&lt;/b&gt;" in md
    page = (tmp_path / "exp" / "report.html").read_text(encoding="utf-8")
    assert f"<td>{html.escape(method)}</td>" in page and "<b>y</b>" not in page


# ------------------------------------------------------------------------------------------ QA text
@pytest.fixture(scope="module")
def dyref_checkpoint(tmp_path_factory):
    """A random tiny DyReF (dynamic_query) QA checkpoint, saved without training."""
    import torch

    from helpers import tiny_model
    from posbias.checkpoint import save_checkpoint
    from posbias.config import build_config
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(RESOURCES / "tiny_tokenizer"))
    out = tmp_path_factory.mktemp("dyref") / "ck"
    torch.manual_seed(0)
    save_checkpoint(tiny_model(tok, head="dynamic_query"), build_config(tiny_config(model={"head": "dynamic_query"})),
                    tok, out)
    return out


def test_qa_predict_and_explain_with_dollar_signs(dyref_checkpoint, tmp_path):
    import posbias

    question = f"What does {MATH} cost?"
    plain = "The book costs five dollars and the pen six."  # the answer adds no "$": the title's two stay a pair
    dollars = f"The book costs $5 and the pen $6; {MATH} is a command; $\\frac{{1}}{{0}}$ too."
    pred = posbias.predict(dyref_checkpoint, question=question, context=dollars)
    assert all(isinstance(p["answer"], str) for p in pred.values())
    for i, context in enumerate((plain, dollars)):
        res = posbias.explain_attention(dyref_checkpoint, question, context, tmp_path / f"ex{i}")
        assert "$" in res["tokens"] and (tmp_path / f"ex{i}" / "attention.png").stat().st_size > 0
        assert json.loads((tmp_path / f"ex{i}" / "attention.json").read_text(encoding="utf-8"))["question"] == question


# -------------------------------------------------------------------------------------- NaN in JSON
def _strict_loads(text: str):
    def refuse(token):
        raise ValueError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("indent", [None, 2])
@pytest.mark.parametrize("obj, expected", [
    ({"p": float("nan"), "q": [float("inf"), -math.inf, 1.5], "r": {"s": np.float64("nan"), "t": (np.nan, 2)}},
     {"p": None, "q": [None, None, 1.5], "r": {"s": None, "t": [None, 2]}}),
    ([{"x": float("nan")}, 0.5], [{"x": None}, 0.5]),
    (float("-inf"), None),
    ({"fine": [1.0, -0.0, 1e308]}, {"fine": [1.0, -0.0, 1e308]}),
])
def test_non_finite_floats_are_written_as_null(tmp_path, obj, expected, indent):
    atomic_write_json(tmp_path / "o.json", obj, indent=indent)
    assert _strict_loads((tmp_path / "o.json").read_text(encoding="utf-8")) == expected


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_a_non_finite_no_answer_probability_is_one_line_exit_2(tmp_path, value):
    data, examples = demo_v2_file(tmp_path, 6)
    (tmp_path / "pred.json").write_text(json.dumps({e.id: "" for e in examples}), encoding="utf-8")
    probs = {e.id: 0.5 for e in examples}
    text = json.dumps(probs).replace("0.5", value, 1)  # the first question's probability
    (tmp_path / "na.json").write_text(text, encoding="utf-8")
    r = cli_here("score", "qa", "--data", str(data), "--predictions", str(tmp_path / "pred.json"),
                 "--na-probs", str(tmp_path / "na.json"))
    assert r.returncode == 2 and r.stdout == "", (r.stdout, r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "na.json" in lines[0] and examples[0].id in lines[0] and "finite" in lines[0]
