"""posbias: train, evaluate and diagnose extractive QA models with respect to position bias."""
__version__ = "0.1.0"

from .api import (diagnose, evaluate, experiment_report, experiment_run, export, load_config, predict,  # noqa: E402,F401
                  score, train)
