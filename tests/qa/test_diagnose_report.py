"""The QA diagnosis report as a reader sees it: its title names model and data (a bundled set by its
alias), the warning stands above the tables, the headings are words, the notes use the model's window."""
import re

import posbias
from posbias.config import RESOURCES, build_config

from helpers import tiny_config


def test_the_qa_report_names_model_and_data_and_warns_above_its_tables(tmp_path):
    cfg = build_config(tiny_config(tmp_path, train={"max_steps": 2}))  # 128-token windows, F1 under the floor
    posbias.train(cfg, progress=False)
    model = tmp_path / "run" / "best"
    res = posbias.diagnose(model, "demo:dev", tmp_path / "diag", overrides=["data.max_eval_examples=30"],
                           bootstrap_samples=0, progress=False)
    assert res["position_bias"]["quality"]["below"]
    md = (tmp_path / "diag" / "diagnosis.md").read_text(encoding="utf-8")
    lines = md.splitlines()
    assert lines[0] == f"# Position diagnosis of {model} on demo:dev"
    assert str(RESOURCES) not in md and "site-packages" not in md and "Data: demo:dev." in md
    warning = next(i for i, x in enumerate(lines) if x.startswith("> **Warning:** overall F1"))
    assert warning < next(i for i, x in enumerate(lines) if x.startswith("| axis |"))
    assert "Q1 [0,32) = tokens 0..31" in md and "[0,96)" not in md
    headings = [x for x in lines if x.startswith("#")]
    assert not any(re.search(r"\w\(\w+=", h) for h in headings), headings  # no `first_x_tokens(x=100)`
    assert "### EM/F1 by a gold answer in the first 100 tokens of a window, S100(1), or only later, S100(2) (App. C)" in headings
    page = (tmp_path / "diag" / "diagnosis.html").read_text(encoding="utf-8")
    assert page.index("<blockquote class='warning'>") < page.index("<table")
    assert "<div class='figures'>" in page
    assert res["verdict_lines"][0].startswith("Position bias of") and "on demo:dev" in res["verdict_lines"][0]
