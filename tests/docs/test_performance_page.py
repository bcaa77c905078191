"""The Performance page is generated from benchmarks/results/*.json by benchmarks/results_page.py: every
file is a section, the "At a glance" links land on them, the page carries no history (a date only on a
section's machine line), a malformed file stops it in one line, and the numbers are the measured ones."""
from __future__ import annotations

import importlib.util
import json
import re
import shutil
from functools import cache

import pytest

from . import ROOT, generator

RESULTS = ROOT / "benchmarks" / "results"
DATE = re.compile(r"20\d\d-\d\d-\d\d")


@cache
def results_page():
    spec = importlib.util.spec_from_file_location("posbias_results_page", ROOT / "benchmarks" / "results_page.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def page() -> str:
    return results_page().page()


def _files() -> list:
    return sorted(RESULTS.glob("*.json"))


def _ids(text: str) -> set[str]:
    """The ids a reader's link can land on: headings' {#id} and the anchors kept for old links."""
    return set(re.findall(r"^#+ .*\{#([\w-]+)\}$", text, re.M)) | set(re.findall(r'<a id="([\w-]+)"></a>', text))


def _rows(text: str) -> list[list[str]]:
    """Every table row of the page as its cells (stripped)."""
    return [[c.strip() for c in line.strip()[1:-1].split(" | ")] for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("|---")]


def test_every_results_file_is_a_section_and_every_glance_link_lands_on_one(page):
    files = _files()
    assert len(files) >= 14
    lines = page.splitlines()
    for path in files:
        result = json.loads(path.read_text(encoding="utf-8"))
        slug = results_page().anchor(path, result)
        script = f" (`{result['script']}`)" if result["script"] else ""
        assert f"## {result['title']}{script} {{#{slug}}}" in lines, path.name
        assert result["summary"] in page, path.name
    glance = page.split("## At a glance", 1)[1].split("\n## ", 1)[0]
    links = re.findall(r"\]\(#([\w-]+)\)", glance)
    assert len(links) == len(files) == len(set(links))
    ids = _ids(page)
    assert set(links) <= ids
    assert set(re.findall(r"\]\(#([\w-]+)\)", page)) <= ids  # no in-page link lands nowhere


def test_the_anchors_of_the_hand_written_page_still_land(page):
    ids = _ids(page)
    for old in ("qa-foundation-benchmarksqapy", "bf16-benchmarksprecisionpy",
                "token-classification-benchmarkstaggingpy", "decoding", "against-the-raw-encoder-limit", "on-a-gpu",
                "how-many-runs-one-gpu-takes-toolsgpulane_probepy"):
        assert old in ids, old


def test_a_date_only_on_machine_lines_and_no_session_history(page):
    machine_lines = [line for line in page.splitlines() if line.startswith("Measured ")]
    assert len(machine_lines) == len(_files())
    for line in page.splitlines():
        if DATE.search(line):
            assert line in machine_lines and re.match(r"Measured 20\d\d-\d\d-\d\d on ", line), line
        low = line.lower()
        for word in ("session", "queue", "/tmp/", "../shared"):
            assert word not in low, (word, line)
    for path in _files():
        date = json.loads(path.read_text(encoding="utf-8"))["date"]
        assert date is None or f"Measured {date} on " in page, path.name


def test_the_scripts_named_exist():
    for path in _files():
        script = json.loads(path.read_text(encoding="utf-8"))["script"]
        if script and script.endswith((".py", ".yaml")):
            assert (ROOT / script).is_file(), (path.name, script)
    for moved in ("throughput.py", "lane_probe.py"):  # benchmarks, not machine operations: under benchmarks/gpu/
        assert (ROOT / "benchmarks" / "gpu" / moved).is_file() and not (ROOT / "tools" / "gpu" / moved).exists()


# Cells as the hand-written page printed them, before it was generated.
OLD_PAGE_ROWS = [
    ["posbias (`answer_logprobs`)", "**20.57**", "**699**"],  # generation scoring, tokens/s
    ["log-likelihood (in process: one forward per prompt; llama.cpp: one request per answer token)",
     "1.02 (871 prompt tokens/s)", "0.49 (417)", "0.48"],  # llama.cpp's server
    ["now", "**2,401**", "**2,859**"],  # evaluation host pipeline
    ["**ratio / Δ**", "−0.49", "−0.43", "−0.92", "**−0.62** (paired t-test p = 0.058)", "**2.47× faster**",
     "**2.47×**"],  # tagging against run_ner.py, 3 seeds
    ["MaP_E, `topk`", "12.0", "1.151", "1.13–1.20",
     "≤ 1.15: at the limit (0.001 over, within noise)"],  # span heads, interleaved on an idle machine
    ["6", "19.0 (18.3–20.1)", "114.9", "46.3"],  # lanes on one H200
    ["posbias train", "fp32", "108,586", "110,915", "43.80", "0.84", ""],  # GPU throughput
    ["`posbias train qa -c tiny train.nosuch=1` (a key typo: one line, exit 2)", "0.360 s", "7.129 s", "0.050",
     "42 / 413 MiB"],
    ["QA: the verdict on two axes (now)", "4.48 s", "×22.6"],
    ["**ratio / difference (one seed, 42)**", "", "", "**3.17× faster**", "**3.14×**", "**3.14×**", "**+12.0**",
     "**+18.5**"],  # QA against run_qa.py
]


def test_the_numbers_are_the_measured_ones(page):
    rows = _rows(page)
    for row in OLD_PAGE_ROWS:
        assert row in rows, row
    glance = page.split("## At a glance", 1)[1].split("\n## ", 1)[0]
    for number in ("699", "0.96", "3.24×", "0.48×", "0.66×", "3.7×", "870 MiB", "1.36×", "115 steps/s",
                   "VCP 1.027", "0.94 of its speed"):
        assert number in glance, number


def _copy(tmp_path):
    folder = tmp_path / "results"
    folder.mkdir()
    for name in ("qa.json", "heads.json"):
        shutil.copy(RESULTS / name, folder / name)
    return folder


def _edit(path, change):
    obj = json.loads(path.read_text(encoding="utf-8"))
    change(obj)
    path.write_text(json.dumps(obj), encoding="utf-8")


MALFORMED = {
    "missing key": (lambda p: _edit(p, lambda o: o.pop("summary")), "'summary'"),
    "wrong type": (lambda p: _edit(p, lambda o: o.update(tables="a table")), "'tables'"),
    "a number as a cell": (lambda p: _edit(p, lambda o: o["tables"][0]["rows"][0].__setitem__(1, 2002)),
                           "'tables[0].rows[0][1]'"),
    "a short row": (lambda p: _edit(p, lambda o: o["tables"][0]["rows"][0].pop()), "'tables[0].rows[0]'"),
    "a bad date": (lambda p: _edit(p, lambda o: o.update(date="22 Nov 2026")), "'date'"),
    "session words": (lambda p: _edit(p, lambda o: o["notes"].append("To be re-run next session.")), "'notes["),
    "a date in a note": (lambda p: _edit(p, lambda o: o["notes"].append("Run on 2026-11-22.")), "'notes["),
    "an unknown key": (lambda p: _edit(p, lambda o: o.update(sumary="x")), "'sumary'"),
    "not JSON": (lambda p: p.write_text('{"title": "QA", oops}', encoding="utf-8"), "not JSON"),
    "over 1 MiB": (lambda p: p.write_text(json.dumps({"title": "x" * (1 << 20)}), encoding="utf-8"), "1 MiB"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_results_file_stops_the_page_in_one_line_naming_it(tmp_path, capsys, case):
    folder = _copy(tmp_path)
    breaker, expected = MALFORMED[case]
    breaker(folder / "qa.json")
    with pytest.raises(results_page().ResultsError) as err:
        results_page().page(folder)
    message = str(err.value)
    assert "\n" not in message and "qa.json" in message and expected in message, message
    out = tmp_path / "performance.md"
    assert results_page().main(["--results", str(folder), "--out", str(out)]) == 2
    printed = capsys.readouterr().err.strip()
    assert printed.count("\n") == 0 and "qa.json" in printed and not out.exists()


def test_two_sections_answering_to_one_id_are_refused(tmp_path):
    folder = _copy(tmp_path)
    _edit(folder / "heads.json", lambda o: o.update(anchor="qa"))
    with pytest.raises(results_page().ResultsError, match=r"qa\.json: key 'anchor': id 'qa' is already heads\.json's"):
        results_page().page(folder)


def test_out_writes_the_page_and_the_site_hook_generates_it(tmp_path, page):
    out = tmp_path / "performance.md"
    assert results_page().main(["--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == page
    assert generator().performance_page(ROOT) == {"results/performance.md": page}
    assert not (ROOT / "docs" / "results" / "performance.md").exists()  # generated, not kept beside its data
