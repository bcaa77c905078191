"""Build the bundled tagging slices (run once; outputs are committed).

Writes into posbias/resources/tagging_demo/ (licenses allow it; CoNLL-2003 and TweeBank do not, so
they are never bundled):
  ewt-train.conllu.gz / ewt-dev.conllu.gz   the first 400 / 150 sentences of UD English EWT r2.16
                                            train / dev, unchanged (CC BY-SA 4.0)
  wnut-train.conll.gz / wnut-dev.conll.gz   the first 400 / 150 sentences of WNUT-17 train / dev,
                                            lines unchanged, sentences separated by empty lines
                                            (CC BY 4.0)

Usage: python scripts/make_tagging_demo.py [--shared ../shared/data]
"""
import argparse
import gzip
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "posbias" / "resources" / "tagging_demo"


def read(path: Path) -> str:
    raw = path.read_bytes()
    return (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode("utf-8")


def first_sentences(text: str, n: int) -> str:
    """The first n sentences (blocks between whitespace-only lines: WNUT-17's train file separates
    them with a lone tab), lines unchanged, separated by empty lines."""
    blocks, cur = [], []
    for line in text.replace("\r\n", "\n").split("\n"):
        if line.strip():
            cur.append(line)
        elif cur:
            blocks.append("\n".join(cur))
            cur = []
    if cur:
        blocks.append("\n".join(cur))
    return "\n\n".join(blocks[:n]) + "\n\n"


def write(text: str, name: str) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / name, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
        f.write(text.encode("utf-8"))  # mtime=0: reproducible bytes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    shared = Path(ap.parse_args().shared)
    ewt, wnut = shared / "ud_english_ewt", shared / "wnut17"
    write(first_sentences(read(ewt / "en_ewt-ud-train.conllu.gz"), 400), "ewt-train.conllu.gz")
    write(first_sentences(read(ewt / "en_ewt-ud-dev.conllu.gz"), 150), "ewt-dev.conllu.gz")
    write(first_sentences(read(wnut / "wnut17train.conll"), 400), "wnut-train.conll.gz")
    write(first_sentences(read(wnut / "emerging.dev.conll"), 150), "wnut-dev.conll.gz")


if __name__ == "__main__":
    main()
