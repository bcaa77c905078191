"""Thin argparse front: every subcommand calls one function of `posbias.api`."""
from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from . import devices
from .errors import ConfigError, PosbiasError, known_failure
from .records import unicode_problem
from .utils import json_text

SUBCOMMANDS = ["train", "evaluate", "predict", "score", "export", "diagnose", "explain", "demo", "experiment", "data"]


def _print(obj) -> None:
    print(json_text(obj, indent=2))  # NaN and ±inf as null: valid JSON for the next program


# ---- option values: checked by argparse (`type=`), so a bad one is one usage line and exit 2
# before anything loads. Each checker carries `bad`: values it must refuse (the CLI test feeds
# them to every option that uses it).

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
# `experiment collect`'s exit code when some runs have not finished (0: all have; 2: an error).
COLLECT_UNFINISHED = 3


def _gpus(text: str) -> str:
    """`--gpus 0,1,2,3`: GPU indices, distinct (`posbias.experiment.cluster.parse_gpus`'s rule)."""
    parts = text.split(",")
    if not all(p.strip().isdigit() for p in parts) or len({int(p) for p in parts}) != len(parts):
        raise argparse.ArgumentTypeError(f"expected distinct GPU indices separated by commas (e.g. 0,1,2,3), "
                                         f"got {text!r}")
    return text


_gpus.bad = ["", "a", "0,,1", "0,0", "-1", "1.5", "cuda:0"]


class _Ordered(argparse.Action):
    """`nargs=2` values that must be LOW <= HIGH (`--truncate-range L1 L2`, `--quantiles`)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if values[0] > values[1]:
            parser.error(f"argument {option_string}: the first value must be <= the second, got {values[0]} {values[1]}")
        setattr(namespace, self.dest, values)



# The built-in tasks' sub-commands (argparse needs them before any task is imported: `posbias --help`
# loads no torch); what each does is the task's own (`posbias.tasks.Task`).
TASKS = {"qa": "extractive QA", "tagging": "token classification: NER, POS",
         "retrieval": "sentence-embedding retrievers ranking passages"}
EVAL_DATA_HELP = {"qa": "SQuAD JSON(.gz) or MRQA JSONL(.gz)", "tagging": "CoNLL / CoNLL-U file (or several shards)"}


def _tasks(sub, name, help_text, tasks=("qa", "tagging")):
    """`posbias NAME TASK ...`: one sub-parser per task, returned by task name."""
    p = sub.add_parser(name, help=help_text)
    sp = p.add_subparsers(dest="task", required=True, metavar="TASK")
    return {t: sp.add_parser(t, help=f"{help_text} ({TASKS[t]})") for t in tasks}


def _task_options(p, *names: str, none_means: tuple[str, ...] = ()) -> None:
    """The arguments of a task's sub-parser that go to the API function as the task's own options
    (`posbias.tasks.Task`): by their dest names; one left at None is not passed, unless it is in
    `none_means` (None has a meaning there: `--all-sentences` is quantiles None)."""
    p.set_defaults(task_options=names, none_means=none_means)


def _options(args) -> dict:
    """The task options of the parsed command (`_task_options`), lists as tuples."""
    out = {}
    for k in getattr(args, "task_options", ()):
        if not hasattr(args, k):  # default=SUPPRESS: the API function's own default applies
            continue
        v = getattr(args, k)
        if v is not None or k in args.none_means:
            out[k] = tuple(v) if isinstance(v, list) else v
    return out


def _verdict_args(p, examples: str) -> None:
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


def _model_arg(p, what="posbias checkpoint or Hugging Face *ForQuestionAnswering / *ForTokenClassification folder"):
    p.add_argument("--model", "--checkpoint", dest="model", required=True, help=what)


def _tagging_format_args(p):
    p.add_argument("--format", default=None, choices=["auto", "conll", "conllu"],
                   help="data format (default: the model's data.format, else auto)")
    p.add_argument("--tag", default=None, choices=["upos", "xpos"], help="CoNLL-U column to score")
    p.add_argument("--tag-column", type=integer, default=None, help="CoNLL column of the tag (default: last)")
    p.add_argument("--scheme", default=None, choices=["auto", "iob1", "iob2", "bioes", "none"],
                   help="tag scheme of the gold file (none = POS-style labels)")


DEVICE_HELP = ("where the model runs: auto (a CUDA GPU when torch sees one, else the CPU), cpu, cuda, cuda:N, mps; "
               "the same as the override train.device=...")


PRECISION_HELP = ("numeric precision: fp32, bf16, fp16, or auto (bf16 where the CPU has AMX-BF16 or AVX512-BF16 "
                  "or the GPU supports bf16, else fp32; recommended on GPUs); training: the override "
                  "train.mixed_precision=... (without it, accelerate launch's --mixed_precision or config, else fp32), "
                  "evaluation, prediction and diagnosis: train.eval_precision=...")


def _device_arg(p):
    p.add_argument("--device", default=None, help=DEVICE_HELP)
    p.add_argument("--precision", default=None, choices=["fp32", "bf16", "fp16", "auto"], help=PRECISION_HELP)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="posbias", description=(
        "Train, evaluate and diagnose extractive QA and token-classification (NER, POS) models with "
        "respect to position bias. Configs are YAML files or bundled preset names (demo, tiny, ...) with "
        "key.sub=value overrides."))
    ap.add_argument("-q", "--quiet", action="store_true",
                    help="no progress output (bars on a terminal, periodic lines in a log file); results still print")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    for p in _tasks(sub, "train", "train a model").values():
        p.add_argument("-c", "--config", required=True, help="YAML file or preset name (demo, tiny, conll2003_minilm, ...)")
        p.add_argument("overrides", nargs="*", help="key.sub=value overrides, e.g. train.lr=1e-4")
        _device_arg(p)
        p.add_argument("--resume", nargs="?", const="auto", default=None,
                       help="continue from a checkpoint folder (default: <output_dir>/checkpoints/last)")
        p.add_argument("--overwrite", action="store_true", help="start afresh in an output_dir that holds a run")

    for task, p in _tasks(sub, "evaluate", "evaluate a checkpoint on a data file").items():
        _model_arg(p)
        p.add_argument("--data", required=True, help=EVAL_DATA_HELP[task])
        p.add_argument("--output-dir", default=None, help="write predictions and metrics.json here")
        p.add_argument("overrides", nargs="*", help="evaluation overrides, e.g. data.max_seq_len=256")
        _device_arg(p)

    ps = _tasks(sub, "predict", "predict with a checkpoint")
    p = ps["qa"]
    _model_arg(p)
    p.add_argument("--question")
    p.add_argument("--context")
    p.add_argument("--data", help="answer every question of this file instead")
    p.add_argument("--output-dir", default=None)
    p.add_argument("--n-best", type=positive_int, default=None, help="candidates to list (default decode.n_best)")
    p.add_argument("overrides", nargs="*")
    _device_arg(p)
    _task_options(p, "question", "context", "n_best")
    p = ps["tagging"]
    _model_arg(p)
    p.add_argument("--text", help="raw text: split into words, tagged, entities with character offsets")
    p.add_argument("--data", help="tag every sentence of this CoNLL / CoNLL-U file instead")
    p.add_argument("--output-dir", default=None, help="write predictions.conll and predictions.jsonl here")
    p.add_argument("overrides", nargs="*")
    _device_arg(p)
    _task_options(p, "text")

    ps = _tasks(sub, "diagnose", "position-bias analyses of a model", tasks=("qa", "tagging", "retrieval"))
    p = ps["qa"]
    _model_arg(p, "posbias checkpoint or Hugging Face *ForQuestionAnswering folder")
    p.add_argument("--data", required=True)
    p.add_argument("--output-dir", required=True)
    p.add_argument("--x", dest="xs", type=positive_int, nargs="+", default=[100],
                   help="X of the S_X(1)/S_X(2) split, in tokens")
    _verdict_args(p, "questions")
    p.add_argument("overrides", nargs="*", help="evaluation overrides, e.g. data.max_seq_len=512")
    _device_arg(p)
    _task_options(p, "xs")
    p = ps["tagging"]
    _model_arg(p, "posbias checkpoint or Hugging Face *ForTokenClassification folder")
    p.add_argument("--data", required=True, help="the test split (CoNLL / CoNLL-U) with gold tags")
    p.add_argument("--output-dir", required=True, help="diagnosis.md/.html/.json and plots go here")
    p.add_argument("--k-max", type=positive_int, default=10, help="duplicate each sentence k = 1..K times (default 10)")
    subset = p.add_mutually_exclusive_group()
    subset.add_argument("--quantiles", type=unit_float, nargs=2, action=_Ordered, default=argparse.SUPPRESS,
                        metavar=("LOW", "HIGH"), help="D*: sentences whose length lies between these quantiles of "
                                                      "the model's data.length_pool (default: the quantiles the "
                                                      "model trained on, its data.length_quantiles, else Q1 Q3)")
    subset.add_argument("--all-sentences", dest="quantiles", action="store_const", const=None, default=argparse.SUPPRESS,
                        help="no length subset: evaluate every sentence that fits")
    p.add_argument("--modes", nargs="+", default=["duplicate", "shift"], choices=["duplicate", "shift"])
    p.add_argument("--max-len", type=positive_int, default=None, help="tokens per input (default: the model's position table)")
    p.add_argument("--batch-tokens", type=positive_int, default=16_384, help="padded tokens per forward batch")
    _verdict_args(p, "sentences")
    p.add_argument("overrides", nargs="*", help="data overrides, e.g. data.format=conll data.tag=xpos")
    _device_arg(p)
    _task_options(p, "k_max", "quantiles", "modes", "max_len", "batch_tokens", none_means=("quantiles",))
    p = ps["retrieval"]
    _model_arg(p, "sentence-transformers folder, plain Hugging Face encoder folder (mean pooling), `minilm` or a "
                  "cached Hub id")
    p.add_argument("--data", required=True, help="SQuAD JSON(.gz) or MRQA JSONL(.gz): questions with located answers")
    p.add_argument("--output-dir", required=True, help="diagnosis.md/.html/.json, ranks.json and plots go here")
    p.add_argument("--no-bm25", dest="bm25", action="store_false", help="leave out the BM25 baseline")
    p.add_argument("--no-chunks", dest="chunks", action="store_false",
                   help="leave out best-chunk (max-sim) scoring")
    p.add_argument("--chunk-tokens", type=positive_int, default=128, help="tokens per chunk for max-sim (default 128)")
    p.add_argument("--no-paired", dest="paired", action="store_false",
                   help="leave out the paired start/middle/end documents")
    p.add_argument("--max-length", type=positive_int, default=None,
                   help="tokens the model reads per text (default: the model's own, e.g. max_seq_length)")
    p.add_argument("--batch-size", type=positive_int, default=64, help="texts per forward batch (default 64)")
    p.add_argument("--max-queries", type=positive_int, default=None, help="the first N questions of the file only")
    p.add_argument("--cache-dir", default=None, help="keep embeddings here (safetensors) for the next run")
    p.add_argument("--seed", type=integer, default=0, help="the paired variant's filler order (default 0)")
    _verdict_args(p, "questions")
    p.add_argument("--device", default="auto", help=DEVICE_HELP)
    p.add_argument("--precision", default="auto", choices=["fp32", "bf16", "fp16", "auto"],
                   help="auto (default): bf16 where the hardware computes it natively, else fp32")
    _task_options(p, "bm25", "chunks", "chunk_tokens", "paired", "max_length", "batch_size", "max_queries",
                  "cache_dir", "seed", "device", "precision")

    ps = _tasks(sub, "score", "score a predictions file without a model")
    p = ps["qa"]
    p.add_argument("--data", required=True, help="the gold SQuAD/MRQA file")
    p.add_argument("--predictions", required=True, help="JSON object: question id -> answer text")
    p.add_argument("--na-probs", default=None, help="SQuAD v2 no-answer probabilities (id -> float)")
    p.add_argument("--version", default="auto", choices=["auto", "1.1", "2.0"])
    _task_options(p, "na_probs", "version")
    p = ps["tagging"]
    p.add_argument("--data", required=True, help="the gold CoNLL / CoNLL-U file")
    p.add_argument("--predictions", required=True,
                   help="CoNLL columns, one word per line: the word, then the predicted tag in the last column")
    _tagging_format_args(p)
    _task_options(p, "format", "tag", "tag_column", "scheme")

    p = sub.add_parser("export", help="checkpoint -> Hugging Face AutoModelForQuestionAnswering / "
                                      "AutoModelForTokenClassification folder")
    _model_arg(p, "posbias checkpoint")
    p.add_argument("--out", required=True)

    p = sub.add_parser("explain", help="look inside a model: DyReF's query attention map")
    xs = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    q = xs.add_parser("attention", help="DyReF (dynamic_query): max over layers and heads of the start/end "
                                        "queries' attention to every token, as a 2 x N heat map PNG (paper Fig. 3)")
    _model_arg(q, "posbias checkpoint with the dynamic_query head")
    q.add_argument("--question", required=True)
    q.add_argument("--context", required=True)
    q.add_argument("--answer", default=None, help="gold answer text (its tokens are marked in bold)")
    q.add_argument("--output-dir", required=True, help="writes attention.png and attention.json")
    q.add_argument("--device", default="auto", help=DEVICE_HELP.split(";")[0])

    p = sub.add_parser("experiment", help="multi-seed method comparisons: run a grid, report it")
    ex = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    q = ex.add_parser("run", help="run (or resume) every run of an experiment spec")
    q.add_argument("spec", help="experiment YAML, or the name of a bundled spec (e.g. smoke)")
    q.add_argument("--output-dir", default=None, help="default: the spec's output_dir")
    q.add_argument("--launcher", default="local", choices=["local", "accelerate", "submitit"],
                   help="local: in this process; accelerate: each run via `accelerate launch`; submitit: one "
                        "cluster job per unfinished run (a Slurm job array; pip install 'posbias[cluster]'), "
                        "waited for and recorded unless --no-wait (then: posbias experiment collect)")
    q.add_argument("--accelerate-args", default="", help="extra arguments for accelerate launch")
    q.add_argument("--submitit", nargs="+", default=None, metavar="KEY=VALUE",
                   help="submitit parameters for --launcher submitit, e.g. slurm_partition=gpu timeout_min=240 "
                        "gpus_per_node=1 cpus_per_task=8 slurm_array_parallelism=16 (cluster=local: jobs on "
                        "this machine)")
    q.add_argument("--gpus", type=_gpus, default=None, metavar="0,1,...",
                   help="one lane per GPU: an `experiment run` process per listed GPU, each seeing only its "
                        "GPU (CUDA_VISIBLE_DEVICES) and training, scoring and recording the runs it takes")
    q.add_argument("--dry-run", action="store_true",
                   help="write each run's config and print one command per run (a cluster job: it takes "
                        "the run's lock, trains and scores it; `experiment collect` records it)")
    q.add_argument("--no-store", dest="record", action="store_false",
                   help="train and score the runs in their folders (under their locks) without writing "
                        "experiment.sqlite: for jobs on other nodes (SQLite is not shared over network file "
                        "systems); `posbias experiment collect` records them")
    q.add_argument("--force", action="store_true", help="redo runs whose config changed")
    q.add_argument("--only", nargs="+", default=None, metavar="PATTERN",
                   help="run only these runs (shell patterns of run names, e.g. 'cp/*' rpp/seed2); "
                        "lets several machines share one grid (join their folders with `experiment copy`)")
    q.add_argument("--no-wait", dest="wait", action="store_false",
                   help="leave the runs other processes are training to them and return (default: wait "
                        "for them, taking over any whose process dies); any number of `experiment run` "
                        "processes may share one folder")
    q.add_argument("--device", default=None, help=DEVICE_HELP)
    q = ex.add_parser("collect", help="record the runs cluster jobs finished into the store and list the "
                                      "unfinished ones; never trains. Exit 0: every run finished; "
                                      f"{COLLECT_UNFINISHED}: some are not")
    q.add_argument("spec", help="experiment YAML, bundled spec name, or experiment folder (its experiment.yaml)")
    q.add_argument("--output-dir", default=None, help="default: the folder given, else the spec's output_dir")
    q.add_argument("--only", nargs="+", default=None, metavar="PATTERN", help="only these runs (shell patterns)")
    q = ex.add_parser("copy", help="copy finished runs' results (no checkpoints) into another experiment folder")
    q.add_argument("src", help="experiment folder holding experiment.sqlite")
    q.add_argument("dest", help="folder to archive into, restore into, or join with (created if missing)")
    q.add_argument("--force", action="store_true", help="replace runs finished in both with different configs")
    q = ex.add_parser("report", help="aggregate an experiment folder into report.md/.html + plots")
    q.add_argument("dir")
    q.add_argument("--bootstrap-samples", type=bootstrap_samples, default=10_000)
    q.add_argument("--only", nargs="+", metavar="PATTERN",
                   help="report only these runs (shell patterns of run names, e.g. 'n512/*')")
    q.add_argument("--baseline", metavar="METHOD", help="the method Δs are taken against (default: the spec's)")
    q.add_argument("--output-dir", help="write the report here instead of into DIR (e.g. a sub-comparison)")

    p = sub.add_parser("data", help="data sets: train-short/test-long QA sets, tagging statistics")
    ds = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    q = ds.add_parser("build", help="QA: truncate contexts (D_L or D_L1~L2), optionally split, select by answer "
                                    "sentence, write SQuAD JSON + stats (with the answer-sentence distribution)")
    q.add_argument("--input", nargs="+", required=True, help="SQuAD/MRQA file(s); several = shards of one set")
    q.add_argument("--out", required=True, help="output folder: <name>.json or val.json/test.json, stats.md")
    q.add_argument("--truncate", type=positive_int, help="D_L: keep the first L words of every context")
    q.add_argument("--truncate-range", type=positive_int, nargs=2, action=_Ordered, metavar=("L1", "L2"),
                   help="D_L1~L2: each instance keeps a random k in [L1, L2] words")
    q.add_argument("--split", action="store_true",
                   help="write random validation/test halves, drawn before truncation (§4.1): every "
                        "D set built from one file with one --seed has the same halves")
    q.add_argument("--by-article", action="store_true", help="split by whole articles")
    q.add_argument("--seed", type=seed_int, default=13)
    q.add_argument("--keep-unanswerable", action="store_true",
                   help="keep instances whose answers were all cut off, as is_impossible (the paper does "
                        "for train, App. B.2); a v1 input still writes a v1.1 file: training labels their "
                        "windows [CLS] (data.unanswerable_windows: cls) and evaluation stays v1")
    q.add_argument("--exclude-ambiguous", action="store_true",
                   help="drop questions flagged answer_start_ambiguous (the rebuilt SQuAD train set: their "
                        "answer_start is the answer text's first occurrence, maybe too early); implied by "
                        "--answer-sentence")
    q.add_argument("--name", default="data", help="file name without --split")
    q.add_argument("--sample", type=positive_int, default=None, metavar="N",
                   help="keep a seeded random subset of N instances of each written set (all when fewer), "
                        "in file order; drawn after --answer-sentence")
    q.add_argument("--answer-sentence", metavar="K", default=None,
                   help="keep the questions whose first gold answer starts in sentence K of its context: "
                        "1-based, K+ = K or later (e.g. 1, 2+); Ko et al. 2020's SQuAD-train^(k); sentences by "
                        "sentencex, in the context as written out (after the split and any truncation); "
                        "unanswerable questions never match. Implies --exclude-ambiguous. Matching random "
                        "control of the same size: the same command without --answer-sentence, with "
                        "--exclude-ambiguous and --sample M, M the instances this build wrote (N of --sample N, "
                        "or fewer when the filter left fewer: stats.md prints the control's --sample)")
    q = ds.add_parser("stats", help="tagging: sentences, length distribution, entities / tags per class")
    q.add_argument("--data", nargs="+", required=True, help="CoNLL / CoNLL-U file(s)")
    q.add_argument("--output-dir", default=None, help="also write stats.md and stats.json here")
    _tagging_format_args(q)

    p = sub.add_parser("demo", help="fine-tune MiniLM on the bundled SQuAD slice and evaluate it")
    p.add_argument("--output-dir", default=None, help="default runs/demo")
    p.add_argument("overrides", nargs="*")
    _device_arg(p)
    return ap


def _tagging_options(args) -> dict:
    return {k: v for k, v in (("format", args.format), ("tag", args.tag), ("tag_column", args.tag_column),
                              ("scheme", args.scheme)) if v is not None}


# ---- the subcommands: one handler each, called with the parsed arguments and `posbias.api`.

def _train(args, api) -> None:
    _print(api.train(args.config, args.overrides, resume=args.resume, overwrite=args.overwrite, task=args.task,
                     progress=not args.quiet))


def _evaluate(args, api) -> None:
    _print(api.evaluate(args.model, args.data, args.output_dir, args.overrides, task=args.task,
                        progress=not args.quiet))


def _predict(args, api) -> None:
    from .tasks import get_task  # loads torch and the tasks: `posbias --help` stays quick

    options = _options(args)
    res = api.predict(args.model, data=args.data, output_dir=args.output_dir, overrides=args.overrides,
                      task=args.task, **options)
    shown = get_task(args.task).prediction_summary(res, n_best=options.get("n_best"), from_data=args.data is not None,
                                                   output_dir=args.output_dir)
    if isinstance(shown, str):
        print(shown)
    else:
        _print(shown)


def _diagnose(args, api) -> None:
    if args.task == "retrieval":
        res = api.diagnose_retrieval(args.model, args.data, args.output_dir, progress=not args.quiet,
                                     bootstrap_samples=args.bootstrap_samples, min_bucket=args.min_bucket,
                                     quality_floor=args.quality_floor, **_options(args))
        if args.verbose:
            print((Path(args.output_dir) / "diagnosis.md").read_text(encoding="utf-8"))
        print("\n".join(res["verdict_lines"]))
        return
    res = api.diagnose(args.model, args.data, args.output_dir, overrides=args.overrides, task=args.task,
                       progress=not args.quiet, bootstrap_samples=args.bootstrap_samples, min_bucket=args.min_bucket,
                       quality_floor=args.quality_floor, **_options(args))
    if args.verbose:  # the whole report, then the verdict again at the bottom, where the eye lands
        print((Path(args.output_dir) / "diagnosis.md").read_text(encoding="utf-8"))
    print("\n".join(res["verdict_lines"]))


def _score(args, api) -> None:
    _print(api.score(args.data, args.predictions, task=args.task, **_options(args)))


def _export(args, api) -> None:
    print(api.export(args.model, args.out))


def _explain(args, api) -> None:
    res = api.explain_attention(args.model, args.question, args.context, args.output_dir, answer=args.answer,
                                device=args.device)
    print(f"answer: {res['answer']!r}; wrote {res['plot']} and attention.json")


def _experiment_run(args, api) -> int | None:
    from .experiment.cluster import parse_options  # the experiment layer: loaded on use

    extra = {"gpus": args.gpus} if args.gpus is not None else {}
    if not args.record:
        if args.gpus is not None or args.launcher == "submitit":
            raise ConfigError("--no-store is the job's side: it does not combine with --gpus or --launcher submitit")
        extra["record"] = False
    res = api.experiment_run(args.spec, args.output_dir, launcher=args.launcher,
                             accelerate_args=args.accelerate_args, dry_run=args.dry_run, force=args.force,
                             only=args.only, wait=args.wait, device=args.device, progress=not args.quiet,
                             launcher_options=parse_options(args.submitit), **extra)
    if "submitted" in res:
        return _print_submitted(res)
    if args.dry_run:
        for r in res["runs"]:
            print(f"{r['name']}\t{r['config_hash']}\t{r['command']}")
        return
    others = len(res["finished_by_others"])
    print(f"experiment {res['experiment']}: ran {len(res['ran'])}, skipped {len(res['skipped_finished'])} "
          f"finished{f', {others} finished by other processes' if others else ''}; "
          f"results in {res['output_dir']}/experiment.sqlite")
    if res["left_to_others"]:
        print(f"left to other processes: {' '.join(res['left_to_others'])}")
    print(f"next: posbias experiment report {res['output_dir']}")


def _print_submitted(res) -> int:
    held = f"; {len(res['held'])} held by running processes (left to them)" if res["held"] else ""
    print(f"experiment {res['experiment']}: submitted {len(res['submitted'])} job(s){held}; logs in {res['folder']}")
    if "unfinished" not in res:
        print(f"next, when the jobs are done: posbias experiment collect {res['output_dir']}")
        return 0
    for name, why in res["failed"].items():
        print(f"failed\t{name}\t{why}")
    return _print_collected(res)


def _print_collected(res) -> int:
    print(f"experiment {res['experiment']}: {len(res['finished']) + len(res['collected'])} run(s) finished "
          f"({len(res['collected'])} recorded now), {len(res['unfinished'])} unfinished; "
          f"results in {res['output_dir']}/experiment.sqlite")
    for r in res["unfinished"]:
        print(f"{r['name']}\t{r['status']}" + (f"\t{r['holder']}" if r["holder"] else ""))
    return COLLECT_UNFINISHED if res["unfinished"] else 0


def _experiment_collect(args, api) -> int:
    return _print_collected(api.experiment_collect(args.spec, args.output_dir, only=args.only))


def _experiment_copy(args, api) -> None:
    res = api.experiment_copy(args.src, args.dest, force=args.force)
    print(f"copied {len(res['copied'])} finished run(s) from {res['source']} to {res['destination']}"
          + (f" (replaced {len(res['replaced'])})" if res["replaced"] else "")
          + ("; its experiment.yaml replaced the destination's" if res.get("spec") == "replaced" else "")
          + ("; the destination's experiment.yaml kept (a grid is running there)" if res.get("spec") == "kept"
             else ""))


def _experiment_report(args, api) -> None:
    _print(api.experiment_report(args.dir, bootstrap_samples=args.bootstrap_samples, only=args.only,
                                 baseline=args.baseline, output_dir=args.output_dir))


def _data_stats(args, api) -> None:
    res = api.data_stats(args.data, args.output_dir, **_tagging_options(args))
    print(res["markdown"], end="")


def _data_build(args, api) -> None:
    from .qa.truncate import build_dataset  # loads torch (the QA task): `posbias --help` stays quick

    stats = build_dataset(args.input, args.out, truncate=args.truncate,
                          truncate_range=tuple(args.truncate_range) if args.truncate_range else None,
                          split=args.split, by_article=args.by_article, seed=args.seed,
                          keep_unanswerable=args.keep_unanswerable, exclude_ambiguous=args.exclude_ambiguous,
                          name=args.name, sample=args.sample, answer_sentence=args.answer_sentence)
    print((Path(args.out) / "stats.md").read_text(encoding="utf-8"), end="")
    print(f"wrote {', '.join(f'{k}.json' for k in stats['splits'])} to {args.out}")


def _demo(args, api) -> None:
    summary = api.demo(args.output_dir, args.overrides, progress=not args.quiet)
    ev = summary.get("eval", {})
    print(f"\nposbias demo: MiniLM fine-tuned on {summary['steps']} steps in "
          f"{summary['train_seconds']:.0f} s of training ({summary['wall_seconds']:.0f} s in all)")
    print(f"dev EM {ev.get('exact_match', float('nan')):.2f}  F1 {ev.get('f1', float('nan')):.2f}"
          f"  ({ev.get('total', 0)} questions)")
    out = summary["output_dir"]
    print(f"model:       {out}/best\npredictions: {out}/eval/predictions.json\n"
          f"logs:        {out}/train_log.jsonl, {out}/run_info.json")


# (command, action) -> handler; `action` None for commands without actions.
HANDLERS = {
    ("train", None): _train, ("evaluate", None): _evaluate, ("predict", None): _predict,
    ("diagnose", None): _diagnose, ("score", None): _score, ("export", None): _export,
    ("explain", "attention"): _explain, ("experiment", "run"): _experiment_run,
    ("experiment", "collect"): _experiment_collect, ("experiment", "copy"): _experiment_copy, ("experiment", "report"): _experiment_report,
    ("data", "build"): _data_build, ("data", "stats"): _data_stats, ("demo", None): _demo,
}


def run(args) -> int:
    from . import api  # the front calls down on use only (handlers get `api` as an argument)

    return HANDLERS[args.command, getattr(args, "action", None)](args, api) or 0  # a handler may return an exit code


def _in_flags(message: str, args) -> str:
    """An error's suggested config keys as this command's flags, where it has them (`score tagging`
    and `data stats` take --tag-column, --tag and --scheme rather than overrides)."""
    if not hasattr(args, "tag_column"):
        return message
    for key, flag in (("data.tag_column=", "--tag-column "), ("data.tag=", "--tag "), ("data.scheme ", "--scheme ")):
        message = message.replace(key, flag)
    return message


def main(argv=None) -> int:
    parser = build_parser()
    # Overrides may come after flags (`train qa -c x --resume a.b=1`), which argparse's positional
    # nargs="*" does not collect: pick such key=value leftovers up here.
    args, extra = parser.parse_known_args(argv)
    if extra:
        if not hasattr(args, "overrides") or not all("=" in x and not x.startswith("-") for x in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = list(args.overrides or []) + extra
    if getattr(args, "device", None) is not None and hasattr(args, "overrides"):  # --device X = train.device=X
        args.overrides = list(args.overrides or []) + [f"train.device={args.device}"]
    if getattr(args, "precision", None) is not None and hasattr(args, "overrides"):
        if args.command in ("train", "demo"):  # --precision X = train.mixed_precision=X, over accelerate's choice
            override = f"train.mixed_precision={args.precision}"
        else:  # --precision X = train.eval_precision=X
            override = f"train.eval_precision={args.precision}"
        args.overrides = list(args.overrides or []) + [override]
    for arg in argv if argv is not None else sys.argv[1:]:
        if reason := unicode_problem(arg, from_bytes=True):  # the terminal's bytes were not UTF-8, or a lone "\ud800"
            print(f"posbias: error: argument {arg!r} {reason}", file=sys.stderr)
            return 2
    # The one exception boundary: a failure the user can act on (bad input, a damaged file, a
    # read-only folder, a full disk) is one line and exit 2; anything else is a bug and keeps its
    # traceback. POSBIAS_DEBUG=1 shows the traceback of every failure that is not a PosbiasError.
    ok = False
    try:
        code = run(args)
        ok = code == 0
        return code
    except KeyboardInterrupt:
        print("posbias: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        message = known_failure(e)
        if message is None or (not isinstance(e, PosbiasError) and os.environ.get("POSBIAS_DEBUG")):
            raise
        print(f"posbias: error: {_in_flags(message, args)}", file=sys.stderr)
        return 2
    finally:
        if "torch.distributed" in sys.modules:  # a launcher's run (torchrun / accelerate launch) ends its group
            devices.end_launch(ok)


if __name__ == "__main__":
    sys.exit(main())
