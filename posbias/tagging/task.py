"""The tagging task: how the shared training loop, checkpoints, experiments and the fronts talk to
token classification (NER with entity tags, POS with per-word labels); the `posbias.tasks.Task`
protocol.
"""
from __future__ import annotations

import argparse

from .. import arguments as cli_args
from ..config import resolve_path
from ..errors import ConfigError, check_keywords
from .config import POSITION_BATCH_TOKENS, TaggingConfig
from .features import build_tagging_features
from .inputs import label_list, read_for, tagging_tokenizer
from .metrics import main_metric, score_files, sentence_ratios
from .readers import read_tagging


class TaggingTask:
    name = "tagging"
    config_class = TaggingConfig
    hf_suffix = "ForTokenClassification"
    unit = "sentence"
    predict_inputs = ("text",)
    cli_help = "token classification: NER, POS"
    cli_commands = ("train", "evaluate", "predict", "diagnose", "score")
    improvement_rows = None  # an optional capability (`posbias.tasks.Task`) tagging does not have

    def report_sections(self, results: dict) -> list:
        """F1(α) on the position ids each run trained and on the others (`posbias.tagging.copies`)."""
        from .copies import copy_section  # loads NumPy's analysis helpers only

        section = copy_section(results)
        return [section] if section else []

    def add_cli_arguments(self, command: str, parser) -> None:
        """`posbias COMMAND tagging`'s own arguments (the CLI adds the shared ones: `posbias.cli`)."""
        getattr(self, f"_{command}_arguments")(parser)

    @staticmethod
    def _train_arguments(p) -> None:
        pass  # the config says everything

    @staticmethod
    def _evaluate_arguments(p) -> None:
        p.add_argument("--data", required=True, help="CoNLL / CoNLL-U file (or several shards)")

    @staticmethod
    def _predict_arguments(p) -> None:
        p.add_argument("--text", help="raw text: split into words, tagged, entities with character offsets")
        p.add_argument("--data", help="tag every sentence of this CoNLL / CoNLL-U file instead")
        p.add_argument("--output-dir", default=None, help="write predictions.conll and predictions.jsonl here")
        cli_args.overrides_arg(p)
        cli_args.task_options(p, "text")

    @staticmethod
    def _diagnose_arguments(p) -> None:
        p.add_argument("--data", required=True, help="the test split (CoNLL / CoNLL-U) with gold tags")
        p.add_argument("--output-dir", required=True, help="diagnosis.md/.html/.json and plots go here")
        p.add_argument("--k-max", type=cli_args.positive_int, default=10,
                       help="duplicate each sentence k = 1..K times (default 10)")
        subset = p.add_mutually_exclusive_group()
        subset.add_argument("--quantiles", type=cli_args.unit_float, nargs=2, action=cli_args.Ordered,
                            default=argparse.SUPPRESS, metavar=("LOW", "HIGH"),
                            help="D*: sentences whose length lies between these quantiles of the model's "
                                 "data.length_pool (default: the quantiles the model trained on, its "
                                 "data.length_quantiles, else Q1 Q3)")
        subset.add_argument("--all-sentences", dest="quantiles", action="store_const", const=None,
                            default=argparse.SUPPRESS, help="no length subset: evaluate every sentence that fits")
        p.add_argument("--modes", nargs="+", default=["duplicate", "shift"], choices=["duplicate", "shift"],
                       help="duplicate: each sentence k times in one input; shift: one copy whose position "
                            "ids start where copy k would (default both)")
        p.add_argument("--max-len", type=cli_args.positive_int, default=None,
                       help="tokens per input (default: the model's position table)")
        p.add_argument("--batch-tokens", type=cli_args.positive_int, default=POSITION_BATCH_TOKENS,
                       help=f"padded tokens per forward batch (default {POSITION_BATCH_TOKENS:,})")
        cli_args.overrides_arg(p, "data overrides, e.g. data.format=conll data.tag=xpos")
        cli_args.task_options(p, "k_max", "quantiles", "modes", "max_len", "batch_tokens", none_means=("quantiles",))

    @staticmethod
    def _score_arguments(p) -> None:
        p.add_argument("--data", required=True, help="the gold CoNLL / CoNLL-U file")
        p.add_argument("--predictions", required=True,
                       help="CoNLL columns, one word per line: the word, then the predicted tag in the last column")
        cli_args.conll_format_args(p)
        cli_args.task_options(p, "format", "tag", "tag_column", "scheme")

    def load_tokenizer(self, cfg):
        from ..encoders import local_dir  # loads torch: `posbias.tagging` stays without it

        m = cfg.model
        spec = m.tokenizer or m.name_or_path
        if not spec:
            raise ConfigError("model.tokenizer must be set when the encoder is built from model.encoder")
        return tagging_tokenizer(local_dir(resolve_path(spec), "model.tokenizer" if m.tokenizer else
                                           "model.name_or_path"))

    def read(self, spec, cfg):
        return read_for(spec, cfg)

    def run_info(self, cfg, train_ds, features) -> dict:
        return {"labels": label_list(train_ds), "scheme": train_ds.scheme, "source_scheme": train_ds.source_scheme,
                "train_length_subset": train_ds.length_subset}

    def train_features(self, examples, tokenizer, cfg, train_ds):
        d = cfg.data
        return build_tagging_features(examples, tokenizer, labels=label_list(train_ds), scheme=train_ds.scheme,
                                      max_seq_len=d.max_seq_len, stride=d.stride,
                                      label_subtokens=d.label_subtokens, source=train_ds.path)

    def build_model(self, cfg, tokenizer, train_ds, features):
        from .model import build_model  # loads torch: `posbias.tagging` stays without it

        return build_model(cfg.model, tokenizer, label_list(train_ds), train_ds.scheme)

    def collate(self, features, idx, tokenizer, *, with_labels: bool = False) -> dict:
        from .collate import collate  # loads torch: `posbias.tagging` stays without it

        return collate(features, idx, pad_id=tokenizer.pad_token_id, padding_side=tokenizer.padding_side,
                       with_labels=with_labels)

    def targets(self, batch: dict) -> dict:
        return {"labels": batch["labels"]}

    def evaluate(self, model, tokenizer, cfg, dataset, out_dir=None, *, accelerator=None, progress=True) -> dict:
        from .evaluate import evaluate_dataset  # loads torch: `posbias.tagging` stays without it

        return evaluate_dataset(model, tokenizer, cfg, dataset, out_dir, accelerator=accelerator, progress=progress)

    def main_metric(self, result: dict) -> tuple[str, float]:
        return main_metric(result)

    def load_model(self, path: str, cfg, meta: dict):
        from .model import model_from_checkpoint  # loads torch: `posbias.tagging` stays without it

        return model_from_checkpoint(path, cfg, meta)

    def load_hf(self, path: str, config):
        from .model import load_hf_tagger  # loads torch: `posbias.tagging` stays without it

        return load_hf_tagger(path, config)

    def evaluate_checkpoint(self, model, data, output_dir=None, overrides=None, progress=True) -> dict:
        from .evaluate import evaluate_checkpoint  # loads torch: `posbias.tagging` stays without it

        return evaluate_checkpoint(model, data, output_dir, overrides=overrides, progress=progress)

    def predict_checkpoint(self, model, data=None, output_dir=None, *, overrides=None, progress=False,
                           n_best=None, text=None) -> dict:
        from .evaluate import predict_checkpoint  # loads torch: `posbias.tagging` stays without it

        if n_best is not None:
            raise ConfigError("n_best is for QA models; a tagging model predicts one tag per word")
        if (text is None) == (data is None):
            raise ConfigError("predict tagging needs either --text or --data")
        return predict_checkpoint(model, text=text, data=data, output_dir=output_dir, overrides=overrides,
                                  progress=progress)

    def prediction_summary(self, result: dict, *, n_best: int | None = None, from_data: bool = False,
                           output_dir=None):
        """Raw text: its words, tags and entities; a file: a line counting what was tagged."""
        if not from_data:
            return result["text"]
        n = sum(len(v["words"]) for v in result.values())
        return f"tagged {len(result)} sentences ({n} words)" + (
            f"; wrote {output_dir}/predictions.conll" if output_dir else "")

    def score_files(self, data, predictions, **options) -> dict:
        """Options: format, tag, tag_column, scheme (`posbias.tagging.metrics.score_files`)."""
        check_keywords(score_files, options, "score tagging")
        return score_files(data, predictions, **options)

    def diagnose(self, model, data, output_dir, *, overrides=None, progress=True, **options) -> dict:
        """The duplicated-test-set evaluation F1(α) / Prec(α) / Rec(α) with shift mode, per class,
        consistency and data statistics (`posbias.tagging.diagnose.diagnose`)."""
        from .diagnose import diagnose  # loads torch: `posbias.tagging` stays without it

        check_keywords(diagnose, options, "diagnose tagging")
        return diagnose(model, data, output_dir, overrides=overrides, progress=progress, **options)

    def export_hf(self, model, out_dir):
        from .model import export_hf  # loads torch: `posbias.tagging` stays without it

        return export_hf(model, out_dir)

    def position_eval_checkpoint(self, model, data, out_dir, options: dict, overrides=None) -> dict:
        """The duplicated-test-set evaluation F1(α) of a checkpoint (`posbias diagnose tagging`)."""
        from .diagnose import diagnose  # loads torch: `posbias.tagging` stays without it

        opts = dict(options)
        if opts.get("quantiles") is not None:
            opts["quantiles"] = tuple(opts["quantiles"])
        return diagnose(model, data, out_dir, progress=False, overrides=overrides, **opts)

    def position_metrics(self, result: dict, alphas) -> dict:
        from .duplicated import experiment_metrics  # loads torch: `posbias.tagging` stays without it

        return experiment_metrics(result, tuple(alphas))

    def report_figures(self, results: dict, plots_dir) -> list:
        """(title, png) pairs for an experiment report: F1(α) by method for each position evaluation."""
        from .diagnose import plot_methods_by_alpha  # loads torch: `posbias.tagging` stays without it

        return plot_methods_by_alpha(results, plots_dir)

    def example_scores(self, dataset, eval_dir, run_info: dict) -> dict:
        """Sentence id -> (numerator, denominator) of the main metric (see
        `posbias.tagging.metrics.sentence_ratios`), from the predictions in `eval_dir`, in the
        scheme they were written and scored in (metrics.json's: the data's, for a BIOES model on
        IOB2 data; the model's in runs scored before)."""
        import json
        from pathlib import Path

        pred = read_tagging(str(Path(eval_dir) / "predictions.conll"), format="conll", tag_column=-1, scheme="none")
        gold = read_tagging(str(Path(eval_dir) / "predictions.conll"), format="conll", tag_column=-2, scheme="none")
        scored = Path(eval_dir) / "metrics.json"
        scheme = (json.loads(scored.read_text(encoding="utf-8")).get("scheme") if scored.is_file() else None) \
            or run_info.get("scheme", "none")
        ratios = sentence_ratios([e.tags for e in gold.examples], [e.tags for e in pred.examples], scheme)
        return {e.id: r for e, r in zip(dataset.examples, ratios)}
