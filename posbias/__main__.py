"""`python -m posbias` (also what `accelerate launch -m posbias` and `torchrun -m posbias` run)."""
import sys

from .cli import main

sys.exit(main())
