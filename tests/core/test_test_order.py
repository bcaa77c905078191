"""The longest tests start first (tests/conftest.py's LONG_FIRST): checked against pytest-xdist's own
worksteal scheduler, which decides what each worker runs first."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from helpers.order import long_first, xdist_shares


def _items(*nodeids):
    return [SimpleNamespace(nodeid=n) for n in nodeids]


COLLECTED = _items(*[f"tests/a/test_{i:02d}.py::t" for i in range(20)], "tests/core/test_wheel.py::one",
                   "tests/core/test_wheel.py::two", *[f"tests/z/test_{i:02d}.py::t" for i in range(7)],
                   "tests/generation/test_lm.py::gemma", "tests/generation/test_mspoe.py::mspoe")
GROUPS = (("tests/core/test_wheel.py::",), ("tests/generation/test_lm.py::gemma",
                                            "tests/generation/test_mspoe.py::mspoe"))


class _Node:
    """What the scheduler calls on a worker."""

    def __init__(self, name):
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.sent: list[int] = []

    def send_runtest_some(self, indices):
        self.sent += indices

    def shutdown(self):
        self.shutting_down = True


@pytest.mark.parametrize("workers", [2, 3, 4])
def test_each_group_is_the_first_a_worker_runs(workers):
    """pytest-xdist's WorkStealingScheduling, given the reordered collection, hands worker g first the
    tests of group g, in the order collected, whatever the number of workers."""
    from xdist.scheduler import WorkStealingScheduling

    ordered = long_first(COLLECTED, workers, GROUPS)
    assert sorted(i.nodeid for i in ordered) == sorted(i.nodeid for i in COLLECTED)  # nothing lost or doubled
    sched = WorkStealingScheduling(SimpleNamespace(getvalue=lambda name: [f"{workers}*popen"]))
    nodes = [_Node(f"gw{i}") for i in range(workers)]
    for node in nodes:
        sched.add_node(node)
    for node in nodes:
        sched.add_node_collection(node, [i.nodeid for i in ordered])
    sched.schedule()
    first = [[ordered[k].nodeid for k in node.sent[:2]] for node in nodes]
    assert first[0] == ["tests/core/test_wheel.py::one", "tests/core/test_wheel.py::two"]
    assert first[1] == ["tests/generation/test_lm.py::gemma", "tests/generation/test_mspoe.py::mspoe"]
    assert [len(node.sent) for node in nodes] == xdist_shares(len(COLLECTED), workers)


def test_one_process_runs_the_groups_first_and_the_rest_in_order():
    ordered = [i.nodeid for i in long_first(COLLECTED, 1, GROUPS)]
    assert ordered[:4] == ["tests/core/test_wheel.py::one", "tests/core/test_wheel.py::two",
                           "tests/generation/test_lm.py::gemma", "tests/generation/test_mspoe.py::mspoe"]
    assert ordered[4:] == [i.nodeid for i in COLLECTED if i.nodeid not in ordered[:4]]


def test_groups_missing_from_the_run_leave_the_order_alone():
    """`-m "not e2e"` or `-k` deselected them: the shares are the collection's, unchanged."""
    rest = _items(*[f"tests/a/test_{i:02d}.py::t" for i in range(10)])
    assert long_first(rest, 3, GROUPS) == rest


def test_within_a_share_the_modules_holding_a_slow_test_run_first():
    """The unit modules end each share: an idle worker steals short tests from the tail, not the last
    minute of someone's end-to-end module. Modules stay whole and in their order."""
    share = _items("tests/a/test_u.py::x", "tests/a/test_u.py::y", "tests/b/test_s.py::fast",
                   "tests/b/test_s.py::slow", "tests/c/test_u.py::z", "tests/d/test_s.py::slow")
    slow = {"tests/b/test_s.py::slow", "tests/d/test_s.py::slow"}
    ordered = [i.nodeid for i in long_first(share, 1, (), slow=lambda item: item.nodeid in slow)]
    assert ordered == ["tests/b/test_s.py::fast", "tests/b/test_s.py::slow", "tests/d/test_s.py::slow",
                       "tests/a/test_u.py::x", "tests/a/test_u.py::y", "tests/c/test_u.py::z"]


@pytest.mark.parametrize("workers", [2, 3])
def test_the_slow_modules_lead_every_share_after_its_group(workers):
    collected = _items(*[f"tests/u/test_{i:02d}.py::t" for i in range(12)], "tests/s/test_a.py::t",
                       "tests/s/test_b.py::t", *[f"tests/v/test_{i:02d}.py::t" for i in range(12)],
                       "tests/s/test_c.py::t")
    ordered = long_first(collected, workers, (), slow=lambda item: item.nodeid.startswith("tests/s/"))
    assert sorted(i.nodeid for i in ordered) == sorted(i.nodeid for i in collected)
    start = 0
    for size in xdist_shares(len(collected), workers):
        share = [i.nodeid.startswith("tests/s/") for i in ordered[start:start + size]]
        assert share == sorted(share, reverse=True)  # every slow one before every other
        start += size
