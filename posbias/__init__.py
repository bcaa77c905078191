"""posbias: train, evaluate and diagnose extractive QA models with respect to position bias."""
__version__ = "0.1.0"

from .api import evaluate, export, load_config, predict, score, train  # noqa: E402,F401
