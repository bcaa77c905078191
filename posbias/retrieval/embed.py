"""Sentence embeddings of queries and passages, for any embedding model a retrieval user has.

- A sentence-transformers folder (`modules.json`): encoded by sentence-transformers itself, so the
  model's own pooling, normalisation, dense layers and query/document prompts apply
  (`encode_query` / `encode_document`). Only sentence-transformers' own module types are accepted:
  a folder naming other module code, or module files outside itself, is refused before
  sentence-transformers reads it (posbias never runs a folder's code).
- A plain Hugging Face encoder folder (`config.json`, no `modules.json`): mean pooling of the last
  hidden states over the attention mask, L2-normalised (cosine similarity), stated in the report.
- `minilm` (the bundled MiniLM, a sentence-transformers folder) or a Hub id in the local cache.

Texts are encoded in batches of similar length (sorted by length: little padding), under bf16
autocast where the hardware computes bf16 natively (`posbias.precision`, `auto`), and cached per
model, settings and texts as safetensors (`cache_dir`), so a second diagnosis of the same model and
data reads them back.
"""
from __future__ import annotations

import hashlib
import json
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path, PureWindowsPath

import numpy as np
from tqdm.auto import tqdm

from .. import devices
from ..config import resolve_path
from ..encoders import check_weights_file, local_dir, quiet_transformers
from ..diagnoses import check_cache_dir  # noqa: F401  (re-exported: the embeddings' cache folder)
from ..errors import ConfigError
from ..precision import Precision, autocast, resolve_precision
from ..utils import atomic_write_bytes, interactive

ST_PREFIX = "sentence_transformers."


@dataclass
class Embedder:
    """A loaded embedding model. `kind` says how it pools; `similarity` is cosine or dot."""

    source: str
    folder: str
    kind: str
    model: object
    tokenizer: object
    max_length: int
    similarity: str
    device: object
    precision: Precision
    fingerprint: str

    def count_tokens(self, text: str) -> int:
        """Tokens of `text` without special tokens, untruncated."""
        return len(self.tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])

    @property
    def specials(self) -> int:
        """Special tokens the tokenizer adds around one text ([CLS] ... [SEP]: 2)."""
        return len(self.tokenizer("a", add_special_tokens=True)["input_ids"]) - len(
            self.tokenizer("a", add_special_tokens=False, verbose=False)["input_ids"])

    def describe(self) -> dict:
        return {"model": self.source, "folder": self.folder, "kind": self.kind, "max_length": self.max_length,
                "similarity": self.similarity, "device": str(self.device), "precision": self.precision.to_dict(),
                "fingerprint": self.fingerprint}

    def encode(self, texts: list[str], role: str, *, batch_size: int = 64, cache_dir=None,
               progress: bool = False) -> np.ndarray:
        """(n, d) float32 embeddings of `texts` as `role` ("query" or "document"); normalised when the
        similarity is cosine, so that a dot product scores them either way. `progress`: a bar on a
        terminal, one line in a log."""
        if role not in ("query", "document"):
            raise ValueError(f"role must be query or document, got {role!r}")
        file = None
        if cache_dir is not None:
            check_cache_dir(cache_dir)  # before the embedding, not when its result is written
            key = hashlib.sha256(json.dumps([self.fingerprint, self.kind, self.max_length, self.precision.name,
                                             role], sort_keys=True).encode())
            for t in texts:
                key.update(t.encode("utf-8", "surrogatepass") + b"\0")
            file = Path(cache_dir) / f"{key.hexdigest()[:32]}.safetensors"
            if file.is_file():
                cached = _read_cache(file, len(texts))
                if cached is not None:
                    return cached
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        order = np.argsort([-len(t) for t in texts], kind="stable")  # longest first: a memory error shows early
        out = None
        if progress and not interactive():
            print(f"posbias: embedding {len(texts):,} {role} texts", file=sys.stderr, flush=True)
        with autocast(self.device, self.precision):
            for lo in tqdm(range(0, len(texts), batch_size), desc=f"embed {role}s", leave=False,
                           disable=not (progress and interactive())):
                idx = order[lo:lo + batch_size]
                emb = self._batch([texts[i] for i in idx], role, batch_size)
                if out is None:
                    out = np.empty((len(texts), emb.shape[1]), dtype=np.float32)
                out[idx] = emb
        if self.similarity == "cosine":
            out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        if file is not None:
            _write_cache(file, out)
        return out

    def _batch(self, texts: list[str], role: str, batch_size: int) -> np.ndarray:
        import torch

        if self.kind == "sentence-transformers":
            fn = getattr(self.model, f"encode_{role}", None) or self.model.encode  # its prompts, if it has them
            emb = fn(texts, batch_size=batch_size, convert_to_numpy=False, convert_to_tensor=True,
                     show_progress_bar=False)
            return self._finite(emb.float(), role).cpu().numpy()
        enc = self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt")
        enc = {k: v.to(self.device) for k, v in enc.items()}
        with torch.inference_mode():
            hidden = self.model(**enc).last_hidden_state.float()  # (b, s, d)
        mask = enc["attention_mask"].unsqueeze(-1).float()  # (b, s, 1)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)  # mean pooling (b, d)
        return self._finite(pooled, role).cpu().numpy()

    def _finite(self, emb, role: str):
        """`emb` (b, d), refused in one line when it holds NaN or inf: such embeddings rank every
        passage at once (NaN compares false), and NDCG@10 came out as 170 for a model of NaN weights.
        Checked per batch on the device, before anything is cached."""
        import torch

        if not bool(torch.isfinite(emb).all()):
            why = "its weights hold NaN/inf"
            if self.precision.name in ("bf16", "fp16"):
                why += f", or {self.precision.name} overflows: try --precision fp32"
            raise ConfigError(f"{self.source}: the model's {role} embeddings are NaN or infinite ({why}); "
                              "posbias does not rank by them")
        return emb


def _read_cache(file: Path, n: int) -> np.ndarray | None:
    from safetensors.numpy import load_file

    try:
        arr = load_file(str(file))["embeddings"]
    except Exception:  # noqa: BLE001 - a damaged cache entry is recomputed, not fatal
        return None
    if arr.ndim != 2 or arr.shape[0] != n or not np.isfinite(arr).all():
        # Not what `encode` writes (it refuses NaN/inf before caching): a damaged or edited entry,
        # recomputed from the model and overwritten like any other damaged one.
        return None
    return arr.astype(np.float32)


def _write_cache(file: Path, arr: np.ndarray) -> None:
    from safetensors.numpy import save

    file.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(file, save({"embeddings": np.ascontiguousarray(arr, dtype=np.float32)}))


def _fingerprint(folder: str) -> str:
    """What identifies a model's weights cheaply: its config files and the weights' size and header."""
    h = hashlib.sha256()
    for name in ("config.json", "modules.json", "sentence_bert_config.json", "1_Pooling/config.json",
                 "config_sentence_transformers.json", "tokenizer.json"):
        f = Path(folder) / name
        if f.is_file():
            h.update(name.encode() + f.read_bytes())
    for f in sorted(Path(folder).glob("*.safetensors")):
        with open(f, "rb") as fh:
            h.update(f.name.encode() + str(f.stat().st_size).encode() + fh.read(1 << 20))
    return h.hexdigest()[:16]


def check_st_modules(folder: str) -> list[dict]:
    """modules.json's modules, refused in one line when one is not sentence-transformers' own (`st_module`)
    or its files lie outside the folder (`module_path`), before sentence-transformers reads any of them."""
    from ..limits import load_json

    file = Path(folder) / "modules.json"
    mods = load_json(file, "model file")
    if not isinstance(mods, list) or not all(isinstance(m, dict) for m in mods):
        raise ConfigError(f"{file}: not a list of modules")
    for m in mods:
        name = m.get("name")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{file}: a module's name must be a string, got {name!r}")
        kind = m.get("type")
        if not st_module(kind):
            raise ConfigError(f"{file}: module {name!r} is {kind!r}, code outside sentence-transformers' own modules "
                              f"({ST_PREFIX}models.{'/'.join(sorted(ST_MODULES))}); posbias does not run a model "
                              "folder's code")
        if not module_path(folder, m.get("path")):
            raise ConfigError(f"{file}: module {name!r} has the path {m.get('path')!r}, not a folder inside "
                              f"{folder}; posbias reads a model's files from its own folder only")
    return mods


# sentence-transformers' own module classes (`sentence_transformers.models`, 2.x to 6.x; its base
# classes Module and InputModule are not modules of a model).
ST_MODULES = frozenset({"Asym", "BoW", "CLIPModel", "CNN", "Dense", "Dropout", "LayerNorm", "LSTM", "Normalize",
                        "Pooling", "Router", "StaticEmbedding", "Transformer", "WeightedLayerPooling",
                        "WordEmbeddings", "WordWeights"})


ST_PACKAGES = {("models",), ("base", "modules"), ("sentence_transformer", "modules")}
"""Where sentence-transformers keeps those classes (`models`: 2.x to 5.x, and 6.x's alias of the others)."""


def st_module(kind) -> bool:
    """Whether a modules.json `type` names one of `ST_MODULES` in one of `ST_PACKAGES`, as each version
    writes it: `sentence_transformers.models.Pooling` (2.x to 5.x) or
    `sentence_transformers.sentence_transformer.modules.pooling.Pooling` (6.x, with its file's module).
    Dotted Python names only: `sentence_transformers.models..evil.X` would make it import elsewhere."""
    if not isinstance(kind, str) or not kind.startswith(ST_PREFIX):
        return False
    parts = kind.split(".")
    if not all(p.isidentifier() and p.isascii() for p in parts) or parts[-1] not in ST_MODULES:
        return False
    inner = tuple(parts[1:-1])
    return inner in ST_PACKAGES or (len(inner) > 1 and inner[:-1] in ST_PACKAGES)


def module_path(folder: str, path) -> bool:
    """Whether a modules.json `path` names the folder itself ("") or a folder inside it: relative in
    POSIX and Windows syntax, no `..`, and inside it once symbolic links are followed."""
    if not isinstance(path, str) or "\0" in path:
        return False
    win = PureWindowsPath(path)
    if win.anchor or ".." in win.parts or Path(path).is_absolute():
        return False
    root = Path(folder).resolve()
    return (root / path).resolve().is_relative_to(root)


def load_embedder(spec: str, *, device: str = "auto", precision: str = "auto", max_length: int | None = None,
                  key: str = "--model") -> Embedder:
    """An embedding model from a folder, `minilm` or a cached Hub id (module docstring)."""
    if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 8):
        raise ConfigError(f"max_length must be an integer >= 8, got {max_length!r}")
    folder = local_dir(resolve_path(spec) if spec == "minilm" else str(spec), key)
    dev = devices.resolve_device(device, "--device")
    prec = resolve_precision(precision, dev, "--precision")
    if prec.name == "fp16" and dev.type == "cpu":
        raise ConfigError("--precision fp16 needs a GPU; use auto, bf16 or fp32 on a CPU")
    has_weights = any(Path(folder).glob("*.safetensors")) or any(Path(folder).glob("*.bin"))
    if (Path(folder) / "modules.json").is_file():
        check_st_modules(folder)
        if has_weights:
            check_weights_file(folder)
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise ConfigError(f"{key}: {folder} is a sentence-transformers folder; pip install sentence-transformers "
                              "to encode it with its own pooling") from None
        # transformers' per-load report table and progress bar silenced for this load only (as every
        # posbias load: `quiet_transformers`); the logging state is restored after it.
        with warnings.catch_warnings(), quiet_transformers():
            warnings.simplefilter("ignore")
            try:
                model = SentenceTransformer(folder, device=str(dev), local_files_only=True, trust_remote_code=False)
            except ImportError as e:  # a module `check_st_modules` let through that this version lacks
                raise ConfigError(f"{key}: {folder}: sentence-transformers cannot import a module its modules.json "
                                  f"names ({' '.join(str(e).split())[:200]})") from None
        if max_length is not None:
            model.max_seq_length = max_length
        model.eval()
        sim = str(getattr(model, "similarity_fn_name", None) or "cosine")
        if sim not in ("cosine", "dot"):
            raise ConfigError(f"{key}: {folder} scores with {sim!r} similarity; posbias ranks by cosine or dot product")
        return Embedder(str(spec), folder, "sentence-transformers", model, model.tokenizer, int(model.max_seq_length),
                        sim, dev, prec, _fingerprint(folder))
    from transformers import AutoModel

    from ..encoders import from_pretrained_quietly, open_tokenizer

    tokenizer = open_tokenizer(folder)
    model = from_pretrained_quietly(AutoModel, folder, key).to(dev).eval()
    limit = getattr(model.config, "max_position_embeddings", None) or 512
    length = max_length or min(int(limit), int(getattr(tokenizer, "model_max_length", limit) or limit), 512)
    return Embedder(str(spec), folder, "mean pooling (plain encoder, L2-normalised)", model, tokenizer, length,
                    "cosine", dev, prec, _fingerprint(folder))
