"""The optimizer and the step schedule of a training run: AdamW over two parameter groups (the usual
BERT recipe), and which batches each optimizer step takes on each process.

`param_groups` and `adamw` are public: a script that trains a posbias model its own way (the speed
benchmarks, a user's loop) builds the same optimizer the training loop builds:

    optimizer = adamw(param_groups(model, cfg.train.weight_decay), cfg.train.lr)
"""
from __future__ import annotations

import math

import torch

from .errors import ConfigError


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """The model's trainable parameters in two AdamW groups: weight decay on the matrices only.

    Biases and normalisation weights (1-D tensors) get no decay, the usual BERT recipe.

    Args:
        model: the model whose parameters are optimized (frozen ones, `requires_grad=False`, are left out).
        weight_decay: the decay of the group of matrices (`train.weight_decay`).

    Returns:
        `[{"params": matrices, "weight_decay": weight_decay}, {"params": the rest, "weight_decay": 0.0}]`,
        in the order of `model.parameters()`, as `torch.optim` optimizers take them.
    """
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def adamw(groups, lr: float) -> torch.optim.AdamW:
    """AdamW over `groups`, fused where the build supports it (on CPU: 40 ms instead of 147 ms per
    MiniLM step), else torch's default implementation.

    Args:
        groups: parameter groups (`param_groups`) or a list of parameters (not a generator: a failed
            fused attempt would have used it up).
        lr: the peak learning rate (`train.lr`); the schedule scales it per step.

    Returns:
        The optimizer, with torch's default betas and eps.
    """
    try:
        return torch.optim.AdamW(groups, lr=lr, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(groups, lr=lr)


class StepSchedule:
    """Which global batches each optimizer step consumes on this process."""

    def __init__(self, n_batches: int, world: int, accum: int):
        self.n_batches, self.world, self.accum = n_batches, world, accum
        per_step = world * accum
        # With several processes every one must run the same number of steps (DDP all-reduces), so
        # the last incomplete group of batches is dropped; one process keeps a short last step.
        self.steps_per_epoch = n_batches // per_step if world > 1 else math.ceil(n_batches / accum)
        if self.steps_per_epoch == 0:
            raise ConfigError(f"only {n_batches} batches per epoch: fewer than processes ({world}) x "
                              f"train.grad_accum ({accum}); lower train.batch_size")

    def micro_batches(self, local_step: int, rank: int) -> list[int]:
        base = local_step * self.world * self.accum
        idx = [base + a * self.world + rank for a in range(self.accum)]
        return [i for i in idx if i < self.n_batches]
