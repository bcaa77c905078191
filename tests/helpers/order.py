"""The order the tests run in: `long_first` puts named groups at the head of pytest-xdist's shares and
the modules holding a slow test before the others within each share (tests/conftest.py's LONG_FIRST
says which and why)."""
from __future__ import annotations


def xdist_shares(n: int, workers: int) -> list[int]:
    """The sizes of the contiguous shares pytest-xdist's worksteal hands `workers` idle workers out of
    `n` tests, in order (its `check_schedule`: each takes what is left divided by the workers left)."""
    sizes = []
    for i in range(workers):
        sizes.append((n - sum(sizes)) // (workers - i))
    return sizes


def slow_modules_first(items: list, slow) -> list:
    """`items` with the modules holding an item `slow(item)` is true of before the others, each module's
    items together and in the order collected."""
    modules: dict = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    ordered = sorted(modules.values(), key=lambda group: not any(slow(item) for item in group))  # stable
    return [item for group in ordered for item in group]


def long_first(items: list, workers: int, groups, slow=None) -> list:
    """`items` reordered: group g of `groups` (node-id prefixes) at the head of share g % workers, in the
    order collected; with `slow` (a predicate), the rest of each share has the modules holding a slow
    item first (`slow_modules_first`); everything else keeps its order."""
    heads = [[] for _ in range(workers)]
    placed = set()
    for g, prefixes in enumerate(groups):
        for item in items:
            if id(item) not in placed and item.nodeid.startswith(prefixes):
                heads[g % workers].append(item)
                placed.add(id(item))
    rest = iter([item for item in items if id(item) not in placed])
    out = []
    for size, head in zip(xdist_shares(len(items), workers), heads):
        share = [item for _, item in zip(range(size - len(head)), rest)]
        out += head + (slow_modules_first(share, slow) if slow else share)
    return out + list(rest)
