"""A summary's rows read back, for people: numbers from cells, the effect of a step over the
previous one as one cell, the busy and inactive marks, and the terminal table. The tag pages
(tag_page.py), the README (readme.py), the charts and the ladder page use the same cells, so
they say the same thing; a step's effect over a rung other than the file before it (its
`after`) names that rung."""

import math

from speed_ladder import ladder
from speed_ladder.records import mfu_problem


def number(v) -> float | None:
    """A summary cell as a float; None when empty or not a number."""
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def text(v) -> str | None:
    """A text cell; None when empty."""
    return v if isinstance(v, str) and v.strip() else None


def speedup_text(s: float) -> str:
    return f"{s:.2f}x" if s < 10 else f"{s:.1f}x"


def short_tps(v: float) -> str:
    """'412.7K' for 412,662 tok/s; '950' below a thousand."""
    return f"{v / 1000:.1f}K" if v >= 1000 else f"{v:.0f}"


def describe(df) -> str:
    """'<device name>, preset <p>, torch <v>' from the summary rows that have them."""
    rows = df.to_dict("records")

    def first(col):
        return next((r.get(col) for r in rows if isinstance(r.get(col), str) and r.get(col)), None)

    dev, preset, torch_v = first("device_name"), first("preset"), first("torch_version")
    bits = [dev, f"preset {preset}" if preset else None, f"torch {torch_v}" if torch_v else None]
    return ", ".join(b for b in bits if b)


def pooled_text(rows: list[dict]) -> str | None:
    """A line saying the tag's ok rows come from more than one machine (their `hosts`, pooled
    by SPEED_LADDER_HOST_ID: machine.py), or None."""
    hosts = set()
    for r in rows:
        if r.get("status") == "ok" and isinstance(r.get("hosts"), str):
            hosts.update(h for h in r["hosts"].split(",") if h)
    if len(hosts) < 2:
        return None
    return (
        f"Pooled: these runs come from {len(hosts)} machines of this kind "
        "(SPEED_LADDER_HOST_ID; each row's `hosts` in summary.csv), so a step's gain over the "
        "previous one also holds any difference between the machines."
    )


def mfu_flag(row: dict) -> str | None:
    """Why a summary row's MFU is not to be shown as a number, or None: its `mfu_invalid`, or
    an `mfu` outside (0, 1] (a summary without `mfu_invalid` may hold one)."""
    if row.get("status") != "ok":
        return None
    if isinstance(row.get("mfu_invalid"), str) and row["mfu_invalid"]:
        return row["mfu_invalid"]
    return mfu_problem(number(row.get("mfu")))


def inactive(row: dict) -> str | None:
    """'inactive here: <reason>' for a step whose records say it does nothing on this device."""
    if row.get("step_active") is not False:
        return None
    why = text(row.get("inactive_reason"))
    return "inactive here" + (f": {why}" if why else "")


def ratio_text(ratio, lo, hi) -> str:
    """'1.12x [1.08-1.15]', or '1.12x' without an interval."""
    r, a, b = number(ratio), number(lo), number(hi)
    if r is None:
        return "–"
    return f"{r:.2f}x" + (f" [{a:.2f}-{b:.2f}]" if a is not None and b is not None else "")


def percent_text(v, lo=None, hi=None) -> str:
    """'87% [85-90%]', or '87%' without an interval; '–' without a value."""
    r, a, b = number(v), number(lo), number(hi)
    if r is None:
        return "–"
    return f"{r:.0%}" + (f" [{a * 100:.0f}-{b:.0%}]" if a is not None and b is not None else "")


def effect_text(row: dict, prefix: str = "gain_vs_prev", verdict: str = "verdict",
                one_round: bool = True) -> str:  # fmt: skip
    """This step over the previous one: '1.12x [1.08-1.15] faster', '0.99x [0.95-1.03] no
    change', '1.01x (one round: no interval)' ('1.01x' without `one_round`, for a table whose
    note says it once), '–' for the first step or no result."""
    if row.get("status") != "ok" or number(row.get(prefix)) is None:
        return "–"
    cell = ratio_text(row.get(prefix), row.get(f"{prefix}_lo"), row.get(f"{prefix}_hi"))
    v = text(row.get(verdict))
    if v == "one round: no interval":
        return f"{cell} ({v})" if one_round else cell
    if v == "inactive" or inactive(row):  # measured all the same, no verdict; `inactive()`: why
        return f"{cell} (inactive here)"
    return f"{cell} {v}" if v else cell


def effect_cell(row: dict, one_round: bool = True) -> str:
    """effect_text, with 'vs 12: ' first where the step's effect is over another rung than the
    file before it (its `after` in the registry), which a "vs previous step" column would hide."""
    cell, base = effect_text(row, one_round=one_round), text(row.get("prev_step"))
    steps = list(ladder.rungs())
    skipping = {s.num for s, skip in zip(steps, ladder.skips(steps), strict=True) if skip}
    return f"vs {base}: {cell}" if cell != "–" and base and row.get("step") in skipping else cell


def busy_text(row: dict) -> str | None:
    """'busy: 2/3 runs, up to 1.30 cores' when other processes were busy during its runs."""
    n = int(number(row.get("busy_runs")) or 0)
    if row.get("status") != "ok" or n <= 0:
        return None
    load = number(row.get("other_load_max"))
    most = f", up to {load:.2f} cores" if load is not None else ""
    return f"busy: {n}/{int(number(row.get('runs')) or n)} run(s){most} used by other processes"


def floor_text(rows: list[dict]) -> str | None:
    """'noise floor 1.8% (A/A control: ...)' from the rows that have one."""
    for r in rows:
        f = number(r.get("noise_floor"))
        if f is not None:
            return f"noise floor {f:.1%} ({text(r.get('noise_source')) or 'measured'})"
    return None


def _add_scaling(head: list, lines: list[list], rows: list[dict]) -> None:
    """A `scaling` column after tok/s, for a tag of N processes (rows that have one)."""
    if not any(number(r.get("scaling_efficiency")) is not None for r in rows):
        return
    head.insert(3, "scaling")
    for cells, r in zip(lines, rows, strict=True):
        eff = "-"
        if r.get("status") == "ok":
            lo, hi = r.get("scaling_efficiency_lo"), r.get("scaling_efficiency_hi")
            eff = percent_text(r.get("scaling_efficiency"), lo, hi).replace("–", "-")
        cells.insert(3, eff)


def format_table(df) -> str:
    """The summary as a fixed-width text table for the terminal; an invalid MFU is `invalid`,
    with the reason below the table, and so are busy and inactive steps."""

    def num(v, fmt):
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)

    head = ["step", "title", "tok/s", "vs previous", "speedup", "peak GiB", "MFU", "val loss",
            "status", "runs"]  # fmt: skip
    rows = df.to_dict("records")
    lines, flags = [], []
    for r in rows:
        status = r["status"]
        if status not in ("ok", "not run") and isinstance(r.get("reason"), str):
            status = f"{status}: {r['reason'][:60]}"
        flag = mfu_flag(r)
        mfu = number(r.get("mfu"))
        if flag:
            flags.append(f"MFU of step {r['step']} not shown: {flag}")
        for mark in (inactive(r), busy_text(r)):
            if mark and status == "ok":
                flags.append(f"step {r['step']}: {mark}")
        lines.append(
            [
                r["step"],
                str(r["title"])[:42],
                num(r["tokens_per_sec_median"], "{:,.0f}"),
                effect_cell(r).replace("–", "-"),
                num(r["speedup_vs_00"], "{:.2f}x"),
                num(r["peak_reserved_gib"], "{:.2f}"),
                "invalid" if flag else num(None if mfu is None else mfu * 100, "{:.1f}%"),
                num(r["val_loss"], "{:.3f}"),
                status + (" (busy)" if busy_text(r) else ""),
                str(r["runs"]),
            ]
        )
    _add_scaling(head, lines, rows)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines, strict=False)]
    right = {2, 4, 5, 6, 7, 9} if len(head) == 10 else {2, 5, 6, 7, 8, 10}

    def fmt(cells):
        return "  ".join(
            str(c).rjust(w) if i in right else str(c).ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=False))
        ).rstrip()

    floor = floor_text(rows)
    notes = [floor] if floor else []
    return "\n".join([fmt(head), fmt(["-" * w for w in widths]), *map(fmt, lines), *flags, *notes])


PARITY_CELL = {"ok": "ok", "off": "**off**", "not comparable": "n/c"}


def parity_cell(row: dict) -> str:
    """`ok`, `**off**`, `n/c` (the rule does not hold here) or `–` (no previous step, no
    losses, no result): the summary's `parity`, for a markdown table."""
    if row.get("status") != "ok":
        return "–"
    return PARITY_CELL.get(text(row.get("parity")) or "", "–")


def parity_short(row: dict) -> str:
    """'with dropout 0.1' / 'on preset cpu': why a `not comparable` row's rule does not hold,
    from its `parity_detail` ('max |loss difference| X, not comparable with dropout 0.1: ...')."""
    d = text(row.get("parity_detail")) or ""
    i = d.find("not comparable")
    return d[i + len("not comparable") :].split(":")[0].strip() if i >= 0 else "see parity_detail"


def parity_text(row: dict) -> str:
    """The parity cell with its numbers, for the ladder page: 'ok: max |loss difference|
    1.91e-06 <= 0.0001', '**off**: <the detail>', 'n/c: with dropout 0.1', or '–'."""
    cell = parity_cell(row)
    d = text(row.get("parity_detail")) or ""
    if cell == "ok":
        return f"ok: {d.split(' (')[0]}" if d else cell
    if cell == "**off**":
        return f"**off**: {d}" if d else cell
    if cell == "n/c":
        return f"n/c: {parity_short(row)}"
    return cell
