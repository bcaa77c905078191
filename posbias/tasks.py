"""The tasks' front door, above `qa/` and `tagging/`: the `Task` protocol, `get_task(name)` and
`checkpoint_task(model)`.

A task is any object with the members of `Task` (no base class); importing its package registers
it in `posbias.registry.TASKS` (`TASKS.register("name")(MyTask())`). This module imports both
built-in packages (modules above the tasks use it). The core (config, checkpoint) looks tasks up
in that registry by name and imports no task package; the fronts (`api.py`, `cli.py`) reach a task
only through these members, never by its name.

Adding a task: a package with a config dataclass (`posbias.config.RunConfig` and the shared
`ModelConfig`/`TrainConfig`), a task object with every member below (an optional capability the
task lacks is set to None), and one registration line; `tests/core/test_task_protocol.py` checks
every registered task against this protocol.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable

from . import qa, tagging  # noqa: F401  (each registers its task)
from .checkpoint import checkpoint_task as _checkpoint_task_name
from .errors import ConfigError
from .registry import TASKS


@runtime_checkable
class Task(Protocol):
    """What the training loop, checkpoints, experiments and the fronts call on a task."""

    name: str  # "qa": the config's `task`, the CLI's `posbias train qa`
    config_class: type  # its RunConfig dataclass
    hf_suffix: str  # the Hugging Face head class suffix it loads and exports: "ForQuestionAnswering"
    unit: str  # what one example is, in messages and reports: "question", "sentence"
    predict_inputs: tuple[str, ...]  # the raw inputs `predict_checkpoint` takes besides data: ("question", "context")
    cli_help: str  # what `posbias train --help` says of it: "extractive QA"
    cli_commands: tuple[str, ...]  # the CLI commands it takes: ("train", "evaluate", "predict", "diagnose", "score")

    # ---- the CLI (`posbias.cli`): called while the parser is built, before torch loads, so the
    # module holding the task imports nothing heavy at its top
    def add_cli_arguments(self, command: str, parser) -> None:
        """Add the task's own arguments of `posbias COMMAND <name>` to `parser` (an argparse parser),
        for each command in `cli_commands`. The CLI adds the shared ones: train: all of them
        (-c, overrides, --device, --precision, --resume, --overwrite, --json); evaluate: --model
        before and --output-dir, overrides, --device, --precision, --json after the task's; predict:
        --model before and --device, --precision after; diagnose: the same and the verdict's options
        (--bootstrap-samples, --min-bucket, --quality-floor, --verbose; `api.diagnose` passes them
        to the task's `diagnose` as bias_samples, min_bucket, quality_floor); score: none. Use `posbias.arguments`'
        checked types and groups (`overrides_arg`, `verdict_args`); name the options that go to the
        API function as the task's own keywords with `posbias.arguments.task_options`."""

    # ---- training (`posbias.training`)
    def load_tokenizer(self, cfg) -> Any:
        """A fast tokenizer, set up for the task."""

    def read(self, spec, cfg) -> Any:
        """A data set: .path, .examples (each with .id), .skipped."""

    def train_features(self, examples, tokenizer, cfg, train_ds) -> Any:
        """Training features: len(), .lengths (n,), .example_index (n,), .stats; whatever the model
        is built from travels on them (QA's answer prior for `train.debias`)."""

    def run_info(self, cfg, train_ds, features) -> dict:
        """Task facts for run_info.json."""

    def build_model(self, cfg, tokenizer, train_ds, features) -> Any:
        """nn.Module: forward(batch, targets=None) -> dict with "loss" given targets; .encoder,
        .position_base, .position_pad, .position_ids(mask), .head_name, .meta()."""

    def collate(self, features, idx, tokenizer, *, with_labels: bool = False) -> dict:
        """Tensors: input_ids, attention_mask, cls_index, ... (+ labels)."""

    def targets(self, batch: dict) -> dict:
        """The label tensors `model(batch, targets)` takes."""

    def evaluate(self, model, tokenizer, cfg, dataset, out_dir=None, *, accelerator=None, progress=True) -> dict:
        """Metrics of a model in memory on a data set (prediction files into `out_dir`)."""

    def main_metric(self, result: dict) -> tuple[str, float]:
        """(name, value) that best-checkpoint selection maximises."""

    # ---- checkpoints (`posbias.checkpoint`)
    def load_model(self, path: str, cfg, meta: dict) -> Any:
        """(model, tokenizer): a posbias checkpoint's skeleton."""

    def load_hf(self, path: str, config) -> Any:
        """(model, tokenizer, cfg) of a Hugging Face *{hf_suffix} folder."""

    # ---- the fronts (`posbias.api`, the CLI, experiments)
    def evaluate_checkpoint(self, model, data, output_dir=None, overrides=None, progress=True) -> dict:
        """Metrics of a checkpoint folder on a data file."""

    def predict_checkpoint(self, model, data=None, output_dir=None, *, overrides=None, progress=False,
                           n_best=None, **inputs) -> dict:
        """id -> prediction, for `data` or for the raw `inputs` (named in `predict_inputs`)."""

    def prediction_summary(self, result: dict, *, n_best: int | None = None, from_data: bool = False,
                           output_dir=None) -> Any:
        """What `posbias predict` prints: a line, or an object printed as JSON."""

    def score_files(self, data, predictions, **options) -> dict:
        """Score a predictions file against a gold file without a model."""

    def diagnose(self, model, data, output_dir, *, overrides=None, progress=True, **options) -> dict:
        """The task's position analyses of a checkpoint, opening with the verdict (`verdict_lines`)."""

    def export_hf(self, model, out_dir) -> Any:
        """Write a checkpoint as a Hugging Face *{hf_suffix} folder."""

    def example_scores(self, dataset, eval_dir, run_info: dict) -> dict:
        """{example id: (a, b)}: what the experiment's paired bootstrap resamples."""

    # ---- optional capabilities: a callable, or None where the task has none
    position_eval_checkpoint: Callable | None  # (model, data, out_dir, options, overrides) -> metrics
    position_metrics: Callable | None  # (result, alphas) -> metrics an experiment records
    report_figures: Callable | None  # (results, plots_dir) -> [(title, png)]
    improvement_rows: Callable | None  # (results) -> [dict]: task-specific report analyses
    report_sections: Callable | None  # (results) -> [(heading, text, head, body, JSON rows)]: more report analyses


def get_task(name: str, key: str | None = None) -> Task:
    """The registered task `name`; `key` is the config key named in the error."""
    return TASKS.get(name, key)


def all_tasks() -> list[Task]:
    return TASKS.values()


def checkpoint_task(model, expected: str | None = None) -> Task:
    """The task of a checkpoint folder (posbias or Hugging Face); with `expected` (the CLI's `evaluate
    qa`), a model of another task is an error."""
    found = _checkpoint_task_name(model)
    if expected is not None and found != expected:
        raise ConfigError(f"{model} is a {found} model, not a {expected} one")
    return get_task(found)


def missing_members(task) -> list[str]:
    """The members of `Task` that `task` lacks (an optional capability must be there, as None)."""
    members = [n for n in Task.__annotations__] + [n for n, v in vars(Task).items()
                                                    if callable(v) and not n.startswith("_")]
    return sorted(n for n in set(members) if not hasattr(task, n))
