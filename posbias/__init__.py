"""posbias: train, evaluate and diagnose extractive QA and token-classification (NER, POS) models
with respect to position bias.

`import posbias` loads no torch: the API functions below import the heavy libraries when called.
"""
from .version import __version__  # noqa: F401

from .api import (data_stats, diagnose, diagnose_generation, diagnose_retrieval, evaluate,  # noqa: E402
                  experiment_copy, experiment_report, experiment_run, explain_attention, export, load_config, predict, score,
                  train)

__all__ = ["data_stats", "diagnose", "diagnose_generation", "diagnose_retrieval", "evaluate", "experiment_copy", "experiment_report",
           "experiment_run", "explain_attention", "export", "load_config", "predict", "score", "train"]
