"""Loading a model folder checks that its files belong together (tokenizer, config.json, weights,
posbias.yaml, posbias_model.json), naming the wrong file in one line; `export` never writes over
anything. Each damaged folder is a copy of a tiny checkpoint built once per module."""
import json
import os
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

import posbias
import posbias.qa.model
import posbias.tagging.model
from posbias.checkpoint import load_checkpoint, save_checkpoint
from posbias.config import RESOURCES, build_config, config_from
from posbias.errors import ConfigError

from helpers import DEMO_DEV, cli_here, tiny_config

DATA = {"qa": DEMO_DEV, "tagging": "demo:wnut-dev"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Untrained posbias checkpoints of both tasks and a Hugging Face BertForQuestionAnswering
    folder, all with the bundled 4994-token vocabulary."""
    from transformers import BertConfig, BertForQuestionAnswering

    from posbias.tasks import get_task

    root = tmp_path_factory.mktemp("folders")
    torch.manual_seed(0)
    for name, cfg, labels in [("qa", build_config(tiny_config(root)), None),
                              ("tagging", config_from("tiny_tagging"), ["O", "B-loc", "I-loc"])]:
        task = get_task(name)
        tok = task.load_tokenizer(cfg)
        if labels is None:
            from posbias.qa.model import build_model

            model = build_model(cfg.model, tok, null_answer=False)
        else:
            from posbias.tagging.model import build_model

            model = build_model(cfg.model, tok, labels, "iob2")
        save_checkpoint(model, cfg, tok, root / name)
    hf = BertForQuestionAnswering(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                                             num_attention_heads=4, intermediate_size=64))
    hf.save_pretrained(str(root / "hf"))
    tok.save_pretrained(str(root / "hf"))
    return root


def copy(folders, name, tmp_path):
    return shutil.copytree(folders / name, tmp_path / f"{name}_copy")


def edit_weights(folder, fn):
    file = folder / "model.safetensors"
    state = load_file(str(file))
    fn(state)
    save_file(state, str(file), metadata={"format": "pt"})


def edit_config(folder, **changes):
    file = folder / "config.json"
    file.write_text(json.dumps({**json.loads(file.read_text(encoding="utf-8")), **changes}), encoding="utf-8")


def embedding_rows(folder, rows):
    """config.json and weights agreeing on an embedding table of `rows` rows (cut or zero-padded)."""
    def resize(state):
        k = next(k for k in state if k.endswith("word_embeddings.weight"))
        w = state[k]
        state[k] = w[:rows].clone() if rows <= len(w) else torch.cat([w, w.new_zeros(rows - len(w), w.shape[1])])
    edit_weights(folder, resize)
    edit_config(folder, vocab_size=rows)


def remove(*names):
    def damage(folder):
        for pattern in names:
            for f in folder.glob(pattern):
                f.unlink()
    return damage


def truncate(folder):
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])


def rewrite(name, text=None, append=None):
    def damage(folder):
        f = folder / name
        f.write_text(text if text is not None else f.read_text(encoding="utf-8") + append, encoding="utf-8")
    return damage


def pop_last_tensor(state):
    state.pop(sorted(state)[-1])


DAMAGES = {
    "no tokenizer": (remove("tokenizer*", "vocab*"), r"no tokenizer files"),
    "truncated weights": (truncate, r"model\.safetensors: not a complete safetensors file"),
    "random weights file": (lambda f: (f / "model.safetensors").write_bytes(os.urandom(4000)),
                            r"model\.safetensors: not a complete safetensors file"),
    "no weights": (remove("model.safetensors"), r"model\.safetensors is missing"),
    "no config.json": (remove("config.json"), r"config\.json is missing"),
    "invalid config.json": (rewrite("config.json", "{"), r"config\.json: "),
    "no posbias_model.json": (remove("posbias_model.json"), r"posbias_model\.json is missing"),
    "invalid posbias_model.json": (rewrite("posbias_model.json", "{"), r"posbias_model\.json: not valid JSON"),
    "invalid posbias.yaml": (rewrite("posbias.yaml", "model: [\n"), r"posbias\.yaml: not valid YAML"),
    "unknown key in posbias.yaml": (rewrite("posbias.yaml", append="\nbogus: 1\n"),
                                    r"posbias\.yaml: unknown config key bogus"),
    "wrong-shape tensor": (lambda f: edit_weights(f, lambda s: s.update({
        "encoder.embeddings.word_embeddings.weight": s["encoder.embeddings.word_embeddings.weight"][:100].clone()})),
        r"model\.safetensors: tensor encoder\.embeddings\.word_embeddings\.weight has shape \[100, 32\]"),
    "missing tensor": (lambda f: edit_weights(f, pop_last_tensor), r"model\.safetensors: has no tensor \S+"),
    "unexpected tensor": (lambda f: edit_weights(f, lambda s: s.update({"extra.bias": torch.zeros(2)})),
                          r"model\.safetensors: tensor extra\.bias does not belong"),
}


def assert_one_line_naming(err: str, folder):
    assert "\n" not in err.strip() and str(folder) in err, err


@pytest.mark.parametrize("task", ["qa", "tagging"])
@pytest.mark.parametrize("damage", list(DAMAGES))
def test_damaged_checkpoint_is_a_named_error(folders, tmp_path, task, damage):
    """Through the API's evaluate (the task lookup, then the load), before any example is read."""
    fn, message = DAMAGES[damage]
    folder = copy(folders, task, tmp_path)
    fn(folder)
    with pytest.raises(ConfigError, match=message) as e:
        posbias.evaluate(folder, DATA[task], progress=False)
    assert_one_line_naming(str(e.value), folder)
    assert "architectures" not in str(e.value)


@pytest.mark.parametrize("task", ["qa", "tagging"])
def test_tokenizer_must_fit_the_embedding_table(folders, tmp_path, task):
    """config.json and the weights agree, but token ids beyond the table would index nothing; a
    table with spare rows (vocabularies padded to a multiple of 8) is fine."""
    small = copy(folders, task, tmp_path)
    embedding_rows(small, 100)
    with pytest.raises(ConfigError, match=r"4994 tokens but the embedding table .* only 100 rows") as e:
        load_checkpoint(small)
    assert_one_line_naming(str(e.value), small)
    padded = shutil.copytree(folders / task, tmp_path / "padded")
    embedding_rows(padded, 5000)
    model, tok, _ = load_checkpoint(padded)
    assert len(tok) == 4994 and model.encoder.get_input_embeddings().weight.shape[0] == 5000


@pytest.mark.parametrize("args", [
    ("evaluate", "qa", "--data", DEMO_DEV),
    ("predict", "tagging", "--text", "Angela Merkel visited Paris ."),
])
def test_cli_model_without_tokenizer_exits_2(folders, tmp_path, args):
    """The issue's report: every word [UNK], F1 0.0, exit 0 — a 5-token fallback vocabulary."""
    folder = copy(folders, args[1], tmp_path)
    remove("tokenizer*")(folder)
    r = cli_here(*args[:2], "--model", str(folder), *args[2:])
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.startswith("posbias: error: ") and "no tokenizer files" in r.stderr
    assert_one_line_naming(r.stderr, folder)


HF_DAMAGES = {
    "no weights": (remove("model.safetensors"), r"model\.safetensors is missing"),
    "truncated weights": (truncate, r"model\.safetensors: not a complete safetensors file"),
    "no tokenizer": (remove("tokenizer*", "vocab*"), r"no tokenizer files"),
    "wrong-shape tensor": (lambda f: edit_weights(f, lambda s: s.update({"qa_outputs.weight": torch.zeros(3, 32)})),
                           r"model\.safetensors: tensor qa_outputs\.weight has shape \[3, 32\]"),
    "tokenizer larger than the embedding table": (lambda f: embedding_rows(f, 100),
                                                  r"4994 tokens but the embedding table .* only 100 rows"),
}


@pytest.mark.parametrize("damage", list(HF_DAMAGES))
def test_damaged_hugging_face_folder_is_a_named_error(folders, tmp_path, damage):
    fn, message = HF_DAMAGES[damage]
    folder = copy(folders, "hf", tmp_path)
    fn(folder)
    with pytest.raises(ConfigError, match=message) as e:
        load_checkpoint(folder)
    assert_one_line_naming(str(e.value), folder)
    assert "architectures" not in str(e.value)


def test_export_refuses_its_source_and_existing_paths(folders, tmp_path):
    ck = copy(folders, "qa", tmp_path)
    before = {f.name: f.read_bytes() for f in ck.iterdir()}
    for out in (ck, ck / "hf", tmp_path / "qa_copy" / ".." / "qa_copy"):
        with pytest.raises(ConfigError, match=re.escape(str(out)) + " is inside the checkpoint"):
            posbias.export(ck, out)
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "keep.txt").write_text("mine", encoding="utf-8")
    with pytest.raises(ConfigError, match="not empty"):
        posbias.export(ck, occupied)
    existing = tmp_path / "model.bin"
    existing.write_bytes(b"mine")
    r = cli_here("export", "--model", str(ck), "--out", str(existing))
    assert r.returncode == 2 and "already exists" in r.stderr, r.stderr[-2000:]
    assert_one_line_naming(r.stderr, existing)
    # Nothing was touched, and the source still loads.
    assert {f.name: f.read_bytes() for f in ck.iterdir()} == before
    assert existing.read_bytes() == b"mine" and [f.name for f in occupied.iterdir()] == ["keep.txt"]
    load_checkpoint(ck)


@pytest.mark.parametrize("task", ["qa", "tagging"])
def test_export_writes_a_new_or_empty_folder_whole(folders, tmp_path, task, monkeypatch):
    from posbias.tasks import get_task

    ck = copy(folders, task, tmp_path)
    task_object = get_task(task)  # export reaches the task's export_hf through the Task protocol
    real = task_object.export_hf

    def fails_halfway(checkpoint, out_dir):  # as save_pretrained does, then the disk fills
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "config.json").write_text("{}", encoding="utf-8")
        raise RuntimeError("disk full")

    monkeypatch.setattr(task_object, "export_hf", fails_halfway)
    with pytest.raises(RuntimeError, match="disk full"):
        posbias.export(ck, tmp_path / "failed")
    assert not [f for f in tmp_path.iterdir() if f.name.startswith("failed")]  # nothing half-written
    monkeypatch.setattr(task_object, "export_hf", real)
    (tmp_path / "empty").mkdir()
    for out in (tmp_path / "empty", tmp_path / "new" / "hf"):
        assert posbias.export(ck, out) == out
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= {f.name for f in out.iterdir()}
        assert not [f for f in out.parent.iterdir() if ".tmp-" in f.name]  # the temporary folder was renamed
        load_checkpoint(out)


@pytest.mark.parametrize("task", ["qa", "tagging"])
@pytest.mark.parametrize("model_type", ["albert", "deberta-v2"])
def test_a_checkpoint_reloads_the_tokenizer_it_was_saved_with(tmp_path, task, model_type):
    """The bundled BERT vocabulary beside an encoder config.json of another model type: the
    reloaded tokenizer is the saved class and encodes as it did, token_type_ids included, so the
    reloaded QA model scores as the saved one. (transformers 5.4-5.5 chose by config.json's
    model_type and gave a generic tokenizer without token_type_ids: a trained ALBERT DyReF scored
    F1 1.9 reloaded against 1.0 when saved.)"""
    import numpy as np

    from posbias.qa.collate import collate
    from posbias.qa.features import build_qa_features
    from posbias.qa.readers import read_qa
    from posbias.tasks import get_task

    encoder = {"model_type": model_type, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
               "intermediate_size": 64, "max_position_embeddings": 512, "type_vocab_size": 2}
    if task == "qa":
        cfg = build_config(tiny_config(tmp_path, model={"encoder": encoder}))
        tok = get_task(task).load_tokenizer(cfg)
        model = posbias.qa.model.build_model(cfg.model, tok, null_answer=False)
    else:
        cfg = config_from("tiny_tagging", [f"model.encoder.model_type={model_type}"])
        tok = get_task(task).load_tokenizer(cfg)
        model = posbias.tagging.model.build_model(cfg.model, tok, ["O", "B-loc", "I-loc"], "iob2")
    save_checkpoint(model, cfg, tok, tmp_path / "ck")
    again, tok2, _ = load_checkpoint(tmp_path / "ck", task=task)
    assert type(tok2) is type(tok)
    pair = ("Where is the book?", "It is on the desk, next to Marie's café.")
    assert dict(tok2(*pair)) == dict(tok(*pair)) and "token_type_ids" in tok2(*pair)
    if task == "qa":
        examples = read_qa(DEMO_DEV).examples[:4]
        logits = []
        for net, t in ((model, tok), (again, tok2)):
            feats = build_qa_features(examples, t, max_seq_len=128, stride=48, max_query_len=64, train=False,
                                      version=1)
            batch = collate(feats, np.arange(4), pad_id=0, with_labels=False)
            with torch.no_grad():  # the context tokens' scores (the rest are masked to the float minimum)
                logits.append(net.eval()(batch)["start_logits"][batch["span_mask"].bool()])
        scale = float(logits[0].abs().max())
        torch.testing.assert_close(logits[1], logits[0], rtol=1e-5, atol=1e-5 * scale)
