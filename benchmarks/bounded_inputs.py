"""What the bounded readers of issue 44 cost on real files, against the plain reads they replaced.

Data: `posbias.records.read_text` (size check, device refusal, streamed gunzip with a size cap and
a bomb-ratio check) against `gzip.decompress(path.read_bytes()).decode()`, on SQuAD v1.1 dev, a
part of the rebuilt SQuAD train set, MRQA SQuAD dev and CoNLL-2003 test (../shared/data). YAML:
`posbias.config.yaml_safe_load` (size check, node count after alias expansion, depth) against the
same loader without the checks, on every bundled preset. JSON: `posbias.limits.load_json` against
`json.loads(path.read_text())` on the bundled tiny tokenizer's tokenizer.json (a model file).
Medians over `--repeats` runs; the ratio is bounded / plain, measured in the same process.

    python benchmarks/bounded_inputs.py [--repeats 7]
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import re
import statistics
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
FILES = ["squad_v1.1/dev-v1.1.json.gz", "squad_v1.1_train_reconstructed/train-v1.1-reconstructed.part1of3.json.gz",
         "mrqa_dev/SQuAD.jsonl.gz", "conll2003/test.txt"]


def median_seconds(fn, repeats: int) -> float:
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def plain_text(path: Path) -> str:
    raw = path.read_bytes()
    return (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode("utf-8")


def yaml12_loader():
    """The loader `posbias.config.yaml_safe_load` builds on, without its checks: PyYAML's SafeLoader
    with YAML 1.2's booleans (true/false only). A copy of the package's few lines, kept here so that
    the benchmark uses the package's public API only."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                 list("tTfF"))
    return Loader


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()

    import yaml

    from posbias.config import yaml_safe_load
    from posbias.limits import load_json
    from posbias.records import read_text

    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((line.split(":", 1)[1].strip() for line in cpu.splitlines() if line.startswith("Model name")),
                 platform.processor())
    print(f"CPU: {model}; {os.cpu_count()} cores; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}; "
          f"repeats {args.repeats}\n")
    print("| input | size on disk | plain read (ms) | bounded read (ms) | ratio |")
    print("|---|---:|---:|---:|---:|")
    for name in FILES:
        path = DATA / name
        if not path.is_file():
            print(f"| {name} | missing | | | |")
            continue
        assert read_text(path) == plain_text(path)  # the same text, or the comparison means nothing
        plain = median_seconds(lambda: plain_text(path), args.repeats)
        bounded = median_seconds(lambda: read_text(path), args.repeats)
        print(f"| {name} | {path.stat().st_size / 2**20:.1f} MiB | {plain * 1e3:.1f} | {bounded * 1e3:.1f} "
              f"| {bounded / plain:.2f} |")

    presets = sorted((ROOT / "posbias" / "configs").rglob("*.yaml"))
    texts = [p.read_text(encoding="utf-8") for p in presets]
    loader_class = yaml12_loader()

    def plain_yaml():
        for text in texts:
            loader = loader_class(text)
            try:
                loader.get_single_data()
            finally:
                loader.dispose()

    assert [yaml_safe_load(t) for t in texts] == [yaml.load(t, Loader=loader_class) for t in texts]
    plain = median_seconds(plain_yaml, args.repeats)
    bounded = median_seconds(lambda: [yaml_safe_load(t) for t in texts], args.repeats)
    print(f"| {len(presets)} bundled YAML presets | {sum(map(len, texts)) / 1024:.0f} KiB | {plain * 1e3:.1f} "
          f"| {bounded * 1e3:.1f} | {bounded / plain:.2f} |")

    tok = ROOT / "posbias" / "resources" / "tiny_tokenizer" / "tokenizer.json"
    plain = median_seconds(lambda: json.loads(tok.read_text(encoding="utf-8")), args.repeats)
    bounded = median_seconds(lambda: load_json(tok, "tokenizer"), args.repeats)
    print(f"| {tok.relative_to(ROOT)} | {tok.stat().st_size / 2**20:.2f} MiB | {plain * 1e3:.1f} "
          f"| {bounded * 1e3:.1f} | {bounded / plain:.2f} |")


if __name__ == "__main__":
    main()
