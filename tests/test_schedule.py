"""tests/schedule.py: under pytest-xdist the longest test files are handed out first."""

from pathlib import Path
from types import SimpleNamespace

import schedule

TESTS = Path(__file__).resolve().parent


def item(name, test, alone=False):
    marker = SimpleNamespace(name="alone") if alone else None
    return SimpleNamespace(
        path=TESTS / name,
        nodeid=f"tests/{name}::{test}",
        get_closest_marker=lambda mark: marker if mark == "alone" else None,
    )


def test_a_workers_collection_puts_the_long_files_first_each_in_its_own_order():
    items = [item("test_docs.py", "a"), item("test_ladder.py", "a"), item("test_tools.py", "a"),
             item("test_ladder.py", "b"), item("test_docs.py", "b")]  # fmt: skip
    worker = SimpleNamespace(workerinput={})
    schedule.pytest_collection_modifyitems(worker, items)
    assert [i.nodeid for i in items] == [
        "tests/test_ladder.py::a", "tests/test_ladder.py::b", "tests/test_tools.py::a",
        "tests/test_docs.py::a", "tests/test_docs.py::b",
    ]  # fmt: skip
    alone = list(reversed(items))  # no worker: pytest's order stays
    schedule.pytest_collection_modifyitems(SimpleNamespace(), alone)
    assert alone[0].nodeid == "tests/test_docs.py::b"


def test_the_files_with_alone_tests_come_first_with_those_tests_at_their_head():
    items = [item("test_tools.py", "a"), item("test_load.py", "a"), item("test_load.py", "b", True),
             item("test_profile.py", "a"), item("test_profile.py", "b", True),
             item("test_profile.py", "c"), item("test_docs.py", "a")]  # fmt: skip
    schedule.pytest_collection_modifyitems(SimpleNamespace(workerinput={}), items)
    assert [i.nodeid for i in items] == [
        "tests/test_profile.py::b", "tests/test_profile.py::a", "tests/test_profile.py::c",
        "tests/test_load.py::b", "tests/test_load.py::a",
        "tests/test_tools.py::a", "tests/test_docs.py::a",
    ]  # fmt: skip


def test_the_controller_keeps_that_order_and_a_run_without_workers_is_untouched():
    xdist = SimpleNamespace(option=SimpleNamespace(numprocesses=2, loadscopereorder=True))
    schedule.pytest_configure(xdist)
    assert xdist.option.loadscopereorder is False
    plain = SimpleNamespace(option=SimpleNamespace(numprocesses=None, loadscopereorder=True))
    schedule.pytest_configure(plain)
    assert plain.option.loadscopereorder is True


def test_every_listed_file_exists():
    assert all((TESTS / name).is_file() for name in schedule.SECONDS), set(schedule.SECONDS)
