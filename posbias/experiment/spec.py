"""An experiment spec (YAML or a mapping) expanded into its runs, each with a validated config.

A spec names a base run config and a grid:

    name: smoke
    base: tiny                     # preset name, YAML path (relative to the spec) or a mapping
    overrides: {train: {max_steps: 4}}          # applied to every run
    methods:                       # name -> overrides; the first is the baseline unless `baseline:`
      baseline: {}
      random_padding: {perturb: [{name: random_padding}]}
    seeds: [1, 2, 3]
    datasets: {squad: {}}          # optional: name -> overrides
    train_sizes: [1000, 2000]      # optional: data.max_train_examples
    eval_sets: {test: path.json}   # optional: scored with each run's best checkpoint after training
    position_eval:                 # optional, tagging: the duplicated-test-set evaluation F1(alpha)
      test: {k_max: 10, quantiles: [0.25, 0.75], alphas: [5, 10]}    # of an eval set (see below)
    output_dir: runs/experiments/smoke

Also `exclude` (shell patterns of run names left out of the grid), `segments` (per-question
segmenters, below) and `description`.

A method may score models trained elsewhere instead of training (a Hugging Face `Trainer` script, a
model from the Hub, another experiment's runs): `checkpoint:` names its model per run, with `{seed}`,
`{dataset}` and `{output_dir}` (this experiment's folder) filled in (these plain names only; `{{` and
`}}` stand for braces), e.g.

      hf_cp: {checkpoint: "bench/out/hf_trainer_conll/cp_seed{seed}"}

Such a run is scored on the validation set (the base's `data.eval_file`), every eval set and
position evaluation like a trained run's best checkpoint, and compared with the other methods seed by
seed; the rest of its overrides apply to how it is evaluated only (tagging: the D* of the
experiment's runs, and `data.label_subtokens`, how the model's sub-tokens were labelled, which the
authors' sub-token F1 reads; `collect._trained_as`). With `decode:` it is scored with
head options no weight depends on changed (those its head declares decode-time, e.g. MaP's
`ensemble`), so one experiment's MaP_E checkpoints are also scored as their forward direction alone:

      map_e_forward: {checkpoint: "{output_dir}/runs/map_e/seed{seed}/best", decode: {ensemble: false}}
"""
from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from string import Formatter

from .. import outputs
from ..config import DEFAULT_TASK, RunConfig, build_config, current_names, deep_merge, load_yaml, parse_overrides, preset_path
from ..errors import ConfigError, did_you_mean
from ..registry import SEGMENTERS

# Per-question segmenters: name -> function(examples, eval_dir, checkpoint, **options) -> {qid: label},
# where eval_dir holds the run's predictions/nbest for those examples and checkpoint its model.
# Position analyses (answer-position quartiles, S_X^(1)/S_X^(2)) register here (qa/positions.py), and
# so does the gold answer length (qa/answer_length.py). A segmenter may carry `gold_only` (see
# aggregation.gold_segment_labels), `needs_checkpoint = False` (its labels come from the examples'
# text alone, so an archived store without checkpoints can still recompute them) and
# `check_options(options, key)`, called when the spec is loaded.

SPEC_KEYS = {"name", "base", "overrides", "methods", "seeds", "datasets", "train_sizes", "eval_sets",
             "output_dir", "baseline", "segments", "description", "position_eval", "exclude"}
POSITION_EVAL_OPTIONS = {"k_max", "quantiles", "modes", "max_len", "batch_tokens", "alphas"}


@dataclass
class Run:
    """One cell of the grid."""

    name: str
    method: str
    seed: int
    dataset: str | None
    train_size: int | None
    config: RunConfig
    output_dir: Path
    checkpoint: str | None = None
    """The model this run scores instead of training (the method's `checkpoint:`, filled in)."""
    decode: dict = field(default_factory=dict)
    """Decode-time head options that run's scoring changes (the method's `decode:`)."""

    @property
    def config_hash(self) -> str:
        if self.checkpoint is None:
            return self.config.hash()
        import hashlib
        import json

        decode = f" decode {json.dumps(self.decode, sort_keys=True)}" if self.decode else ""
        return hashlib.sha256(f"{self.config.hash()} checkpoint {self.checkpoint}{decode}".encode()).hexdigest()[:16]

    @property
    def model_dir(self):
        """The model its eval sets are scored with: its `best/`, or the checkpoint it scores."""
        return self.checkpoint if self.checkpoint is not None else self.output_dir / "best"


@dataclass
class Experiment:
    name: str
    output_dir: Path
    runs: list[Run]
    baseline: str
    methods: list[str]
    eval_sets: dict[str, str] = field(default_factory=dict)
    segments: list[tuple[str, str, dict]] = field(default_factory=list)
    """(label, segmenter name, options) for each entry of the spec's `segments`."""
    spec_path: str | None = None
    position_eval: dict[str, dict] = field(default_factory=dict)
    """Eval set name -> options of the task's position evaluation (tagging: F1(alpha) on D*_test(k))."""

    @property
    def db_path(self) -> Path:
        return self.output_dir / "experiment.sqlite"


def _as_overrides(value, key: str) -> dict:
    if value is None:
        return {}
    if isinstance(value, dict):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return parse_overrides(value)
    raise ConfigError(f"{key}: expected a mapping or a list of key=value strings, got {value!r}")


def _segment_spec(entry, i: int) -> tuple[str, str, dict]:
    """`name` or `{name: ..., option: value}` -> (label such as "first_x_tokens(x=100)", name, options)."""
    from ..tasks import all_tasks  # loads the task packages, and torch: on first use

    all_tasks()  # importing the task packages registers their segmenters

    if isinstance(entry, str):
        entry = {"name": entry}
    if not isinstance(entry, dict) or "name" not in entry:
        raise ConfigError(f"segments[{i}] must be a name or a mapping with a name, got {entry!r}")
    segmenter = SEGMENTERS.get(entry["name"], f"segments[{i}].name")
    options = {k: v for k, v in entry.items() if k != "name"}
    if hasattr(segmenter, "check_options"):  # refuse bad options now, not after training
        segmenter.check_options(options, f"segments[{i}]")
    label = entry["name"] + (f"({', '.join(f'{k}={v}' for k, v in sorted(options.items()))})" if options else "")
    return label, entry["name"], options


def load_experiment(spec, output_dir: str | None = None) -> Experiment:
    """Expand a spec (path or mapping) into its runs, each with a validated config."""
    base_dir = Path.cwd()
    spec_path = None
    if not isinstance(spec, dict):
        spec_path = str(spec)
        base_dir = Path(spec).resolve().parent
        spec = load_yaml(spec)
    unknown = sorted(set(spec) - SPEC_KEYS)
    if unknown:
        raise ConfigError(f"experiment spec: unknown key {unknown[0]!r}"
                          + (did_you_mean(unknown[0], SPEC_KEYS, quote=True) or f"; known keys: {sorted(SPEC_KEYS)}"))
    for key in ("name", "methods", "seeds"):
        if key not in spec:
            raise ConfigError(f"experiment spec: {key} is required")
    methods = spec["methods"]
    if not isinstance(methods, dict) or not methods:
        raise ConfigError("experiment spec: methods must be a non-empty mapping name -> overrides")
    seeds = spec["seeds"]
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) for s in seeds):
        raise ConfigError(f"experiment spec: seeds must be a non-empty list of integers, got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"experiment spec: seeds repeat: {seeds}")
    baseline = spec.get("baseline", next(iter(methods)))
    if baseline not in methods:
        raise ConfigError(f"experiment spec: baseline {baseline!r} is not one of the methods {list(methods)}")

    base = spec.get("base", {})
    if isinstance(base, str):
        candidate = base_dir / base
        base = load_yaml(candidate if candidate.is_file() else preset_path(base))
    elif not isinstance(base, dict):
        raise ConfigError(f"experiment spec: base must be a preset, a path or a mapping, got {base!r}")
    # Each part's old key names (`data.doc_stride`) are read as today's before the parts are merged,
    # so that a later part's old name overrides an earlier one's new name (`config.current_names`).
    task, where = base.get("task", DEFAULT_TASK), f"{spec_path}: " if spec_path else ""
    base = deep_merge(current_names(base, task, f"{where}base: "),
                      current_names(_as_overrides(spec.get("overrides"), "overrides"), task, f"{where}overrides."))
    out = Path(output_dir or spec.get("output_dir") or f"runs/experiments/{spec['name']}")

    exclude = spec.get("exclude") or []
    if not isinstance(exclude, list) or not all(isinstance(p, str) for p in exclude):
        raise ConfigError(f"experiment spec: exclude must be a list of run-name patterns, got {exclude!r}")
    datasets = spec.get("datasets") or {None: {}}
    sizes = spec.get("train_sizes") or [None]
    if not isinstance(datasets, dict):
        raise ConfigError("experiment spec: datasets must be a mapping name -> overrides")
    if not isinstance(sizes, list):
        raise ConfigError(f"experiment spec: train_sizes must be a list of integers, got {sizes!r}")
    # Method, dataset and size name the run's folder (runs/<dataset>/n<size>/<method>/seed<k>): each
    # must be one plain path component, or a run would train (and delete) outside the experiment.
    for m in methods:
        outputs.safe_name(m, "experiment spec: method name")
    for ds_name in datasets:
        if ds_name is not None:
            outputs.safe_name(ds_name, "experiment spec: dataset name")
    for size in sizes:
        if size:
            outputs.safe_name(f"n{size}", "experiment spec: train_sizes entry")
    runs = []
    for ds_name, ds_over in datasets.items():
        for size in sizes:
            for method, m_over in methods.items():
                for seed in seeds:
                    name = run_name(ds_name, size, method, seed)
                    if any(fnmatchcase(name, p) for p in exclude):
                        continue
                    d = deep_merge(base, current_names(_as_overrides(ds_over, f"datasets.{ds_name}"), task,
                                                       f"{where}datasets.{ds_name}."))
                    over = dict(_as_overrides(m_over, f"methods.{method}"))  # a copy: every seed reads m_over whole
                    checkpoint = _checkpoint(over.pop("checkpoint", None), method, seed, ds_name, out, spec_path)
                    decode = _decode(over.pop("decode", None), method, checkpoint)
                    d = deep_merge(d, current_names(over, task, f"{where}methods.{method}."))
                    run_dir = out / "runs" / name
                    outputs.inside(out, run_dir, f"experiment run {name}")
                    extra = {"train": {"seed": seed, "output_dir": str(run_dir)}}
                    if size:
                        extra["data"] = {"max_train_examples": size}
                    try:
                        cfg = build_config(deep_merge(d, extra))
                    except ConfigError as e:
                        raise ConfigError(f"experiment run {name}: {e}") from None
                    runs.append(Run(name, method, seed, ds_name, size, cfg, run_dir, checkpoint, decode))
    grid = [run_name(d, n, m, k) for d in datasets for n in sizes for m in methods for k in seeds]
    unused = [p for p in exclude if not any(fnmatchcase(name, p) for name in grid)]
    if unused:
        raise ConfigError(f"experiment spec: exclude pattern {unused[0]!r} matches none of the grid's runs")
    if not runs:
        raise ConfigError("experiment spec: exclude removes every run of the grid")
    eval_sets = spec.get("eval_sets") or {}
    if not isinstance(eval_sets, dict):
        raise ConfigError("experiment spec: eval_sets must be a mapping name -> file")
    for name in eval_sets:  # names the folder runs/<run>/evals/<name>
        outputs.safe_name(name, "experiment spec: eval_sets name")
    segments = [_segment_spec(s, i) for i, s in enumerate(spec.get("segments") or [])]
    position_eval = _position_eval_spec(spec.get("position_eval"), eval_sets, runs)
    return Experiment(spec["name"], out, runs, baseline, list(methods), dict(eval_sets), list(segments),
                      spec_path, position_eval)


def _checkpoint(template, method: str, seed: int, dataset, out: Path, spec_path: str | None = None) -> str | None:
    """A method's `checkpoint:` for one run: `{seed}`, `{dataset}`, `{output_dir}` filled in."""
    if template is None:
        return None
    key = f"experiment spec{f' {spec_path}' if spec_path else ''}: methods.{method}.checkpoint"
    if not isinstance(template, str) or not template.strip():
        raise ConfigError(f"{key} must be a model folder or Hub id (a string), got {template!r}")
    return fill_placeholders(template, {"seed": seed, "dataset": dataset or "", "output_dir": str(out)}, key)


def fill_placeholders(template: str, fields: dict, key: str) -> str:
    """`template` with each `{name}` replaced by `fields[name]` (`{{` and `}}`: literal braces).

    Only plain names: `str.format` would also follow `{seed.__class__}` or `{output_dir[0]}` into the
    values' attributes and items, and apply conversions and format specs; here any of those is an
    error naming `key` and the placeholder, as an unknown name is."""
    known = ", ".join(f"{{{k}}}" for k in fields)
    try:
        parts = list(Formatter().parse(template))
    except ValueError as e:  # a lone `{` or `}`
        raise ConfigError(f"{key} {template!r}: {e} (placeholders: {known}; `{{{{` and `}}}}` for braces)") from None
    out = []
    for literal, name, spec, conversion in parts:
        out.append(literal)
        if name is None:  # the text after the last placeholder
            continue
        if name not in fields or spec or conversion:
            shown = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
            raise ConfigError(f"{key} {template!r}: {shown} is not one of {known} (plain names only)")
        out.append(str(fields[name]))
    return "".join(out)


def _decode(value, method: str, checkpoint) -> dict:
    """A method's `decode:` (head option -> plain value), only beside `checkpoint:`: a trained method
    sets its head options as any other override."""
    if value is None:
        return {}
    key = f"experiment spec: methods.{method}.decode"
    if checkpoint is None:
        raise ConfigError(f"{key} needs checkpoint: (it changes how a model trained elsewhere is scored; a trained "
                          "method sets model.head_options itself)")
    if not isinstance(value, dict) or not value or not all(isinstance(k, str) for k in value):
        raise ConfigError(f"{key} must be a mapping head option -> value, e.g. {{ensemble: false}}, got {value!r}")
    for k, v in value.items():
        if v is not None and not isinstance(v, (bool, int, float, str)):
            raise ConfigError(f"{key}.{k} must be a plain value (true/false, a number, a name), got {v!r}")
    return dict(value)


def run_name(dataset, size, method: str, seed: int) -> str:
    """A run's name in a grid: `<dataset>/n<size>/<method>/seed<k>`, without the parts the grid does
    not have (no dataset or size: `<method>/seed<k>`).

    Args:
        dataset: the data set's name, or None where the grid has one unnamed data set.
        size: the training-set size, or None where the grid does not vary it.
        method: the method's name.
        seed: the seed.

    Returns:
        The name, e.g. `run_name(None, 128, "mean", 1) == "n128/mean/seed1"`.
    """
    return "/".join(p for p in (dataset, f"n{size}" if size else None, method, f"seed{seed}") if p)


def _position_eval_spec(value, eval_sets: dict, runs: list[Run]) -> dict[str, dict]:
    """`position_eval: {eval set: {options}}`, validated: known eval sets and options, a task that has it."""
    from ..tasks import get_task  # loads the task packages, and torch: on first use

    if not value:
        return {}
    if not isinstance(value, dict):
        raise ConfigError("experiment spec: position_eval must be a mapping eval set -> options")
    for name, options in value.items():
        if name not in eval_sets:
            raise ConfigError(f"experiment spec: position_eval.{name} is not one of the eval_sets {sorted(eval_sets)}"
                              + did_you_mean(name, eval_sets, prefix="position_eval."))
        if not isinstance(options or {}, dict):
            raise ConfigError(f"experiment spec: position_eval.{name} must be a mapping of options")
        unknown = set(options or {}) - POSITION_EVAL_OPTIONS
        if unknown:
            bad = sorted(unknown)[0]
            raise ConfigError(f"experiment spec: position_eval.{name}.{bad} is not an option"
                              + (did_you_mean(bad, POSITION_EVAL_OPTIONS, prefix=f"position_eval.{name}.")
                                 or f" ({', '.join(sorted(POSITION_EVAL_OPTIONS))})"))
    for task in {r.config.task for r in runs}:
        if get_task(task).position_eval_checkpoint is None:
            raise ConfigError(f"experiment spec: position_eval is not available for task {task!r}")
    return {name: dict(options or {}) for name, options in value.items()}
