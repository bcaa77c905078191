"""reproductions/results_pages.py: the site's Results pages, generated from reproductions/summary.yaml,
the archived stores and the which-method script (the hand-written notes are not rendered)."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "reproductions" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


rp = _load("results_pages")
cs = _load("check_summary")
SUMMARY = yaml.safe_load((ROOT / "reproductions" / "summary.yaml").read_text(encoding="utf-8"))
PAPERS = ["random-padding", "map", "token-positional-bias", "dyref", "first-sentence", "retrieval",
          "lost-in-the-middle"]


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    """The Markdown pages (the rows' figures are checked in test_the_rows_figures_are_copied_beside_the_pages)."""
    return {k: v for k, v in rp.pages().items() if k.endswith(".md")}


def test_the_rows_figures_are_copied_beside_the_pages_and_shown_by_their_row():
    everything = rp.pages()
    figures = {k: v for k, v in everything.items() if not k.endswith(".md")}
    shown = [(row, f) for row in SUMMARY["rows"] for f in row.get("figures") or []]
    assert shown, "the Lost-in-the-middle row shows the depth x length heatmap"
    for row, f in shown:
        key = next(k for k in figures if k.endswith(f"{Path(f['diagnosis']).name}-{Path(f['file']).name}"))
        assert figures[key] == (ROOT / f["diagnosis"] / f["file"]).read_bytes() and figures[key][:4] == b"\x89PNG"
        page = everything[f"results/{row['paper']}.md"]
        assert key.removeprefix("results/") in page and _flat(f["caption"]) in _flat(page), key


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_every_results_page_is_generated(pages):
    assert set(pages) == {"results/index.md", "results/which-method.md"} | {f"results/{p}.md" for p in PAPERS}
    assert set(SUMMARY["papers"]) == set(PAPERS)


def test_each_paper_page_shows_its_rows_verdicts_regimes_and_how_to_rerun_them(pages):
    for row in SUMMARY["rows"]:
        page = _flat(pages[f"results/{row['paper']}.md"])
        assert _flat(row["short"]["verdict"]) in page, row["claim"]
        assert _flat(row["full"]["verdict"]) in page, row["claim"]
        assert _flat(row["full"]["ours"]) in page, row["claim"]
        assert _flat(row["regime"]) in page, row["claim"]
        for command in row["rerun"]:
            assert command in pages[f"results/{row['paper']}.md"], command
        # every experiment the row names is listed with its report, and that report exists
        for name in row["experiments"]:
            report = (f"docs/{name}/diagnosis.md" if name.startswith("diagnoses/")
                      else f"docs/experiments/{name}/report.md")
            assert f"`{report}`" in page and (ROOT / report).is_file(), report


def test_the_index_has_the_summary_table_the_verdict_words_and_how_numbers_are_checked(pages):
    index = pages["results/index.md"]
    for row in SUMMARY["rows"]:
        assert _flat(row["short"]["verdict"]) in index
        assert f"({row['paper']}.md#{rp.slug(row['claim'])})" in index
    for word, definition in SUMMARY["verdicts"].items():
        assert f"**{word}**: {_flat(definition)}" in _flat(index)
    n_checks = sum(len(r.get("checks") or []) for r in SUMMARY["rows"])
    assert f"recomputes {n_checks} numbers" in _flat(index) and "python reproductions/check_summary.py" in index
    # the generated table is one check_summary reads: every row in it is a summary.yaml row
    assert len(cs.table_rows(index)) == len(SUMMARY["rows"])
    assert cs.check(SUMMARY, index) == []


def test_the_experiment_tables_read_runs_and_seeds_from_the_stores(pages):
    facts = rp.store_facts("map_squad")
    assert facts["runs"] == 12 and facts["seeds"] == [1, 2, 3] and "map_e" in facts["methods"]
    assert "| `map_squad` | 12 |" in pages["results/map.md"]
    assert rp.store_facts("tpb_conll_dstar")["kind"] == "report only"  # archived as report.md only


def test_the_hand_written_notes_are_not_rendered(pages):
    """Each paper's measurement notes stay in the repository (reproductions/<paper>/NOTES.md); a Results page
    renders only what summary.yaml, the stores and the which-method script give, and no lab-notebook text."""
    for key in PAPERS:
        folder = ROOT / "reproductions" / rp.FOLDERS.get(key, key.replace("-", "_"))
        assert not (folder / "DETAILS.md").exists(), key
        page = pages[f"results/{key}.md"]
        assert "\n## Details\n" not in page, key
        notes = folder / "NOTES.md"
        if notes.exists():
            first = next((line for line in notes.read_text(encoding="utf-8").splitlines() if line.startswith("## ")), None)
            assert first is None or first[3:] not in page, key
    for name, text in pages.items():
        assert not cs.NOTEBOOK.search(text), (name, cs.NOTEBOOK.search(text).group(0))


def test_out_writes_the_pages(tmp_path):
    assert rp.main(["--out", str(tmp_path)]) == 0
    written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert written == sorted(rp.pages())


def _prose_lines(text: str):
    fence = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
        if not fence and not line.lstrip().startswith("|"):
            yield line


def test_results_text_has_no_issue_numbers_and_no_overlong_prose_lines(pages):
    texts = dict(pages)
    spec = importlib.util.spec_from_file_location("results_page", ROOT / "benchmarks" / "results_page.py")
    performance = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(performance)
    texts["results/performance.md"] = performance.page()  # generated from benchmarks/results/*.json
    for path in (ROOT / "reproductions").glob("*/NOTES.md"):
        texts[str(path.relative_to(ROOT))] = path.read_text(encoding="utf-8")
    for name, text in texts.items():
        assert not re.search(r"\b[Ii]ssues? \d", text), name
        for line in text.splitlines():
            if line.startswith("#"):
                assert not re.search(r"20\d\d-\d\d-\d\d", line), (name, line)  # dates go in the text, not headings
        long = [line[:60] for line in _prose_lines(text) if len(line) > 300]
        assert not long, (name, long)


def test_a_malformed_summary_stops_the_pages_in_one_line(tmp_path, capsys):
    path = tmp_path / "summary.yaml"
    path.write_text("rows: oops\n", encoding="utf-8")
    assert rp.main(["--out", str(tmp_path / "out"), "--summary", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "papers must be a non-empty mapping" in err
    assert not (tmp_path / "out").exists()
