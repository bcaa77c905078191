"""Position bias of causal language models: `posbias diagnose generation` (Liu et al., TACL 2024)."""

BATCH_TOKENS = 8192
"""Padded tokens per forward batch by default: bounds activation memory whatever the prompt length."""
