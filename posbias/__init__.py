"""posbias: train, evaluate and diagnose extractive QA and token-classification (NER, POS) models
with respect to position bias."""
from .version import __version__  # noqa: F401

from .api import (data_stats, diagnose, diagnose_retrieval, evaluate, experiment_copy, experiment_report, experiment_run, explain_attention, export,  # noqa: E402,F401
                  load_config, predict, score, train)
