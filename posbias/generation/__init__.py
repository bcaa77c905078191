"""Position bias of causal language models: `posbias diagnose generation` (Liu et al., TACL 2024)."""
