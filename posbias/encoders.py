"""Encoders and tokenizers, shared by every task: any local Hugging Face checkpoint (or one built
from a config), loaded offline and quietly, plus the position-id numbering every task model uses.

Shape legend: b batch, s sequence, d hidden.
"""
from __future__ import annotations

import contextlib
import inspect
import pickle
import re
import warnings
from pathlib import Path

import numpy as np
import torch

from .config import ModelConfig, resolve_path
from .errors import ConfigError
from .limits import load_json
from .position_kind import PositionKind, position_kind  # noqa: F401  (re-exported: the encoders' view)

from .relative_position import (DISTANCE_WEIGHT, RELATIVE_KINDS,  # noqa: E402  (provided there)
                                apply_relative_positions, load_distance_embeddings, relative_kind)

# Every from_pretrained below reads a local folder: a model given by Hub id is first brought into
# the Hugging Face cache by `local_dir` (online or offline, as the user's environment says), which
# also refuses a folder that needs its own Python code (`check_model_folder`). Every load passes
# trust_remote_code=False besides: without it transformers asks on stdin, where a piped "y" runs
# the folder's code.


@contextlib.contextmanager
def quiet_transformers():
    """Silence transformers' per-load report table and "Loading weights" bar.

    transformers 5 prints both for every `from_pretrained`, e.g. a table flagging the pooler that
    posbias drops on purpose; `load_encoder` reports the weights that really matter (missing ones).
    """
    from transformers.utils import logging as hf_logging

    level, bar = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bar:
            hf_logging.enable_progress_bar()


def from_pretrained_quietly(auto_cls, path: str, key: str, **kwargs):
    """`auto_cls.from_pretrained` from a local folder, quietly; weights the folder lacks (other than a
    pooler posbias never uses) are named in one warning instead of transformers' report table. A
    transformers 4.x relative-position folder becomes a posbias relative model (`relative_from_4x`)."""
    check_weights_file(path)
    try:
        with warnings.catch_warnings(), quiet_transformers():
            warnings.simplefilter("ignore")
            model, info = auto_cls.from_pretrained(path, local_files_only=True, output_loading_info=True,
                                                   trust_remote_code=False, **kwargs)
    except RuntimeError as e:  # weights of other shapes than config.json describes (the report is silenced)
        why = shape_mismatch(auto_cls, path, **kwargs) or " ".join(str(e).split())
        raise ConfigError(f"{key}: {Path(path) / WEIGHTS}: {why}") from None
    except pickle.UnpicklingError:  # torch.load(weights_only=True) met an object that is not a tensor
        name = next((f for f in OTHER_WEIGHTS if f.endswith(".bin") and (Path(path) / f).is_file()), OTHER_WEIGHTS[1])
        raise ConfigError(f"{key}: {Path(path) / name}: refused to load: the pickle holds objects other than "
                          "tensors, which could run code; where the folder is trusted, convert it to "
                          f"{WEIGHTS} (transformers: save_pretrained)") from None
    missing = sorted(k for k in info.get("missing_keys", ()) if "pooler" not in k)
    missing += relative_from_4x(model, path, key, info)
    if missing:  # not (all of) a trained model: say so, once
        warnings.warn(f"{key}: {len(missing)} weight(s) are not in {path} and start random: "
                      f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}", stacklevel=3)
    return model


def relative_from_4x(model, path: str, key: str, info: dict) -> list[str]:
    """Make a loaded transformers 4.x relative-position folder the relative model it was trained as.

    Such a folder (the token-positional-bias paper's BERT_key / BERT_key-query) has config.json
    `position_embedding_type: relative_key` (or `relative_key_query`) and its weights hold
    `...attention.self.distance_embedding.weight`. transformers 5 has no such attention: it builds an
    absolute-position model and drops the tables without a word. Here the model's base encoder is
    switched to posbias's relative attention (`apply_relative_positions`, 4.x's formula) and the
    folder's tables are copied in; its unused absolute table is discarded, as 4.x ignored it.

    Returns the names of distance tables the folder lacks (they start random; the caller warns).
    Raises a ConfigError naming the folder when its weights hold distance tables but its config.json
    does not say relative: loading those as absolute would silently be another model.
    """
    kind = relative_kind(model.config)
    if kind is None:
        tables = sorted(k for k in info.get("unexpected_keys", ()) if k.endswith(DISTANCE_WEIGHT))
        if tables:
            said = getattr(model.config, "position_embedding_type", None)
            raise ConfigError(f"{key}: {path}: the weights hold relative position tables ({tables[0]}, ...) but "
                              f"config.json says position_embedding_type {said!r}; set it to the relative_key or "
                              "relative_key_query the model was trained with")
        return []
    apply_relative_positions(getattr(model, "base_model", model), kind, key)
    tensors, source = weight_tensors(path, lambda name: name.endswith(DISTANCE_WEIGHT))
    return load_distance_embeddings(model, tensors, source)


def weight_tensors(path: str, keep) -> tuple[dict[str, torch.Tensor], str]:
    """(name -> tensor for the names `keep` accepts, the file(s) read) from a model folder's weights,
    in transformers' order of preference: model.safetensors, its sharded index, pytorch_model.bin,
    its sharded index. safetensors files are read tensor by tensor; .bin files whole (weights only)."""
    from safetensors import safe_open

    folder = Path(path)
    name = next((f for f in (WEIGHTS, *OTHER_WEIGHTS) if (folder / f).is_file()), None)
    if name is None:
        return {}, str(folder / WEIGHTS)
    if name.endswith(".index.json"):
        weight_map = load_json(folder / name, "weights index").get("weight_map", {})
        files = sorted({f for k, f in weight_map.items() if keep(k)})
    else:
        files = [name]
    out = {}
    for f in files:
        if f.endswith(".safetensors"):
            with safe_open(str(folder / f), framework="pt") as st:
                out.update({k: st.get_tensor(k) for k in st.keys() if keep(k)})
        else:
            state = torch.load(str(folder / f), map_location="cpu", weights_only=True)
            out.update({k: v for k, v in state.items() if keep(k)})
    return out, str(folder / (files[0] if len(files) == 1 else name))


WEIGHTS = "model.safetensors"
# Other weight files transformers reads; the shapes of these are left to it.
OTHER_WEIGHTS = ("model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def weight_shapes(file) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor in a safetensors file, from its header alone (no weights are
    read); a truncated or foreign file is an error naming it."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(file), framework="pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except (SafetensorError, OSError) as e:
        raise ConfigError(f"{file}: not a complete safetensors file ({' '.join(str(e).split())}); "
                          "it is truncated or was not written by safetensors") from None


def check_weights_file(path: str) -> None:
    """A Hugging Face model folder must hold its weights: a readable model.safetensors (or another
    file transformers reads)."""
    folder = Path(path)
    if (folder / WEIGHTS).is_file():
        weight_shapes(folder / WEIGHTS)
    elif not any((folder / f).is_file() for f in OTHER_WEIGHTS):
        raise ConfigError(f"{folder / WEIGHTS} is missing: {path} has a config.json but no weights")


def first_shape_error(want: dict, have: dict, file, described_by: str = "config.json") -> str | None:
    """The first difference between the tensors a model needs (`want`, name -> shape, as
    `described_by` says) and those a weights file holds (`have`), as one sentence naming the tensor;
    None when they agree."""
    for k, shape in want.items():
        if k not in have:
            return f"{file}: has no tensor {k} ({len(set(want) - set(have))} missing in all)"
        if tuple(have[k]) != tuple(shape):
            return (f"{file}: tensor {k} has shape {list(have[k])} but the model built from {described_by} "
                    f"needs {list(shape)}: they are from different models")
    extra = sorted(set(have) - set(want))
    if extra:
        return f"{file}: tensor {extra[0]} does not belong to this model ({len(extra)} unexpected in all)"
    return None


def shape_mismatch(auto_cls, path: str, **kwargs) -> str | None:
    """Why transformers refused a folder's weights: the first tensor whose shape differs from the
    model config.json describes (built on the meta device: no memory, no initialisation)."""
    from transformers import AutoConfig

    if not (Path(path) / WEIGHTS).is_file():
        return None
    have = weight_shapes(Path(path) / WEIGHTS)
    try:
        with torch.device("meta"):
            config = AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=False)
            model = auto_cls.from_config(config, trust_remote_code=False, **kwargs)
    except Exception:  # only a better message was at stake: fall back to transformers' own
        return None
    prefix = model.base_model_prefix + "."
    for k, t in model.state_dict().items():
        got = have.get(k, have.get(k.removeprefix(prefix), have.get(prefix + k)))
        if got is not None and tuple(got) != tuple(t.shape):
            return (f"tensor {k} has shape {list(got)} but the model built from config.json needs "
                    f"{list(t.shape)}: they are from different models")
    return None


def check_vocab_fits(tokenizer, encoder, path) -> None:
    """Every token id must index the embedding table; a table with spare rows is fine (vocabularies
    are often padded to a multiple of 8 or 128)."""
    try:
        rows = encoder.get_input_embeddings().weight.shape[0]
    except (AttributeError, NotImplementedError):
        rows = getattr(encoder.config, "vocab_size", None)
    if rows is not None and len(tokenizer) > rows:
        raise ConfigError(f"{path}: the tokenizer files hold {len(tokenizer)} tokens but the embedding table "
                          f"({WEIGHTS}, config.json) only {rows} rows: the tokenizer is from another model")


# What posbias reads of a model repository on the Hub (weights in safetensors; other layouts'
# files are left to a local copy).
HUB_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "merges*", "vocab*", "tokenizer*"]


def local_dir(path: str, key: str) -> str:
    """The local folder of a model: `path` itself, or, for a Hugging Face Hub id such as
    `bert-base-cased` or `org/name`, its snapshot in the Hugging Face cache — downloaded when the
    environment allows it, read from the cache under HF_HUB_OFFLINE=1. Errors name `key`."""
    if Path(path).is_dir():
        check_model_folder(path, key)
        return path
    if Path(path).exists() or not _looks_like_hub_id(path):
        raise ConfigError(f"{key}: {path!r} is not a model folder (a folder with config.json) nor a Hugging Face "
                          "Hub id; `minilm` is the bundled MiniLM")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        folder = snapshot_download(path, allow_patterns=HUB_FILES)
    except LocalEntryNotFoundError:
        raise ConfigError(f"{key}: {path!r} is not a local folder, and the Hugging Face Hub cannot be reached "
                          "(offline: HF_HUB_OFFLINE=1, or no network) with no copy in the cache; download it "
                          "once where the Hub is reachable, or pass a local folder") from None
    except (RepositoryNotFoundError, HFValidationError) as e:
        raise ConfigError(f"{key}: {path!r} is neither a local folder nor a model on the Hugging Face Hub "
                          f"({type(e).__name__})") from None
    except OSError as e:
        raise ConfigError(f"{key}: cannot fetch {path!r} from the Hugging Face Hub: {' '.join(str(e).split())}") from None
    check_model_folder(folder, key)
    return folder


# The JSON files of a model folder that posbias or transformers read whole with Python's json.
MODEL_JSON = ("config.json", "tokenizer_config.json", "tokenizer.json", "special_tokens_map.json", "added_tokens.json",
              "vocab.json", "model.safetensors.index.json", "pytorch_model.bin.index.json")


def check_model_folder(folder: str, key: str) -> None:
    """Refuse, up front and in one line naming the file, a model folder that posbias cannot open
    safely, for every route to one (evaluate --model, model.name_or_path, model.tokenizer, a
    checkpoint):

    - one that needs its own Python code: config.json with `auto_map` and a `model_type`
      transformers does not have, or tokenizer_config.json with `auto_map` and no `tokenizer_class`
      transformers has. posbias never runs such code (a shared folder's `.py` file can do anything);
    - a JSON file (`MODEL_JSON`) over the size limit, damaged, or nested deeper than Python's
      recursion limit (`limits.load_json`), before transformers reads it unguarded.
    """
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

    code_fields = {"config.json": ("model_type", lambda t: t in CONFIG_MAPPING),
                   "tokenizer_config.json": ("tokenizer_class", tokenizer_class_from_name)}
    for name in MODEL_JSON:
        file = Path(folder) / name
        if not file.exists():  # not is_file(): a device or a pipe in its place is refused, not skipped
            continue
        doc = load_json(file, "model file")
        if name not in code_fields or not isinstance(doc, dict) or not doc.get("auto_map"):
            continue
        field, known = code_fields[name]
        value = doc.get(field)
        if not (isinstance(value, str) and value and known(value)):
            raise ConfigError(f"{key}: {folder}: {name} names code in the folder (auto_map) for {field} {value!r}, "
                              "which transformers does not have; posbias does not run a model folder's code")


def _looks_like_hub_id(spec: str) -> bool:
    """`name` or `org/name` of letters, digits, `-_.` (not a path: no leading `.`/`/`, no suffix
    that only files have)."""
    return bool(re.fullmatch(r"[A-Za-z0-9][\w.-]*(/[\w][\w.-]*)?", spec)) and not spec.endswith(
        (".json", ".gz", ".conll", ".conllu", ".txt", ".yaml", ".safetensors"))


def check_fast_tokenizer(tokenizer) -> None:
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError(
            f"tokenizer {type(tokenizer).__name__} is not a fast (Rust) tokenizer: posbias needs "
            "character offsets and word ids; use a tokenizer folder with tokenizer.json")


def saved_tokenizer_class(path: str):
    """The fast tokenizer class a folder's tokenizer_config.json names (`tokenizer_class`, which
    `save_pretrained` writes from the tokenizer it saves), or None when it names none that
    transformers has as a fast tokenizer (then AutoTokenizer chooses)."""
    from transformers import TokenizersBackend
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

    try:
        name = load_json(Path(path) / "tokenizer_config.json", "tokenizer config").get("tokenizer_class")
    except (ConfigError, AttributeError):
        return None  # no or no readable file: open_tokenizer's own checks name the problem
    cls = tokenizer_class_from_name(name) if isinstance(name, str) and name else None
    return cls if isinstance(cls, type) and issubclass(cls, TokenizersBackend) else None


def open_tokenizer(path: str, *, as_saved: bool = False, **kwargs):
    """A fast tokenizer from a local folder; a model without a pad token (GPT-2, BLOOM-style
    decoders) pads with its end-of-sequence token, which the attention mask hides anyway.

    Args:
        as_saved: load the class the folder's tokenizer_config.json names, not the one AutoTokenizer
            picks. For posbias checkpoints, whose tokenizer may come from another model than the
            encoder config.json beside it (the tiny BERT vocabulary with an ALBERT encoder):
            transformers 5.4-5.5 then load a generic TokenizersBackend, which returns no
            token_type_ids, so a reloaded model read every context token as segment 0 and scored
            differently from the model that was saved.
    """
    from transformers import AutoTokenizer

    loader = (saved_tokenizer_class(path) if as_saved else None) or AutoTokenizer
    try:
        tok = loader.from_pretrained(path, local_files_only=True, trust_remote_code=False, **kwargs)
    except (OSError, ValueError, TypeError) as e:
        raise ConfigError(f"cannot load a tokenizer from {path}: {e}") from None
    # Without its files, transformers 5 quietly builds the class's tokenizer with only its special
    # tokens (every word [UNK]); a class that needs no files (byte-level ByT5) names none.
    names = set(tok.vocab_files_names.values())
    if names and not any((Path(path) / f).is_file() for f in names | {"tokenizer.json"}):
        raise ConfigError(f"{path}: no tokenizer files ({', '.join(sorted(names | {'tokenizer.json'}))}); "
                          "copy them from the model this folder was trained from")
    check_fast_tokenizer(tok)
    if tok.pad_token is None:
        if tok.eos_token is None:
            raise ConfigError(f"tokenizer in {path} has neither a pad nor an end-of-sequence token")
        tok.pad_token = tok.eos_token
    return tok


def load_tokenizer(mcfg: ModelConfig, **kwargs):
    """The run's tokenizer (`model.tokenizer`, else `model.name_or_path`); `kwargs` go to
    `from_pretrained` (e.g. `add_prefix_space=True` for word-split input to byte-level BPE)."""
    spec = mcfg.tokenizer or mcfg.name_or_path
    if not spec:
        raise ConfigError("model.tokenizer must be set when the encoder is built from model.encoder")
    path = local_dir(resolve_path(spec), "model.tokenizer" if mcfg.tokenizer else "model.name_or_path")
    return open_tokenizer(path, **kwargs)


def encoder_from_config(config):
    """A randomly initialised encoder (no pooler) from a transformers config; posbias's relative
    position attention is put back in when the config asks for it."""
    from transformers import AutoModel

    try:
        encoder = AutoModel.from_config(config, add_pooling_layer=False, trust_remote_code=False)
    except TypeError:  # an encoder class without a pooler option
        encoder = AutoModel.from_config(config, trust_remote_code=False)
    kind = getattr(config, "position_embedding_type", None)
    if kind in RELATIVE_KINDS:
        apply_relative_positions(encoder, kind, "config.json")
    return encoder


def load_encoder(mcfg: ModelConfig, tokenizer):
    """A fresh encoder for training: pretrained weights from `model.name_or_path` (or random from
    `model.encoder`), with `model.position_embedding_type` applied. A transformers 4.x folder trained
    with relative positions loads as that relative model, with its trained distance tables."""
    from transformers import AutoConfig, AutoModel

    if mcfg.name_or_path:
        path = local_dir(resolve_path(mcfg.name_or_path), "model.name_or_path")
        try:
            try:
                encoder = from_pretrained_quietly(AutoModel, path, "model.name_or_path", add_pooling_layer=False)
            except TypeError:  # an encoder class without a pooler option
                encoder = from_pretrained_quietly(AutoModel, path, "model.name_or_path")
        except (OSError, ValueError) as e:
            raise ConfigError(f"model.name_or_path: cannot load an encoder from {path}: {e}") from None
        trained = getattr(encoder.config, "position_embedding_type", None)
        if mcfg.position_embedding_type == "absolute" and trained in RELATIVE_KINDS:
            # Its absolute table was never trained (4.x ignored it): there is no absolute model to give.
            raise ConfigError(f"model.position_embedding_type: absolute, but {path} was trained with {trained} "
                              "attention and has no trained absolute position table; leave the key empty or "
                              "set relative_key / relative_key_query")
    else:
        spec = dict(mcfg.encoder)
        spec.setdefault("vocab_size", len(tokenizer))
        spec.setdefault("pad_token_id", tokenizer.pad_token_id)
        model_type = spec.pop("model_type")
        try:
            config = AutoConfig.for_model(model_type, **spec)  # built-in classes only: no remote code
        except (ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"model.encoder: {e}") from None
        encoder = encoder_from_config(config)
        if hasattr(encoder, "init_new_weights"):  # posbias's own encoders (BiDAF: embeddings from a model)
            encoder.init_new_weights()
    if mcfg.position_embedding_type in RELATIVE_KINDS:
        apply_relative_positions(encoder, mcfg.position_embedding_type, "model.position_embedding_type")
    if len(tokenizer) > encoder.config.vocab_size:
        raise ConfigError(f"the tokenizer has {len(tokenizer)} tokens but the encoder's vocabulary only "
                          f"{encoder.config.vocab_size}: model.tokenizer does not belong to this encoder")
    return encoder


# The seed stream of `reinit_positions`: its own, so that the rows it draws are not the first draws
# of torch's global generator (set_seed(train.seed)), which initialise the head.
REINIT_STREAM = 0x72656974  # "reit"


def reinit_positions(encoder, start: int | None, seed: int, key: str = "model.reinit_positions_from") -> dict | None:
    """Re-initialise rows `start`.. of `encoder`'s absolute position-embedding table as transformers'
    `PreTrainedModel._init_weights` initialises an nn.Embedding (BERT, RoBERTa, ELECTRA, GPT-2 keep
    that rule): N(0, config.initializer_range), the padding row (RoBERTa's) zero.

    The positive control for Random Padding, RPP and CP: their premise is that rear
    position embeddings are untrained, which a sentence-embedding fine-tune such as MiniLM does not
    meet. The rows are drawn from a generator of their own (`seed`, `REINIT_STREAM`), so the global
    RNG, and with it every other initialisation and the data order, is as without the option.

    Returns:
        What was done, for run_info.json (ids touched, init, seed); None when `start` is None, with
        the weights untouched.

    Raises:
        ConfigError naming `key`: the encoder has no absolute table (relative, rotary, none), or
        `start` is not in 1 .. table size - 1.
    """
    if start is None:
        return None
    kind = position_kind(encoder.config)
    table = position_table(encoder)
    if kind.kind != "absolute" or table is None:
        raise ConfigError(f"{key}: {kind} has no absolute position-embedding table to re-initialise")
    size = table.num_embeddings
    if not 1 <= start < size:
        raise ConfigError(f"{key} must be >= 1 and < the position table's size ({size}), got {start}")
    std = getattr(encoder.config, "initializer_range", None) or 0.02  # PreTrainedModel._init_weights' default
    state = np.random.SeedSequence([seed, REINIT_STREAM]).generate_state(2, np.uint32)
    gen = torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))
    rows = torch.empty(size - start, table.embedding_dim).normal_(0.0, std, generator=gen)  # (size - start, d)
    pad = table.padding_idx
    if pad is not None and pad >= start:
        rows[pad - start] = 0.0  # as _init_weights: the padding row stays zero
    with torch.no_grad():
        table.weight[start:] = rows.to(table.weight.dtype)
    return {"ids": [start, size - 1], "rows": size - start, "init": "normal", "mean": 0.0, "std": std,
            "seed": seed, "stream": REINIT_STREAM, "padding_id_zero": pad if pad is not None and pad >= start else None}


def position_table(encoder):
    """The encoder's absolute position-embedding table (an nn.Embedding indexed by position ids:
    `embeddings.position_embeddings` in BERT-style encoders, `wpe` in GPT-2), or None."""
    for table in (getattr(getattr(encoder, "embeddings", None), "position_embeddings", None),
                  getattr(encoder, "wpe", None)):
        if isinstance(table, torch.nn.Embedding):
            return table
    return None


def position_id_base(encoder) -> tuple[int, int]:
    """(first position id, id given to padding) — RoBERTa-style models count from padding_idx + 1."""
    pad_idx = getattr(getattr(encoder, "embeddings", None), "padding_idx", None)
    if pad_idx is not None:
        return pad_idx + 1, pad_idx
    return 0, 0


def position_ids(attention_mask: torch.Tensor, base: int, pad: int) -> torch.Tensor:
    """(b, s) positions counted over real tokens only, so left padding does not shift them."""
    pos = attention_mask.long().cumsum(-1) - 1 + base
    return pos.masked_fill(attention_mask == 0, pad)


class EncoderInputs:
    """Which of posbias's batch fields an encoder's forward accepts (BLOOM takes no position ids,
    GPT-2's token types would index its word embeddings), and its position numbering."""

    def __init__(self, encoder, use_token_types: bool = True):
        params = inspect.signature(encoder.forward).parameters
        self.positions = "position_ids" in params
        # GPT-2 has token_type_ids, but embeds them with its word table: never pass them there.
        self.types = use_token_types and "token_type_ids" in params and encoder.config.model_type != "gpt2"
        self.base, self.pad = position_id_base(encoder)

    def __call__(self, encoder, batch: dict) -> torch.Tensor:
        """(b, s, d) last hidden states; a perturbation may have set shifted `position_ids`."""
        kwargs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        if self.types and "token_type_ids" in batch:
            kwargs["token_type_ids"] = batch["token_type_ids"]
        if self.positions:
            pos = batch.get("position_ids")
            kwargs["position_ids"] = pos if pos is not None else position_ids(batch["attention_mask"], self.base,
                                                                              self.pad)
        return encoder(**kwargs).last_hidden_state


def hf_prediction_head(hf_model):
    """The module a Hugging Face task model applies between its base model and its classifier
    (ModernBERT's dense + GELU + LayerNorm `head`), or None: `classifier(dropout(hidden))` alone."""
    head = getattr(hf_model, "head", None)
    return head if isinstance(head, torch.nn.Module) else None


def hf_task_model(auto_cls, encoder, checkpoint, **config_updates):
    """A fresh Hugging Face task model (`auto_cls`, e.g. AutoModelForTokenClassification) whose base
    model holds `encoder`'s weights; its task layer is left for the caller to fill."""
    config = check_exportable(encoder, checkpoint)
    config.architectures = None
    for k, v in config_updates.items():
        setattr(config, k, v)
    hf = auto_cls.from_config(config, trust_remote_code=False)
    base = getattr(hf, hf.base_model_prefix)
    missing, unexpected = base.load_state_dict(encoder.state_dict(), strict=False)
    # Only a pooler the task model does not use may be missing.
    if unexpected or any("pooler" not in k for k in missing):
        raise ConfigError(f"cannot map encoder weights onto {type(hf).__name__}: missing {missing}, "
                          f"unexpected {unexpected}")
    return hf


def check_exportable(encoder, checkpoint):
    """The encoder's config, if a plain transformers model can reproduce it; posbias's relative
    position attention has no transformers 5 equivalent, so such a checkpoint cannot be exported."""
    kind = getattr(encoder.config, "position_embedding_type", None)
    if kind in RELATIVE_KINDS:
        raise ConfigError(f"{checkpoint}: its encoder uses posbias's {kind} position "
                          "attention, which transformers 5 no longer has: it cannot be exported to a Hugging "
                          "Face folder (evaluate it with posbias instead)")
    return encoder.config
