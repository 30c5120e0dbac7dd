"""The order in which pytest-xdist hands the test files to its two workers: the longest first.

`--dist loadfile` keeps a file's tests in one worker and, by default, hands out the files with
the most tests first. Those are the quick ones (test_ladder's 70 checks of one shared fixture,
test_registry's); the files of few long tests (test_tools, test_sweep) came last, and one worker
ran them alone at the end while the other had nothing left. Here a worker's collection lists
the files by the seconds they took, longest first, and the controller hands them out in that
order: each worker takes the next file when it is free, as in longest-processing-time-first
scheduling. A file not listed comes after, in pytest's order.

The seconds: each file's tests summed (set-up, call and tear-down) in a fresh-clone fast-suite
run on 2026-11-27's 2-core EPYC, test_gpu_session.py still inside test_tools.py then (its tests
apart). Only the order matters; a file that grows or shrinks by a factor of two changes little.

The files that hold `alone` tests (tests/alone.py) come before all others, their `alone` tests
first: such a test waits until the other worker's test in flight has ended, and at the start that
test is another short `alone` one. Later it could be any: the 2026-11-27 run had a 2-s `alone`
test wait 25 s for a 45-s FSDP2 test, while its own worker did nothing.

Without pytest-xdist (`-p no:xdist`, tools/gpu_session.sh) the order is pytest's own.
"""

from alone import is_alone

SECONDS = {
    "test_ladder.py": 96, "test_sweep.py": 94, "test_gpu_session.py": 85, "test_tools.py": 55,
    "test_ddp.py": 53, "test_liger.py": 49, "test_faults.py": 39, "test_plot.py": 38,
    "test_fsdp2.py": 30, "test_lease.py": 27, "test_profile.py": 25, "test_budget.py": 21,
    "test_preload.py": 18, "test_alone.py": 18, "test_harness.py": 15, "test_portable.py": 14,
}  # fmt: skip


def pytest_configure(config):
    """The controller keeps the collection's order (pytest-xdist's --no-loadscope-reorder)."""
    if getattr(config.option, "numprocesses", None) and hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    """In a worker (the controller takes its collection from them): the files with `alone` tests
    first, those tests at their head; then the long files first, each file's tests in their own
    order."""
    if hasattr(config, "workerinput"):
        waits = {i.path for i in items if is_alone(i)}
        items.sort(key=lambda i: (i.path not in waits, -SECONDS.get(i.path.name, 0), str(i.path),
                                  not is_alone(i)))  # fmt: skip
        # stable: a file's tests otherwise keep their order
