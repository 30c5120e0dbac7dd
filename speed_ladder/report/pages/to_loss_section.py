"""The time-to-loss section of a tag's page (results/<tag>/README.md), where its folder holds a
to_loss.csv (report/to_loss.py): each rung's time and tokens to the target against its base,
the seeds' spread, and the two charts."""

from pathlib import Path

from speed_ladder.report.charts.loss_chart import LOSS_CURVES, TIME_TO_TARGET
from speed_ladder.report.to_loss import read


def _n(v, spec: str) -> str:
    return "–" if v is None else format(v, spec)


def lines(tag_dir: Path) -> list[str]:
    """The section's Markdown lines, or none."""
    rows = read(tag_dir)
    if not rows:
        return []
    first = rows[0]
    noise = first["noise"]
    spread = (
        f"the A/A control ran step {first['step']} with a second seed: its times to the target "
        f"lie {noise:.1%} apart, so a rung is *sooner* or *later* than its base only beyond that, "
        "and a rung whose idea did nothing here (*inactive here*) gets no verdict"
        if noise is not None
        else f"step {first['step']} ran with one seed: no spread, no verdict"
    )
    preset = f" (preset {first['preset']})" if first.get("preset") else ""
    out = [
        f"## Time to validation loss {first['target']:g}{preset}",
        "",
        "Each rung trained until its validation loss (on the same validation tokens for every "
        "rung) reached the target. *time*: its training time to where that loss crossed the "
        "target (read between the two evaluations around it), evaluation left out and the "
        "warm-up steps counted at the run's median step time; *warm-up*: those steps' own time "
        "(compiling), apart. Against the rung it builds "
        "on: the tokens it needed (*× tokens*), its tok/s (*× tok/s*) and how many times sooner "
        f"it got there (*sooner*). Noise: {spread}.",
        "",
        "| step | title | reached | tokens | time (s) | warm-up (s) | tok/s | × tokens | × tok/s "
        "| sooner | verdict |",
        "|---|---|---|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['step']} | {r['title']} | {r['reached']} | {_n(r['tokens'], ',.0f')} | "
            f"{_n(r['time_s'], '.1f')} | {_n(r['warmup_s'], '.1f')} | "
            f"{_n(r['tokens_per_sec'], ',.0f')} | {_n(r['tokens_ratio'], '.2f')} | "
            f"{_n(r['tps_ratio'], '.2f')} | {_n(r['time_speedup'], '.2f')} | "
            f"{r['verdict'] or ''} |"
        )
    out += ["", f"![validation loss against training time]({LOSS_CURVES})", "",
            f"![time to target per rung]({TIME_TO_TARGET})", ""]  # fmt: skip
    return out
