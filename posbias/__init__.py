"""posbias: train, evaluate and diagnose models for position bias: extractive QA and token-classification
(NER, POS) models it trains, sentence-embedding retrievers and generative language models it diagnoses.

`import posbias` loads no torch: the API functions below import the heavy libraries when called.
"""
from .version import __version__  # noqa: F401

from .api import (data_stats, diagnose, evaluate, experiment_copy, experiment_report, experiment_run,  # noqa: E402
                  explain_attention, export, load_config, predict, score, train)
from .generation.command import diagnose_generation  # noqa: E402  (each diagnosis owns its call)
from .retrieval.command import diagnose_retrieval  # noqa: E402

__all__ = ["data_stats", "diagnose", "diagnose_generation", "diagnose_retrieval", "evaluate", "experiment_copy", "experiment_report",
           "experiment_run", "explain_attention", "export", "load_config", "predict", "score", "train"]
