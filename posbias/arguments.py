"""argparse building blocks shared by the CLI (`posbias.cli`) and the tasks' own command-line
arguments (`posbias.tasks.Task.add_cli_arguments`): checked option types and the option groups
several commands have. It imports nothing heavy: the parser is built before torch loads.

Option values are checked by argparse (`type=`), so a bad one is one error line and exit 2 before
anything loads. Each checker carries `bad`: values it must refuse (the CLI test feeds them to every
option that uses it).
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

INT64 = 2**63  # torch and NumPy hold integers in 64 bits


def _integer(lo: int | None = None, hi: int | None = None, name: str = "integer"):
    """An argparse `type` for a whole number in [lo, hi] (a side without a limit: None)."""
    what = "an integer" + (f" in [{lo}, {hi}]" if hi is not None else f" >= {lo}" if lo is not None else "")

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not -INT64 <= value < INT64 or (lo is not None and value < lo) or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
        return value

    parse.__name__ = name
    parse.bad = ["abc", "1.5", "", "1e3", str(INT64), *([str(lo - 1)] if lo is not None else []),
                 *([str(hi + 1)] if hi is not None else [])]
    return parse


def _number(lo: float | None = None, hi: float | None = None, name: str = "number"):
    """An argparse `type` for a finite number in [lo, hi] (a side without a limit: None)."""
    what = "a finite number" + (f" in [{lo:g}, {hi:g}]" if hi is not None else f" >= {lo:g}" if lo is not None else "")

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not math.isfinite(value) or (lo is not None and value < lo) or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
        return value

    parse.__name__ = name
    parse.bad = ["abc", "nan", "inf", "-inf", "", *([f"{lo - 0.5:g}"] if lo is not None else []),
                 *([f"{hi + 0.5:g}"] if hi is not None else [])]
    return parse


integer = _integer()
positive_int = _integer(1, name="positive_int")
# Percentile intervals settle by 10^4 resamples; 10^6 bounds the (resamples x buckets) arrays kept.
bootstrap_samples = _integer(0, 10**6, name="bootstrap_samples")
seed_int = _integer(0, 2**32 - 1, name="seed")  # NumPy's and Python's seeding range
unit_float = _number(0.0, 1.0, name="unit_float")
points = _number(0.0, 100.0, name="points")  # a score in points, 0..100
ratio = _number(1.0, name="ratio")  # a compression ratio: 1 leaves positions as they are
nonnegative_int = _integer(0, name="nonnegative_int")
positive_float = _number(1e-3, name="positive_float")  # a duration in seconds


def unit_floats(text: str) -> list[float]:
    """`--depths 0,0.25,0.5`: fractions in [0, 1], separated by commas."""
    try:
        return [unit_float(part) for part in text.split(",")]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected fractions in [0, 1] separated by commas (e.g. 0,0.5,1), "
                                         f"got {text!r}") from None


unit_floats.bad = ["", "a", "0.5,", "1.5", "0,nan", "-inf"]


def layer_choice(text: str):
    """`auto`, `all`, `global`, or layer indices separated by commas (`--mspoe-layers 5,11,17`)."""
    if text in ("auto", "all", "global"):
        return text
    try:
        layers = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected auto, all, global or layer indices such as 5,11,17, got {text!r}") \
            from None
    if any(i < 0 or i >= INT64 for i in layers) or len(set(layers)) != len(layers):
        raise argparse.ArgumentTypeError(f"layer indices must be distinct and >= 0, got {text}")
    return layers


layer_choice.bad = ["", "first", "1,,2", "-1", "2,2", "1.5"]


def gpus(text: str) -> str:
    """`--gpus 0,1,2,3`: GPU indices, distinct (`posbias.experiment.cluster.parse_gpus`'s rule)."""
    parts = text.split(",")
    if not all(p.strip().isdigit() for p in parts) or len({int(p) for p in parts}) != len(parts):
        raise argparse.ArgumentTypeError(f"expected distinct GPU indices separated by commas (e.g. 0,1,2,3), "
                                         f"got {text!r}")
    return text


gpus.bad = ["", "a", "0,,1", "0,0", "-1", "1.5", "cuda:0"]


def folder(text: str) -> str:
    """A folder to read and write (`--cache-dir`): existing, or to be made; not an existing file, nor
    a path through one (checked before any work, not when the first file is written into it)."""
    if not text:
        raise argparse.ArgumentTypeError("expected a folder, got ''")
    for p in (Path(text), *Path(text).parents):
        if p.exists():
            if not p.is_dir():
                raise argparse.ArgumentTypeError(f"{text} is an existing file, not a folder" if p == Path(text)
                                                 else f"{text} cannot be a folder: {p} is an existing file")
            break
    return text


folder.bad = [""]


class Ordered(argparse.Action):
    """`nargs=2` values that must be LOW <= HIGH (`--truncate-range L1 L2`, `--quantiles`)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if values[0] > values[1]:
            parser.error(f"argument {option_string}: the first value must be <= the second, "
                         f"got {values[0]} {values[1]}")
        setattr(namespace, self.dest, values)


# ---- option groups

DEVICE_HELP = ("where the model runs: auto (a CUDA GPU when torch sees one, else the CPU), cpu, cuda, cuda:N, mps; "
               "the same as the override train.device=...")
PRECISION_HELP = ("numeric precision: fp32, bf16, fp16, or auto (bf16 where the CPU has AMX-BF16 or AVX512-BF16 "
                  "or the GPU supports bf16, else fp32; recommended on GPUs); training: the override "
                  "train.mixed_precision=... (without it, accelerate launch's --mixed_precision or config, else fp32), "
                  "evaluation, prediction and diagnosis: train.eval_precision=...")
PRECISIONS = ["fp32", "bf16", "fp16", "auto"]


def model_arg(p, what: str) -> None:
    """`--model` (alias `--checkpoint`): the model a command reads."""
    p.add_argument("--model", "--checkpoint", dest="model", required=True, help=what)


def device_args(p) -> None:
    """`--device` and `--precision`, which the CLI turns into overrides (train.device=..., ...)."""
    p.add_argument("--device", default=None, help=DEVICE_HELP)
    p.add_argument("--precision", default=None, choices=PRECISIONS, help=PRECISION_HELP)


def overrides_arg(p, what: str = "key.sub=value overrides of the model's saved config, e.g. "
                                 "data.max_seq_len=256") -> None:
    """The trailing `key.sub=value` overrides (also picked up after flags: `posbias.cli.main`)."""
    p.add_argument("overrides", nargs="*", help=what)


def verdict_args(p, examples: str) -> None:
    """The options of the position-bias verdict that opens every diagnosis (`posbias.analysis.verdict`)."""
    p.add_argument("--bootstrap-samples", type=bootstrap_samples, default=2000,
                   help="resamples for the verdict's intervals (default 2000; 0: point values only)")
    p.add_argument("--min-bucket", type=positive_int, default=30,
                   help=f"fewest {examples} a position bucket needs to stand alone; smaller ones are merged with "
                        "their neighbours (default 30)")
    p.add_argument("--quality-floor", type=points, default=20.0,
                   help="overall score (points) under which the report warns that the bias numbers mean little "
                        "(default 20)")
    p.add_argument("--verbose", action="store_true", help="print the whole diagnosis.md, not only the verdict")


def conll_format_args(p) -> None:
    """How a CoNLL / CoNLL-U file is read: its format, tag column and tag scheme."""
    p.add_argument("--format", default=None, choices=["auto", "conll", "conllu"],
                   help="data format (default: the model's data.format, else auto)")
    p.add_argument("--tag", default=None, choices=["upos", "xpos"], help="CoNLL-U column to score")
    p.add_argument("--tag-column", type=integer, default=None, help="CoNLL column of the tag (default: last)")
    p.add_argument("--scheme", default=None, choices=["auto", "iob1", "iob2", "bioes", "none"],
                   help="tag scheme of the gold file (none = POS-style labels)")


def task_options(p, *names: str, none_means: tuple[str, ...] = ()) -> None:
    """Name the arguments of a task's sub-parser that go to the API function as the task's own
    options (`posbias.tasks.Task`), by their dest names; one left at None is not passed, unless it
    is in `none_means` (None has a meaning there: `--all-sentences` is quantiles None)."""
    p.set_defaults(task_options=names, none_means=none_means)


def chosen_options(args) -> dict:
    """The task options of the parsed command (`task_options`), lists as tuples."""
    out = {}
    for k in getattr(args, "task_options", ()):
        if not hasattr(args, k):  # default=SUPPRESS: the API function's own default applies
            continue
        v = getattr(args, k)
        if v is not None or k in args.none_means:
            out[k] = tuple(v) if isinstance(v, list) else v
    return out
