"""The QA task: how the shared training loop, checkpoints, experiments and the fronts talk to
extractive QA (the `posbias.tasks.Task` protocol).
"""
from __future__ import annotations

from .. import arguments as cli_args
from ..errors import TrainingError, check_keywords
from ..registry import LABEL_POLICIES
from . import metrics
from .config import QAConfig, data_version
from .features import build_qa_features
from .readers import read_dataset

# The modules that load torch (the model, its heads, evaluation) are imported by the members that
# use them: importing the task, as the CLI and config checks do, stays without torch.

DATA_HELP = "SQuAD JSON(.gz) or MRQA JSONL(.gz)"


class QATask:
    name = "qa"
    config_class = QAConfig
    hf_suffix = "ForQuestionAnswering"
    unit = "question"
    predict_inputs = ("question", "context")
    cli_help = "extractive QA"
    cli_commands = ("train", "evaluate", "predict", "diagnose", "score")
    # Optional capabilities (`posbias.tasks.Task`) QA does not have.
    position_eval_checkpoint = None
    report_sections = None  # an optional capability (`posbias.tasks.Task`) QA does not have
    position_metrics = None
    report_figures = None

    def add_cli_arguments(self, command: str, parser) -> None:
        """`posbias COMMAND qa`'s own arguments (the CLI adds the shared ones: `posbias.cli`)."""
        getattr(self, f"_{command}_arguments")(parser)

    @staticmethod
    def _train_arguments(p) -> None:
        pass  # the config says everything

    @staticmethod
    def _evaluate_arguments(p) -> None:
        p.add_argument("--data", required=True, help=DATA_HELP)

    @staticmethod
    def _predict_arguments(p) -> None:
        p.add_argument("--question", help="the question to answer (with --context)")
        p.add_argument("--context", help="the passage that holds the answer")
        p.add_argument("--data", help="answer every question of this file instead: SQuAD JSON (answers not needed), "
                                      "MRQA JSONL, or a JSONL of questions, one object per line: "
                                      '{"id": "q1", "question": "...", "context": "..."} (id optional: line-N)')
        p.add_argument("--output-dir", default=None, help="write predictions.json (and nbest.json) here")
        p.add_argument("--n-best", type=cli_args.positive_int, default=None,
                       help="candidates to list (default decode.n_best)")
        cli_args.overrides_arg(p)
        cli_args.task_options(p, "question", "context", "n_best")

    @staticmethod
    def _diagnose_arguments(p) -> None:
        p.add_argument("--data", required=True, help=f"{DATA_HELP} with gold answers")
        p.add_argument("--output-dir", required=True, help="diagnosis.md/.html/.json and plots go here")
        p.add_argument("--x", dest="xs", type=cli_args.positive_int, nargs="+", default=[100],
                       help="X of the S_X(1)/S_X(2) split, in tokens")
        cli_args.overrides_arg(p, "evaluation overrides, e.g. data.max_seq_len=512")
        cli_args.task_options(p, "xs")

    @staticmethod
    def _score_arguments(p) -> None:
        p.add_argument("--data", required=True, help="the gold SQuAD/MRQA file")
        p.add_argument("--predictions", required=True, help="JSON object: question id -> answer text")
        p.add_argument("--na-probs", default=None, help="SQuAD v2 no-answer probabilities (id -> float)")
        p.add_argument("--version", default="auto", choices=["auto", "1.1", "2.0"],
                       help="SQuAD version to score as (auto: 2.0 when the gold file has unanswerable questions)")
        cli_args.task_options(p, "na_probs", "version")

    def load_tokenizer(self, cfg):
        from ..encoders import load_tokenizer  # loads torch: `posbias.qa` stays without it

        return load_tokenizer(cfg.model)

    def read(self, spec, cfg):
        return read_dataset(spec, cfg.data.on_bad_record)

    def run_info(self, cfg, train_ds, features) -> dict:
        # `null_answers`, not `has_impossible`: a v1 file whose truncation left questions without an
        # answer (`data build --keep-unanswerable`) trains and evaluates as v1.
        info = {"data_version": data_version(cfg, train_ds.null_answers)}
        debias = cfg.train.debias
        if debias is not None:
            # The full prior is in each checkpoint's posbias_model.json.
            prior = self._answer_prior(features, debias)
            info["debias"] = {"method": debias.method, "prior": prior.summary() if prior is not None else None}
            if prior is not None:  # what the prior enters the loss as: log b (Clark et al.) or b (Ko et al.'s code)
                info["debias"]["bias_term"] = debias.bias_term
        return info

    def train_features(self, examples, tokenizer, cfg, train_ds):
        d = cfg.data
        feats = build_qa_features(examples, tokenizer, max_seq_len=d.max_seq_len, stride=d.stride,
                                  max_query_len=d.max_query_len, context_first=d.context_first, train=True,
                                  version=data_version(cfg, train_ds.null_answers),
                                  label_policy=LABEL_POLICIES.get(d.label_policy, "data.label_policy"),
                                  unanswerable_windows=d.unanswerable_windows, seed=cfg.train.seed,
                                  source=train_ds.path)
        debias = cfg.train.debias
        if debias is not None:
            from .debias import PRIOR_METHODS, answer_prior, sentence_prior  # loads torch

            # Ko et al.'s bias model: the answer positions of the training windows (`posbias.qa.debias`),
            # by token offset, or by sentence of the examples' contexts.
            if debias.method in PRIOR_METHODS:
                prior = (sentence_prior(feats, examples, debias.smoothing) if debias.prior == "sentence"
                         else answer_prior(feats, d.max_seq_len, debias.smoothing))
                feats.answer_prior = prior  # travels to build_model and run_info with the features
        return feats

    @staticmethod
    def _answer_prior(features, debias):
        """The answer prior `train_features` put on `features` (None for a method without one)."""
        from .debias import PRIOR_METHODS  # loads torch: `posbias.qa` stays without it

        if debias.method not in PRIOR_METHODS:
            return None
        prior = getattr(features, "answer_prior", None)
        if prior is None:
            raise TrainingError("train.debias: the answer prior comes from the training features; build them "
                                "with train_features(examples, tokenizer, cfg, train_ds) under this config")
        return prior

    def build_model(self, cfg, tokenizer, train_ds, features):
        from .model import build_model  # loads torch: `posbias.qa` stays without it

        debias = cfg.train.debias
        return build_model(cfg.model, tokenizer, null_answer=data_version(cfg, train_ds.null_answers) == 2,
                           debias=debias, prior=self._answer_prior(features, debias) if debias is not None else None)

    def collate(self, features, idx, tokenizer, *, with_labels: bool = False) -> dict:
        from .collate import collate  # loads torch: `posbias.qa` stays without it

        return collate(features, idx, pad_id=tokenizer.pad_token_id, padding_side=tokenizer.padding_side,
                       with_labels=with_labels)

    def targets(self, batch: dict) -> dict:
        return {"start_positions": batch["start_positions"], "end_positions": batch["end_positions"]}

    def evaluate(self, model, tokenizer, cfg, dataset, out_dir=None, *, accelerator=None, progress=True) -> dict:
        from .evaluate import evaluate_dataset  # loads torch: `posbias.qa` stays without it

        return evaluate_dataset(model, tokenizer, cfg, dataset, out_dir, accelerator=accelerator, progress=progress)

    def main_metric(self, result: dict) -> tuple[str, float]:
        from .evaluate import main_metric  # loads torch: `posbias.qa` stays without it

        return "f1", main_metric(result)

    def load_model(self, path: str, cfg, meta: dict):
        from .model import model_from_checkpoint  # loads torch: `posbias.qa` stays without it

        return model_from_checkpoint(path, cfg, meta)

    def load_hf(self, path: str, config):
        from .model import load_hf_qa  # loads torch: `posbias.qa` stays without it

        return load_hf_qa(path, config)

    def evaluate_checkpoint(self, model, data, output_dir=None, overrides=None, progress=True) -> dict:
        from .evaluate import evaluate_checkpoint  # loads torch: `posbias.qa` stays without it

        return evaluate_checkpoint(model, data, output_dir, overrides=overrides, progress=progress)

    def predict_checkpoint(self, model, data=None, output_dir=None, *, overrides=None, progress=False,
                           n_best=None, question=None, context=None) -> dict:
        from .evaluate import predict_checkpoint  # loads torch: `posbias.qa` stays without it

        return predict_checkpoint(model, question, context, data, output_dir, n_best, overrides, progress)

    def prediction_summary(self, result: dict, *, n_best: int | None = None, from_data: bool = False,
                           output_dir=None) -> dict:
        """One question: its answer, probability and n-best texts; a file: question id -> answer."""
        if from_data:
            return {k: v["answer"] for k, v in result.items()}
        top = result["q0"]
        return {"answer": top["answer"], "probability": top["probability"], "start_char": top["start_char"],
                "nbest": [{"text": c["text"], "probability": c["probability"]} for c in top["nbest"][: n_best or 5]]}

    def score_files(self, data, predictions, *, na_probs=None, **options) -> dict:
        """Like the official SQuAD script; options: version, na_prob_thresh (`posbias.qa.metrics`)."""
        check_keywords(metrics.score_files, options, "score qa")
        return metrics.score_files(data, predictions, na_probs, **options)

    def diagnose(self, model, data, output_dir, *, overrides=None, progress=True, **options) -> dict:
        """Answer-position quartiles and answer sentences, S_X segments (`xs`), position-update counts
        (`posbias.qa.diagnose.diagnose`)."""
        from .diagnose import diagnose  # loads torch: `posbias.qa` stays without it

        check_keywords(diagnose, options, "diagnose qa")
        return diagnose(model, data, output_dir, overrides=overrides, progress=progress, **options)

    def export_hf(self, model, out_dir):
        from .model import export_hf  # loads torch: `posbias.qa` stays without it

        return export_hf(model, out_dir)

    def example_scores(self, dataset, eval_dir, run_info: dict) -> dict:
        """Question id -> (EM, F1) of the predictions in `eval_dir` (they already apply the v2 null
        threshold: scored as they are)."""
        import json
        from pathlib import Path

        preds = json.loads((Path(eval_dir) / "predictions.json").read_text(encoding="utf-8"))
        version = "2.0" if run_info.get("data_version") == 2 else "1.1"
        return metrics.per_question(dataset.gold(), preds, version=version)

    def improvement_rows(self, results: dict) -> list[dict]:
        """§6.2 of the Random Padding paper for an experiment's report (`posbias.qa.positions`)."""
        from .positions import improvement_rows  # loads torch: `posbias.qa` stays without it

        return improvement_rows(results)
