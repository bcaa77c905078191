"""How reports read: warnings as warnings above the tables, figures in a legible grid, bundled data
named by its alias (`posbias.render`), and the QA note's bucket bounds from the model's own window."""
import struct
import zlib

import pytest

from posbias.config import RESOURCES, resolve_path
from posbias.render import Document, data_label


def png(path, width: int, height: int = 4):
    """A valid grey PNG of the given size."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\0" + b"\x80" * width for _ in range(height))
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
    return path


def test_a_bundled_data_set_is_named_by_its_alias():
    assert data_label("demo:dev") == "demo:dev"
    assert data_label(resolve_path("demo:wnut-dev")) == "demo:wnut-dev"
    assert data_label(RESOURCES / "squad_demo" / "train.json.gz") == "demo:train"
    assert data_label("my/dev.json") == "my/dev.json"
    assert data_label([resolve_path("demo:train"), "x.json"]) == "demo:train, x.json"


def test_a_warning_is_a_blockquote_led_by_a_bold_warning():
    doc = Document("t")
    doc.warning("Warning: overall F1 3.0 is below the quality floor of 20")
    doc.table(["a"], [["1"]])
    md = doc.markdown()
    assert "> **Warning:** overall F1 3.0 is below the quality floor of 20\n" in md
    assert md.index("> **Warning:**") < md.index("| a |")
    page = doc.html()
    assert "<blockquote class='warning'><b>Warning:</b> overall F1 3.0" in page and "blockquote.warning{" in page


def test_figures_sit_in_a_grid_and_a_wide_one_takes_a_row(tmp_path):
    doc = Document("t")
    doc.figures([("panels", png(tmp_path / "wide.png", 1144)), ("one", png(tmp_path / "a.png", 770)),
                 ("two", png(tmp_path / "b.png", 770))])
    page = doc.html()
    assert page.count("<div class='figures'>") == 1 and page.count("<figure") == 3
    assert "<figure class='wide'><img alt='panels'" in page and "<figure><img alt='one'" in page
    assert "grid-template-columns" in page
    assert [line for line in doc.markdown().splitlines() if line.startswith("![")] == [
        "![panels](wide.png)", "![one](a.png)", "![two](b.png)"]


@pytest.mark.parametrize("max_seq_len, q1", [(128, "Q1 [0,32) = tokens 0..31"), (384, "Q1 [0,96) = tokens 0..95")])
def test_the_qa_note_names_the_models_own_first_quarter(max_seq_len, q1):
    from posbias.qa.diagnose import _bias_block

    bias = {"sentence": "s", "axes": {}, "quality": None, "min_size": 30, "samples": 0}
    notes = _bias_block(bias, max_seq_len)[3]
    assert q1 in notes[-1] and f"{max_seq_len}-token input window" in notes[-1]
