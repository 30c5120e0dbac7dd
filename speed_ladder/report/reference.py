"""The published reference ladder: the single-A100 figures of Raschka's LLMs-from-scratch
(ch05/10), results/reference/published_a100_ladder.csv, which the charts draw beside this
project's measurements, always labelled as published figures, never as ours."""

from pathlib import Path

from speed_ladder.errors import warn
from speed_ladder.files import RESULTS

REFERENCE_CSV = RESULTS / "reference" / "published_a100_ladder.csv"
REF_LABEL = "published A100 figures (Raschka), not our measurement"


def read_reference(path: Path = REFERENCE_CSV):
    """The published reference figures, or None when the file is missing."""
    import pandas as pd

    if not Path(path).is_file():
        return None
    try:
        df = pd.read_csv(path, dtype={"step": str})
        df["step"] = df["step"].str.zfill(2)
        missing = {"tokens_per_sec", "reserved_memory_gb", "optimization", "hardware"} - set(df)
        if missing:
            raise KeyError(f"no column {sorted(missing)[0]!r}")
        df["tokens_per_sec"] = df["tokens_per_sec"].astype(float)
        df["reserved_memory_gb"] = df["reserved_memory_gb"].astype(float)
    except (OSError, ValueError, KeyError, AttributeError, pd.errors.ParserError) as e:
        warn(f"{path} unreadable ({e.__class__.__name__}: {e}); charts drawn without it")
        return None
    return df


def resolve_reference(reference):
    """`reference` as a chart takes it: "default" reads the published figures; anything else
    (a DataFrame, or None for none) is used as given."""
    return read_reference() if isinstance(reference, str) and reference == "default" else reference
