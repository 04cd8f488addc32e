"""Turning measurements into answers: the table, crossovers, bench.csv, bench.png, JSON.

speedup = cpu median / accelerator median at the same point; the crossover is the smallest size
from which the accelerator wins at every larger size too. No torch; matplotlib only for the plot.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from mpslaunch.bench.timing import Timing

OK = "ok"
DOES_NOT_FIT = "does not fit"
FAILED = "failed"

CSV_COLUMNS = (
    "workload",
    "dtype",
    "device",
    "size",
    "status",
    "median_s",
    "p25_s",
    "p75_s",
    "iqr_s",
    "samples",
    "inner",
    "flops",
    "gflops",
    "speedup_vs_cpu",
    "note",
)

SIZE_LABEL = {"matvec": "m", "matmul": "m", "train": "batch"}
UNRELIABLE_SPREAD = 0.5  # an IQR above half the median: the samples disagree too much to trust
UNRELIABLE_NOTE = "unreliable: IQR above half the median"


@dataclass(frozen=True)
class Result:
    workload: str
    dtype: str
    device: str
    size: int
    status: str
    flops: float
    timing: Timing | None = None
    note: str = ""

    @property
    def unreliable(self) -> bool:
        return (
            self.timing is not None and self.timing.iqr_s > UNRELIABLE_SPREAD * self.timing.median_s
        )

    @property
    def gflops(self) -> float | None:
        if self.timing is None:
            return None
        return self.flops / self.timing.median_s / 1e9


@dataclass(frozen=True)
class Crossover:
    workload: str
    dtype: str
    device: str
    size: int | None  # first size of the accelerator's winning run; None if cpu wins at the end
    summary: str


# ---- derived numbers ------------------------------------------------------------------------


def _key(result: Result) -> tuple[str, str, int]:
    return result.workload, result.dtype, result.size


def speedups(results: Iterable[Result]) -> dict[int, float]:
    """id(result) -> cpu time / its time, for accelerator results with a cpu twin."""
    results = list(results)
    cpu_time = {
        _key(r): r.timing.median_s for r in results if r.device == "cpu" and r.timing is not None
    }
    return {
        id(r): cpu_time[_key(r)] / r.timing.median_s
        for r in results
        if r.device != "cpu" and r.timing is not None and _key(r) in cpu_time
    }


def crossovers(results: list[Result]) -> list[Crossover]:
    speedup = speedups(results)
    groups: dict[tuple[str, str, str], list[Result]] = {}
    for r in results:
        if id(r) in speedup:
            groups.setdefault((r.workload, r.dtype, r.device), []).append(r)
    return [
        _crossover(workload, dtype, device, sorted(group, key=lambda r: r.size), speedup)
        for (workload, dtype, device), group in groups.items()
    ]


def _crossover(
    workload: str, dtype: str, device: str, group: list[Result], speedup: dict[int, float]
) -> Crossover:
    label = SIZE_LABEL.get(workload, "size")
    wins = [speedup[id(r)] > 1.0 for r in group]
    first_of_winning_run = len(wins)
    while first_of_winning_run > 0 and wins[first_of_winning_run - 1]:
        first_of_winning_run -= 1
    largest = group[-1]
    at_largest = f"{speedup[id(largest)]:.3g}x at {label}={largest.size}"
    head = f"{workload} {dtype}, {device} vs cpu:"
    if first_of_winning_run == len(wins):
        return Crossover(
            workload,
            dtype,
            device,
            None,
            f"{head} cpu faster at the largest {label} measured ({at_largest})",
        )
    size = group[first_of_winning_run].size
    if first_of_winning_run == 0:
        text = f"{head} {device} faster at every {label} measured ({at_largest})"
    else:
        text = f"{head} cpu faster below {label}={size}, {device} faster from there ({at_largest})"
    return Crossover(workload, dtype, device, size, text)


# ---- flat rows (CSV and JSON share them) ----------------------------------------------------


def rows(results: list[Result]) -> list[dict[str, object]]:
    speedup = speedups(results)
    return [_row(r, speedup.get(id(r))) for r in results]


def _row(r: Result, speedup: float | None) -> dict[str, object]:
    t = r.timing
    return {
        "workload": r.workload,
        "dtype": r.dtype,
        "device": r.device,
        "size": r.size,
        "status": r.status,
        "median_s": t.median_s if t else None,
        "p25_s": t.p25_s if t else None,
        "p75_s": t.p75_s if t else None,
        "iqr_s": t.iqr_s if t else None,
        "samples": t.samples if t else None,
        "inner": t.inner if t else None,
        "flops": r.flops,
        "gflops": r.gflops,
        "speedup_vs_cpu": speedup,
        "note": r.note,
    }


def write_csv(results: list[Result], path: Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for row in rows(results):
            writer.writerow({k: ("" if v is None else v) for k, v in row.items()})


def write_json(results: list[Result], environment: dict[str, object], stream: TextIO) -> None:
    document = {
        "environment": environment,
        "results": rows(results),
        "crossovers": [c.__dict__ for c in crossovers(results)],
    }
    json.dump(document, stream, indent=2)
    stream.write("\n")


# ---- terminal table -------------------------------------------------------------------------


def format_seconds(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def format_table(results: list[Result], environment: dict[str, object]) -> str:
    speedup = speedups(results)
    header = ("workload", "dtype", "size", "device", "time/op", "IQR", "GFLOP/s", "speedup")
    table = [header] + [_table_cells(r, speedup.get(id(r))) for r in results]
    # Rows that did not run end in one status text; it must not widen the number columns.
    widths = [
        max(len(row[i]) for row in table if i < len(row) - 1 or len(row) == len(header))
        for i in range(len(header))
    ]
    right_aligned = {2, 4, 5, 6, 7}
    lines = [_environment_line(environment)]
    for row, result in zip(table, [None, *results], strict=True):
        cells = [
            c.rjust(w) if i in right_aligned else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=False))
        ]  # a status row is shorter
        if len(row) < len(header):
            cells[-1] = row[-1]
        if result is not None and result.unreliable:
            cells.append(UNRELIABLE_NOTE)
        lines.append("  ".join(cells).rstrip())
    found = crossovers(results)
    if found:
        lines.append("")
        lines.extend(c.summary for c in found)
    elif all(r.device == "cpu" for r in results):
        lines.append("")
        lines.append("cpu only: no accelerator measured, so no speedup or crossover to report")
    return "\n".join(lines)


def _table_cells(r: Result, speedup: float | None) -> tuple[str, ...]:
    first = (r.workload, r.dtype, f"{SIZE_LABEL.get(r.workload, '')}={r.size}", r.device)
    if r.timing is None:
        return (*first, r.status if not r.note else f"{r.status}: {r.note}")
    relative = 100 * r.timing.iqr_s / r.timing.median_s
    spread = f"{relative:.0f}%" if relative < 1000 else ">999%"
    return (
        *first,
        format_seconds(r.timing.median_s),
        spread,
        f"{r.gflops:,.1f}",
        f"{speedup:.3g}x" if speedup is not None else "",
    )


def _environment_line(environment: dict[str, Any]) -> str:
    devices = environment.get("devices", {})
    described = "; ".join(f"{name}: {text}" for name, text in dict(devices).items())
    return f"torch {environment.get('torch', '?')} | {described}"


# ---- plot -----------------------------------------------------------------------------------


def write_png(results: list[Result], environment: dict[str, object], path: Path) -> None:
    import matplotlib.pyplot as plt

    figure = draw(results, environment)
    figure.savefig(path, dpi=120)
    plt.close(figure)


def draw(results: list[Result], environment: dict[str, object]):
    """One row per workload: log-log time per op vs size, and speedup vs size."""
    import matplotlib

    matplotlib.use("Agg")  # files only; works with no display
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r.workload for r in results))
    speedup = speedups(results)
    columns = 2 if speedup else 1  # cpu only: no speedup panels to draw
    figure, axes = plt.subplots(
        len(workloads), columns, figsize=(5.5 * columns, 3.8 * len(workloads)), squeeze=False
    )
    # One color per device and dtype, the same in every panel.
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    keys = list(dict.fromkeys((r.device, r.dtype) for r in results))
    colors = {key: palette[i % len(palette)] for i, key in enumerate(keys)}
    for row, workload in enumerate(workloads):
        mine = [r for r in results if r.workload == workload]
        sizes = sorted({r.size for r in mine})
        _plot_times(axes[row][0], workload, mine, colors)
        _label_sizes(axes[row][0], workload, sizes)
        if columns == 2:
            _plot_speedups(axes[row][1], workload, mine, speedup, colors, sizes)
    figure.suptitle(f"mpslaunch bench | {_environment_line(environment)}", fontsize=9)
    figure.tight_layout()
    return figure


def _series(results: list[Result]) -> dict[tuple[str, str], list[Result]]:
    series: dict[tuple[str, str], list[Result]] = {}
    for r in results:
        if r.timing is not None:
            series.setdefault((r.device, r.dtype), []).append(r)
    return {k: sorted(v, key=lambda r: r.size) for k, v in series.items()}


def _label_sizes(ax, workload: str, sizes: list[int]) -> None:
    from matplotlib.ticker import NullLocator

    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(s) for s in sizes])  # the measured sizes, not powers of 2
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel(SIZE_LABEL.get(workload, "size"))
    ax.grid(True, which="major", alpha=0.3)


def _plot_times(ax, workload: str, results: list[Result], colors: dict) -> None:
    for (device, dtype), points in _series(results).items():
        timings = [r.timing for r in points if r.timing]  # all of them: _series keeps timed ones
        medians = [t.median_s for t in timings]
        spread = [
            [t.median_s - t.p25_s for t in timings],
            [t.p75_s - t.median_s for t in timings],
        ]
        ax.errorbar(
            [r.size for r in points],
            medians,
            yerr=spread,
            marker="o",
            capsize=3,
            color=colors[(device, dtype)],
            label=f"{device} {dtype}",
        )
    shaky = [r for r in results if r.unreliable]
    _circle(ax, [r.size for r in shaky], [r.timing.median_s for r in shaky if r.timing])
    ax.set_yscale("log")
    ax.set_ylabel("seconds per op (median, IQR bars)")
    ax.set_title(f"{workload}: time per op")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


def _circle(ax, sizes: list[int], values: list[float]) -> None:
    """Ring the unreliable points, with one legend entry that says what the ring means."""
    if sizes:
        ax.scatter(
            sizes,
            values,
            s=150,
            facecolors="none",
            edgecolors="red",
            linewidths=1.5,
            zorder=3,
            label=UNRELIABLE_NOTE,
        )


def _plot_speedups(
    ax,
    workload: str,
    results: list[Result],
    speedup: dict[int, float],
    colors: dict,
    sizes: list[int],
) -> None:
    for (device, dtype), points in _series(results).items():
        points = [r for r in points if id(r) in speedup]
        if points:
            ax.plot(
                [r.size for r in points],
                [speedup[id(r)] for r in points],
                marker="o",
                color=colors[(device, dtype)],
                label=f"{device} {dtype}",
            )
    # A speedup is as unreliable as either of its two times.
    shaky_cpu = {_key(r) for r in results if r.device == "cpu" and r.unreliable}
    shaky = [r for r in results if id(r) in speedup and (r.unreliable or _key(r) in shaky_cpu)]
    _circle(ax, [r.size for r in shaky], [speedup[id(r)] for r in shaky])
    ax.set_title(f"{workload}: speedup over cpu")
    if ax.get_legend_handles_labels()[0]:
        _label_sizes(ax, workload, sizes)
        ax.set_yscale("log")
        ax.set_ylabel("cpu time / accelerator time")
        ax.axhline(1.0, color="black", linewidth=1, linestyle="--")
        ax.legend(fontsize=8)
    else:
        ax.set_axis_off()
        ax.text(
            0.5,
            0.5,
            "no accelerator and cpu result\nat the same sizes",
            ha="center",
            va="center",
            transform=ax.transAxes,
        )
