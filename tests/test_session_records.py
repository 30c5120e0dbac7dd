"""tests/session_records.py: in a GPU session, the GPU tests read the sweep's records of this GPU
instead of running the same steps again, and only records that are this session's measurement of
the files as they are now count."""

import json

from session_records import ENV, session_record

from speed_ladder.ladder import rung
from speed_ladder.records import file_sha256


def record(step, **over):
    rec = {"step": step, "status": "ok", "preset": "gpt2-124m", "device_name": "NVIDIA H200",
           "sweep": {"script_sha256": file_sha256(rung(step).path)}, "peak": 1}  # fmt: skip
    rec.update(over)
    return rec


def test_the_newest_ok_record_of_the_file_as_it_is_on_this_gpu(tmp_path):
    tag = tmp_path / "nvidia-h200-x1"
    tag.mkdir()
    lines = [
        record("10", peak=1),
        record("10", peak=2),  # newer: appended later
        record("10", peak=3, status="oom"),
        record("10", peak=4, device_name="NVIDIA H100 80GB HBM3"),  # another GPU's
        record("10", peak=5, preset="tiny"),
        record("10", peak=6, sweep={"script_sha256": "0" * 64}),  # another version of the file
        record("12", peak=7),
    ]
    (tag / "runs.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + "\n{torn")
    env = {ENV: str(tmp_path)}
    assert session_record("10", "NVIDIA H200", env=env)["peak"] == 2
    assert session_record("12", "NVIDIA H200", env=env)["peak"] == 7
    assert session_record("13", "NVIDIA H200", env=env) is None  # not run: the test runs it
    assert session_record("10", "NVIDIA H100 80GB HBM3", env=env)["peak"] == 4
    assert session_record("10", "NVIDIA H200", env={}) is None  # not in a session
    assert session_record("10", "NVIDIA H200", env={ENV: str(tmp_path / "none")}) is None
