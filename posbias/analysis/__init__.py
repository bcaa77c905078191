"""Position analyses, statistics and report rendering."""
from . import positions  # noqa: F401  (registers the position segmenters)
