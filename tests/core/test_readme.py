"""Every Python snippet in README.md runs as written, with tiny stand-ins for what is heavy or remote:
the SUBSTITUTIONS below (a Hub model id -> a tiny local BERT folder, the MiniLM `demo` and `quickstart`
presets -> the `tiny` one, step counts), and STAND_INS, the names a snippet leaves to the reader (your tokenized
data sets). A snippet that fails as written fails here."""
import re
import warnings
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
CONLL_LABELS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]


def test_readme_has_python_snippets():
    assert len(BLOCKS) >= 2


@pytest.fixture(scope="module")
def tiny_bert(tiny_bert_folder):
    return tiny_bert_folder


def _stand_ins(tiny_bert):
    """Tokenized NER data sets, as the reader's own script would have them."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_bert)
    rows = []
    for words, tags in [(["Ana", "went", "to", "Oslo"], ["B-PER", "O", "O", "B-LOC"]),
                        (["Bo", "Berg", "works", "at", "Acme"], ["B-PER", "I-PER", "O", "O", "B-ORG"])] * 4:
        enc = tok(words, is_split_into_words=True)
        prev, labels = None, []
        for w in enc.word_ids():
            labels.append(-100 if w is None or w == prev else CONLL_LABELS.index(tags[w]))
            prev = w
        rows.append({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "labels": labels})
    return {"train_dataset": Dataset.from_list(rows), "eval_dataset": Dataset.from_list(rows[:4])}


@pytest.mark.parametrize("i", range(len(BLOCKS)))
def test_readme_python_snippet_runs(i, tiny_bert, tmp_path, monkeypatch):
    conll = tmp_path / "test.conll"
    sentences = [["Ana B-PER", "went O", "to O", "Oslo B-LOC"][:n] + ["today O"] * (n % 3) for n in range(1, 9)]
    conll.write_text("\n\n".join("\n".join(s) for s in sentences) + "\n", encoding="utf-8")  # D*: the middle lengths
    substitutions = {'"bert-base-cased"': repr(tiny_bert), '"test.conll"': repr(str(conll)),
                     'posbias.train("demo"': 'posbias.train("tiny"',
                     'posbias.train("quickstart"': 'posbias.train("tiny"', "max_steps=1000": "max_steps=2",
                     "train.max_steps=50": "train.max_steps=2"}
    code = BLOCKS[i]
    for a, b in substitutions.items():
        code = code.replace(a, b)
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": f"readme_block_{i}"}
    if "train_dataset" in code:
        namespace.update(_stand_ins(tiny_bert))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(code, f"README.md python block {i + 1}", "exec"), namespace)
    if "trainer.evaluate()" in code:
        assert {"eval_f1_alpha_1", "eval_f1_alpha_10"} <= set(namespace["metrics"])
