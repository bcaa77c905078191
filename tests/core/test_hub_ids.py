"""Models named by Hugging Face Hub id (offline path: a prepared cache, no network), and importing
posbias leaves the process's environment alone."""
import json
import os
import subprocess
import sys

import pytest
import torch
from transformers import AutoTokenizer, BertConfig, BertForQuestionAnswering, BertModel

from posbias.config import RESOURCES

from helpers import BIN, DEMO_DEV


def _cache_entry(cache, repo_id: str, save) -> str:
    """A Hub cache holding `repo_id` at one commit, as huggingface_hub lays it out after a download."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    save(str(snap))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit, encoding="utf-8")
    return str(snap)


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("hub")
    tok = AutoTokenizer.from_pretrained(str(RESOURCES / "tiny_tokenizer"))
    small = dict(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    torch.manual_seed(0)

    def encoder(path):
        BertModel(BertConfig(**small)).save_pretrained(path)
        tok.save_pretrained(path)

    def qa_model(path):
        BertForQuestionAnswering(BertConfig(**small, architectures=["BertForQuestionAnswering"])).save_pretrained(path)
        tok.save_pretrained(path)

    _cache_entry(cache, "testorg/tiny-bert", encoder)
    _cache_entry(cache, "testorg/tiny-qa", qa_model)
    return cache


def _cli(cache, *args):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}
    return subprocess.run([str(BIN / "posbias"), *args], capture_output=True, text=True, env=env, timeout=300)


def test_train_from_a_hub_id_in_the_cache(hub_cache, tmp_path):
    r = _cli(hub_cache, "train", "qa", "-c", "tiny", "model.name_or_path=testorg/tiny-bert", "model.encoder=null",
             "model.tokenizer=null", f"train.output_dir={tmp_path / 'run'}", "train.max_steps=1",
             "data.max_eval_examples=4")
    assert r.returncode == 0, r.stderr
    cfg = json.loads(json.dumps(__import__("yaml").safe_load((tmp_path / "run" / "config.yaml").read_text())))
    assert cfg["model"]["name_or_path"] == "testorg/tiny-bert"


def test_evaluate_a_hub_id_model(hub_cache, tmp_path):
    r = _cli(hub_cache, "evaluate", "qa", "--model", "testorg/tiny-qa", "--data", DEMO_DEV,
             "--output-dir", str(tmp_path / "ev"), "data.max_eval_examples=8")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "ev" / "metrics.json").read_text(encoding="utf-8"))["total"] == 8


def test_an_uncached_hub_id_offline_is_one_line(hub_cache, tmp_path):
    r = _cli(hub_cache, "evaluate", "qa", "--model", "testorg/not-there", "--data", DEMO_DEV)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "'testorg/not-there' is not a local folder, and the Hugging Face Hub cannot be reached" in r.stderr
    r = _cli(hub_cache, "evaluate", "qa", "--model", str(tmp_path / "missing" / "folder"), "--data", DEMO_DEV)
    assert r.returncode == 2 and "is not a model folder" in r.stderr, r.stderr


def test_importing_posbias_changes_no_environment_or_logging():
    code = ("import os, logging; before = dict(os.environ); level = logging.getLogger().level\n"
            "import posbias, posbias.api, posbias.cli, posbias.hf, posbias.encoders, posbias.training\n"
            "from transformers.utils import logging as hf; v = hf.get_verbosity()\n"
            "changed = sorted(k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k))\n"
            "print(changed, logging.getLogger().level == level)")
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.strip() == "[] True", out.stdout + out.stderr


def test_shared_paths_from_an_installed_package(monkeypatch, tmp_path):
    import posbias.config as config
    from posbias.errors import ConfigError

    monkeypatch.delenv("POSBIAS_SHARED_DATA", raising=False)
    monkeypatch.setattr(config, "PACKAGE_DIR", tmp_path / "site-packages" / "posbias")  # no pyproject beside it
    with pytest.raises(ConfigError, match="shared:conll2003/test.txt: set POSBIAS_SHARED_DATA"):
        config.resolve_path("shared:conll2003/test.txt")
    (tmp_path / "data" / "conll2003").mkdir(parents=True)
    (tmp_path / "data" / "conll2003" / "test.txt").write_text("x O\n", encoding="utf-8")
    monkeypatch.setenv("POSBIAS_SHARED_DATA", str(tmp_path / "data"))
    assert config.resolve_path("shared:conll2003/test.txt") == str(tmp_path / "data" / "conll2003" / "test.txt")
