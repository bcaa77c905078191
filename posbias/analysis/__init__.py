"""Statistics, plots and report rendering shared by both tasks (position-update counts included)."""
