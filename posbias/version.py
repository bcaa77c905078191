"""posbias's version, in a module of its own: the core records it in every output without importing
the package's front (`posbias/__init__.py` imports the API, which imports everything)."""
__version__ = "0.1.0"
