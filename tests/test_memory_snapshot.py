"""`--memory-snapshot FILE` (measure/memory_snapshot.py): refused in one line on a CPU; on a GPU,
simulated here (torch.cuda.memory's two calls replaced), it records from the run's start and
writes the pickle once, per rank, and a failed write costs a note, never the record."""

import sys

import torch
from conftest import ROOT, run_script

from speed_ladder.measure import memory_snapshot

CUDA = torch.device("cuda")  # only compared: no GPU is touched


def test_a_cpu_refuses_the_flag_in_one_line(tmp_path):
    proc = run_script(
        [
            sys.executable,
            ROOT / "00_orig.py",
            "--device",
            "cpu",
            "--preset",
            "tiny",
            "--memory-snapshot",
            tmp_path / "x.pickle",
        ],
        timeout=120,
    )
    assert proc.returncode == 2 and not (tmp_path / "x.pickle").exists()
    assert proc.stderr.strip().splitlines() == [
        "error: --memory-snapshot records the CUDA allocator: no CUDA device here (cpu)"
    ]


def _fake(monkeypatch, fail=False):
    calls = []

    def dump(path):
        if fail:
            raise OSError(28, "No space left on device")
        calls.append(("dump", path))

    monkeypatch.setattr(
        torch.cuda.memory, "_record_memory_history", lambda **k: calls.append(("record", k))
    )
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", dump)
    return calls


def test_a_gpu_records_from_the_start_and_writes_once(tmp_path, monkeypatch):
    calls, notes = _fake(monkeypatch), []
    args = type("Args", (), {"memory_snapshot": str(tmp_path / "s.pickle")})()
    snap = memory_snapshot.from_args(args, CUDA)
    assert calls == [("record", {"max_entries": memory_snapshot.MAX_ENTRIES})]
    snap.dump(notes.append)
    snap.dump(notes.append)  # the window's end, then a failure: one file
    assert calls[1:] == [("dump", str(tmp_path / "s.pickle")), ("record", {"enabled": None})]
    assert len(notes) == 1 and "pytorch.org/memory_viz" in notes[0] and "no measurement" in notes[0]
    assert memory_snapshot.from_args(type("Args", (), {"memory_snapshot": None})(), CUDA) is None


def test_each_rank_writes_its_own_and_a_failed_write_is_a_note(tmp_path, monkeypatch):
    _fake(monkeypatch, fail=True)
    monkeypatch.setenv("RANK", "1")
    snap, notes = memory_snapshot.MemorySnapshot(str(tmp_path / "s.pickle"), CUDA), []
    assert snap.path == tmp_path / "s-rank1.pickle"
    snap.dump(notes.append)
    assert notes == ["memory snapshot not written: OSError: [Errno 28] No space left on device"]
