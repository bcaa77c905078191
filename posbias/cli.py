"""Thin argparse front: every subcommand calls one function of `posbias.api`.

The parser names no task: each registered task (`posbias.registry.TASKS`, entry-point plug-ins
included) adds its own arguments to the commands it takes (`posbias.tasks.Task.add_cli_arguments`),
and each diagnosis of models no task trains (`posbias.registry.DIAGNOSES`) its sub-parser of
`diagnose`. Building the parser and reading a config load no torch: `posbias --help`, `--version`,
an argument error or a config mistake are answered in about a second; `posbias.api` loads the rest
on use.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import yaml

from . import devices
from .arguments import (DEVICE_HELP, PRECISION_HELP, Ordered, bootstrap_samples, chosen_options,  # noqa: F401
                        conll_format_args, device_args, gpus, integer, model_arg, overrides_arg, points,
                        positive_int, seed_int, unit_float, verdict_args)
from .errors import ConfigError, PosbiasError, known_failure
from .records import unicode_problem
from .registry import DIAGNOSES, TASKS
from .utils import json_text
from .version import __version__

SUBCOMMANDS = ["train", "evaluate", "predict", "score", "export", "diagnose", "explain", "demo", "experiment", "data"]
# `experiment collect`'s exit code when some runs have not finished (0: all have; 2: an error).
COLLECT_UNFINISHED = 3
_Ordered, _gpus, _options = Ordered, gpus, chosen_options  # the names tests and scripts know


def _print(obj) -> None:
    print(json_text(obj, indent=2))  # NaN and ±inf as null: valid JSON for the next program


def _registered(registry) -> list:
    """Every entry of a registry, plug-ins included; a plug-in that fails to import is named on
    stderr and left out, so that `--help` and the other commands still answer."""
    try:
        return registry.values()
    except ConfigError as e:
        print(f"posbias: warning: {e}", file=sys.stderr)
        return registry.values()  # the plug-ins are looked for once per process: the rest are in


# ---- the parser: one small function per command

class Parser(argparse.ArgumentParser):
    """argparse's parser, its errors in the one-line form of every other posbias error, `posbias:
    error: MESSAGE (see: COMMAND --help)`, and exit 2: not the usage block argparse prints first. Its
    sub-parsers are of this class too (argparse makes them with the parent's class); `--help` is
    argparse's own."""

    def error(self, message: str):
        message = " ".join(str(message).split())  # one line, whatever the value held
        self.exit(2, f"posbias: error: {message} (see: {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The whole command line (the CLI reference in the docs is generated from it)."""
    diagnoses = " and ".join(d.cli_help.split(" (")[0] for d in _registered(DIAGNOSES))
    ap = Parser(prog="posbias", description=(
        "Train, evaluate and diagnose models for position bias: extractive QA and token-classification "
        f"(NER, POS) models it trains, and {diagnoses} it diagnoses as they are. Configs are YAML files or "
        "bundled preset names (demo, tiny, ...) with key.sub=value overrides."))
    ap.add_argument("--version", action="version", version=f"posbias {__version__}",
                    help="print the version of posbias and exit")
    ap.add_argument("-q", "--quiet", action="store_true",
                    help="no progress output (bars on a terminal, periodic lines in a log file); results still print")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    tasks = _registered(TASKS)
    _train_parser(sub, tasks)
    _evaluate_parser(sub, tasks)
    _predict_parser(sub, tasks)
    _diagnose_parser(sub, tasks, _registered(DIAGNOSES))
    _score_parser(sub, tasks)
    _export_parser(sub, tasks)
    _explain_parser(sub)
    _experiment_parser(sub)
    _data_parser(sub)
    _demo_parser(sub)
    return ap


def _task_parsers(sub, command: str, help_text: str, entries) -> dict:
    """`posbias COMMAND TASK ...`: one sub-parser per task that takes the command, returned by task
    object (the task's own arguments still to add)."""
    p = sub.add_parser(command, help=help_text, description=f"{help_text}; the task's own options: "
                                                           f"posbias {command} TASK --help")
    sp = p.add_subparsers(dest="task", required=True, metavar="TASK")
    return {t: sp.add_parser(t.name, help=f"{help_text} ({t.cli_help})")
            for t in entries if command in getattr(t, "cli_commands", ())}


def _model_help(task) -> str:
    return f"posbias checkpoint or Hugging Face *{task.hf_suffix} folder"


def _train_parser(sub, tasks) -> None:
    for task, p in _task_parsers(sub, "train", "train a model", tasks).items():
        p.add_argument("-c", "--config", required=True,
                       help="YAML file or preset name (demo, tiny, conll2003_minilm, ...)")
        overrides_arg(p, "key.sub=value overrides, e.g. train.lr=1e-4")
        device_args(p)
        p.add_argument("--resume", nargs="?", const="auto", default=None,
                       help="continue from a checkpoint folder (default: <output_dir>/checkpoints/last)")
        p.add_argument("--overwrite", action="store_true", help="start afresh in an output_dir that holds a run")
        _json_arg(p, "the run summary")
        task.add_cli_arguments("train", p)


def _json_arg(p, what: str) -> None:
    p.add_argument("--json", action="store_true",
                   help=f"print {what} as JSON (every number) instead of a short summary and the next step")


def _evaluate_parser(sub, tasks) -> None:
    for task, p in _task_parsers(sub, "evaluate", "evaluate a checkpoint on a data file", tasks).items():
        model_arg(p, _model_help(task))
        task.add_cli_arguments("evaluate", p)
        p.add_argument("--output-dir", default=None, help="write predictions and metrics.json here")
        overrides_arg(p, "evaluation overrides, e.g. data.max_seq_len=256")
        device_args(p)
        _json_arg(p, "the metrics")


def _predict_parser(sub, tasks) -> None:
    for task, p in _task_parsers(sub, "predict", "predict with a checkpoint", tasks).items():
        model_arg(p, _model_help(task))
        task.add_cli_arguments("predict", p)
        device_args(p)


def _diagnose_parser(sub, tasks, diagnoses) -> None:
    """A task's diagnosis gets the shared --model, verdict and device options; another diagnosis
    (an embedding model's: `posbias.registry.DIAGNOSES`) adds all of its own."""
    parsers = _task_parsers(sub, "diagnose", "position-bias analyses of a model", [*tasks, *diagnoses])
    for entry, p in parsers.items():
        if entry in diagnoses:
            entry.add_cli_arguments("diagnose", p)
            continue
        model_arg(p, _model_help(entry))
        entry.add_cli_arguments("diagnose", p)
        verdict_args(p, f"{entry.unit}s")
        device_args(p)


def _score_parser(sub, tasks) -> None:
    for task, p in _task_parsers(sub, "score", "score a predictions file without a model", tasks).items():
        task.add_cli_arguments("score", p)


def _export_parser(sub, tasks) -> None:
    classes = " / ".join(f"AutoModel{t.hf_suffix}" for t in tasks)
    p = sub.add_parser("export", help=f"checkpoint -> Hugging Face {classes} folder")
    model_arg(p, "posbias checkpoint")
    p.add_argument("--out", required=True, help="the new folder to write (it must not exist, or be empty)")


def _explain_parser(sub) -> None:
    p = sub.add_parser("explain", help="look inside a model: DyReF's query attention map")
    xs = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    q = xs.add_parser("attention", help="DyReF (dynamic_query): max over layers and heads of the start/end "
                                        "queries' attention to every token, as a 2 x N heat map PNG (paper Fig. 3)")
    model_arg(q, "posbias checkpoint with the dynamic_query head")
    q.add_argument("--question", required=True, help="the question")
    q.add_argument("--context", required=True, help="the passage the model reads")
    q.add_argument("--answer", default=None, help="gold answer text (its tokens are marked in bold)")
    q.add_argument("--output-dir", required=True, help="writes attention.png and attention.json")
    q.add_argument("--device", default="auto", help=DEVICE_HELP.split(";")[0])


def _experiment_parser(sub) -> None:
    p = sub.add_parser("experiment", help="multi-seed method comparisons: run a grid, report it")
    ex = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    _experiment_run_parser(ex)
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
    q.add_argument("dir", help="the experiment folder (its experiment.sqlite)")
    q.add_argument("--bootstrap-samples", type=bootstrap_samples, default=10_000,
                   help="resamples of the paired bootstrap behind every interval (default 10000)")
    q.add_argument("--only", nargs="+", metavar="PATTERN",
                   help="report only these runs (shell patterns of run names, e.g. 'n512/*')")
    q.add_argument("--baseline", metavar="METHOD", help="the method Δs are taken against (default: the spec's)")
    q.add_argument("--output-dir", help="write the report here instead of into DIR (e.g. a sub-comparison)")


def _experiment_run_parser(ex) -> None:
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
    q.add_argument("--gpus", type=gpus, default=None, metavar="0,1,...",
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


def _data_parser(sub) -> None:
    p = sub.add_parser("data", help="data sets: train-short/test-long QA sets, tagging statistics")
    ds = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    _data_build_parser(ds)
    q = ds.add_parser("stats", help="tagging: sentences, length distribution, entities / tags per class")
    q.add_argument("--data", nargs="+", required=True, help="CoNLL / CoNLL-U file(s)")
    q.add_argument("--output-dir", default=None, help="also write stats.md and stats.json here")
    conll_format_args(q)


def _data_build_parser(ds) -> None:
    q = ds.add_parser("build", help="QA: truncate contexts (D_L or D_L1~L2), optionally split, select by answer "
                                    "sentence, write SQuAD JSON + stats (with the answer-sentence distribution)")
    q.add_argument("--input", nargs="+", required=True, help="SQuAD/MRQA file(s); several = shards of one set")
    q.add_argument("--out", required=True, help="output folder: <name>.json or val.json/test.json, stats.md")
    q.add_argument("--truncate", type=positive_int, help="D_L: keep the first L words of every context")
    q.add_argument("--truncate-range", type=positive_int, nargs=2, action=Ordered, metavar=("L1", "L2"),
                   help="D_L1~L2: each instance keeps a random k in [L1, L2] words")
    q.add_argument("--split", action="store_true",
                   help="write random validation/test halves, drawn before truncation (§4.1): every "
                        "D set built from one file with one --seed has the same halves")
    q.add_argument("--by-article", action="store_true", help="split by whole articles")
    q.add_argument("--seed", type=seed_int, default=13, help="seed of the split, the truncation lengths "
                   "and --sample (default 13)")
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


def _demo_parser(sub) -> None:
    p = sub.add_parser("demo", help="fine-tune MiniLM on the bundled SQuAD slice and evaluate it")
    p.add_argument("--output-dir", default=None, help="default runs/demo")
    overrides_arg(p, "key.sub=value overrides of the demo config, e.g. train.max_steps=20")
    device_args(p)


def _format_options(args) -> dict:
    """`conll_format_args`' options that were given."""
    return {k: v for k, v in (("format", args.format), ("tag", args.tag), ("tag_column", args.tag_column),
                              ("scheme", args.scheme)) if v is not None}


# ---- the subcommands: one handler each, called with the parsed arguments and `posbias.api`.

def _train(args, api) -> None:
    res = api.train(args.config, args.overrides, resume=args.resume, overwrite=args.overwrite, task=args.task,
                    progress=not args.quiet)
    if args.json:
        _print(res)
    else:
        print(train_summary(res, args.task))


def _evaluate(args, api) -> None:
    res = api.evaluate(args.model, args.data, args.output_dir, args.overrides, task=args.task,
                       progress=not args.quiet)
    if args.json:
        _print(res)
    else:
        print(evaluate_summary(res, args.task, args.model, args.data, args.output_dir))


def _metrics_line(metrics: dict, limit: int = 4) -> str:
    """The scores of a metrics dict (its top-level floats, the first few) and the first count:
    `exact_match 71.25  f1 80.02  total 64`."""
    scores = [f"{k} {v:.2f}" for k, v in metrics.items() if isinstance(v, float)][:limit]
    count = next((f"{k} {v}" for k, v in metrics.items() if isinstance(v, int) and not isinstance(v, bool)), None)
    return "  ".join(scores + ([count] if count else []))


def _eval_file(out: Path) -> str:
    """The run's evaluation file (its saved config.yaml), for the next command; DATA when it has none."""
    try:
        saved = yaml.safe_load((out / "config.yaml").read_text(encoding="utf-8")) or {}
        spec = saved.get("data", {}).get("eval_file")
    except (OSError, yaml.YAMLError, AttributeError):
        spec = None
    return spec if isinstance(spec, str) else "DATA"


def train_summary(res: dict, task: str) -> str:
    """What `posbias train` prints: what trained, its best metric, where everything is, what to run next."""
    out = Path(res["output_dir"])
    metric = res.get("metric")
    best = (f"; best {metric} {res['best_metric']:.2f} at step {res['best_step']}"
            if metric and isinstance(res.get("best_metric"), (int, float)) else "")
    lines = [f"trained a {task} model: {res['steps']} steps in {res['train_seconds']:.0f} s of training "
             f"({res['wall_seconds']:.0f} s in all){best}"]
    if res.get("stopped_early_at"):
        lines.append(f"stopped early at step {res['stopped_early_at']} (train.early_stopping_patience)")
    if isinstance(res.get("eval"), dict):
        lines.append(f"eval:  {_metrics_line(res['eval'])}  (all: {out / 'eval' / 'metrics.json'})")
    lines.append(f"model: {out / 'best'}   logs: {out / 'train_log.jsonl'}, {out / 'run_info.json'}")
    lines.append(f"next: posbias diagnose {task} --model {out / 'best'} --data {_eval_file(out)} "
                 f"--output-dir {out / 'diagnosis'}")
    return "\n".join(lines)


def evaluate_summary(res: dict, task: str, model, data, output_dir) -> str:
    """What `posbias evaluate` prints: the main metrics, where they are written, what to run next."""
    lines = [f"evaluated {model} on {data}", f"metrics: {_metrics_line(res)}"]
    if output_dir:
        lines.append(f"predictions and metrics.json in {output_dir}")
    diagnosis = Path(output_dir) / "diagnosis" if output_dir else Path(model).parent / "diagnosis"
    lines.append(f"next: posbias diagnose {task} --model {model} --data {data} --output-dir {diagnosis}")
    return "\n".join(lines)


def _predict(args, api) -> None:
    options = _options(args)
    res = api.predict(args.model, data=args.data, output_dir=args.output_dir, overrides=args.overrides,
                      task=args.task, **options)
    shown = TASKS.get(args.task).prediction_summary(res, n_best=options.get("n_best"),
                                                    from_data=args.data is not None, output_dir=args.output_dir)
    if isinstance(shown, str):
        print(shown)
    else:
        _print(shown)


def _diagnose(args, api) -> None:
    res = api.diagnose(args.model, args.data, args.output_dir, overrides=getattr(args, "overrides", None),
                       task=args.task, progress=not args.quiet, bootstrap_samples=args.bootstrap_samples,
                       min_bucket=args.min_bucket, quality_floor=args.quality_floor, **_options(args))
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
    res = api.data_stats(args.data, args.output_dir, **_format_options(args))
    print(res["markdown"], end="")


def _data_build(args, api) -> None:
    stats = api.data_build(args.input, args.out, truncate=args.truncate,
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
    ("experiment", "collect"): _experiment_collect, ("experiment", "copy"): _experiment_copy,
    ("experiment", "report"): _experiment_report,
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
    except KeyboardInterrupt as e:  # Ctrl-C, or a run's SIGTERM / SIGINT (`interrupt.Interrupted`: 143 / 130)
        print(f"posbias: interrupted{f' ({e})' if str(e) else ''}", file=sys.stderr)
        return getattr(e, "exit_code", 130)
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
