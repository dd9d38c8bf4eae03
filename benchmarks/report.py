"""Turn benchmark results into a Markdown table and a PNG chart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks import saving


def markdown(results: dict[str, Any]) -> str:
    """Render the per-step tables and the fresh-process figures."""
    machine = results["machine"]
    lines = [
        f"Python {machine['python']}, torch {machine['torch']}, {machine['processor']}, "
        f"{machine['threads']} thread. Medians over interleaved rounds, each the median step of "
        "its round; the extra per step is paired within rounds, with the 95% confidence "
        "interval of its median in brackets; ranges are min-max of the per-round paired values.",
        "",
    ]
    for key in ("tiny", "medium"):
        if key in results:
            lines += _workload_table(results[key])
    lines += [
        "### Fresh processes (CPU seconds)",
        "",
        "| program | median | min-max |",
        "| --- | ---: | ---: |",
    ]
    for name, values in results["fresh"].items():
        lines.append(
            f"| {name} | {values['median_s']:.2f} | {values['min_s']:.2f}-{values['max_s']:.2f} |"
        )
    lines.append("")
    lines += suites_markdown(results.get("suites", {}))
    return "\n".join(lines) + "\n"


def suites_markdown(suites: dict[str, Any]) -> list[str]:
    """Render each paired suite as a table, and the start-up figures."""
    lines: list[str] = []
    for key, suite in suites.items():
        if key == "startup":
            lines += _startup_table(suite)
            continue
        if key == "resume":
            lines += _resume_table(suite)
            continue
        if key == "saving":
            lines += ["### Stall per save (training states)", "", saving.markdown(suite), ""]
            continue
        lines += [
            f"### {suite['name']}",
            "",
            "| loop | per batch (ms) | per-batch ratio [95% CI] (min-max) | whole-call ratio "
            "[95% CI] | extra fixed per call (ms) [95% CI] |",
            "| --- | ---: | ---: | ---: | ---: |",
        ]
        for row in suite["rows"]:
            lines.append(
                f"| {row['loop']} | {row['per_batch_ms']:.2f} | {_ratio(row['ratio'], True)} "
                f"| {_ratio(row['whole_ratio'], False)} | {_ms(row['extra_fixed_ms'])} |"
            )
        lines.append("")
    return lines


def _ratio(values: dict[str, Any], with_range: bool) -> str:
    low, high = values["ci95"]
    text = f"{values['median']:.3f} [{low:.3f}, {high:.3f}]"
    if with_range:
        text += f" ({values['range'][0]:.3f}-{values['range'][1]:.3f})"
    return text


def _ms(values: dict[str, Any]) -> str:
    low, high = values["ci95"]
    return f"{values['median']:+.2f} [{low:+.2f}, {high:+.2f}]"


def _startup_table(figures: dict[str, Any]) -> list[str]:
    lines = [
        "### Start-up, fresh processes (wall ms, bytecode cached)",
        "",
        "| figure | median [95% CI] | min-max |",
        "| --- | ---: | ---: |",
    ]
    for name, values in figures.items():
        low, high = values["ci95"]
        lines.append(
            f"| {name} | {values['median']:.2f} [{low:.2f}, {high:.2f}] "
            f"| {values['range'][0]:.2f}-{values['range'][1]:.2f} |"
        )
    return [*lines, ""]


def _resume_table(suite: dict[str, Any]) -> list[str]:
    lines = [
        f"### {suite['name']}",
        "",
        "| stream | position | seconds [95% CI] | vs its first position [95% CI] | "
        "vs stateful at this position [95% CI] |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for row in suite["rows"]:
        low, high = row["seconds"]["ci95"]
        lines.append(
            f"| {row['stream']} | {row['position']:.0%} | {row['seconds']['median']:.3f} "
            f"[{low:.3f}, {high:.3f}] | {_ratio(row['vs_first_position'], False)} "
            f"| {_ratio(row['vs_stateful'], False)} |"
        )
    return [*lines, ""]


def _workload_table(workload: dict[str, Any]) -> list[str]:
    lines = [
        f"### {workload['name']}",
        "",
        "| loop | per step (µs) | extra per step (µs) | ratio | fixed per run (ms) | "
        "Python calls per step |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in workload["rows"]:
        low, high = row["extra_us_range"]
        ci_low, ci_high = row["extra_us_ci95"]
        ratio_low, ratio_high = row["ratio_range"]
        calls = row["calls_per_step"]
        lines.append(
            f"| {row['loop']} | {row['per_step_us']:.0f} | {row['extra_us']:+.1f} "
            f"[{ci_low:+.1f}, {ci_high:+.1f}] ({low:+.0f} to {high:+.0f}) "
            f"| {row['ratio']:.3f} ({ratio_low:.3f}-{ratio_high:.3f}) "
            f"| {row['fixed_ms']:.1f} | {'' if calls is None else f'{calls:.0f}'} |"
        )
    overhead = workload.get("logging_overhead")
    if overhead:
        lines += [
            "",
            f"Logging every 50 updates, paired against the default callbacks: per-step ratio "
            f"{overhead['per_step_ratio']:.3f} ({overhead['per_step_ratio_min']:.3f}-"
            f"{overhead['per_step_ratio_max']:.3f}), extra per run "
            f"{overhead['extra_fixed_ms']:+.1f} ms (the logging points and the CSV files).",
        ]
    return [*lines, ""]


def chart(results: dict[str, Any], path: Path) -> bool:
    """Draw the extra time per step of each loop; return False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    keys = [key for key in ("tiny", "medium") if key in results]
    if not keys:
        return True
    figure, axes = plt.subplots(1, len(keys), figsize=(6 * len(keys), 3.5), squeeze=False)
    for axis, key in zip(axes[0], keys, strict=True):
        rows = results[key]["rows"]
        names = [row["loop"] for row in rows]
        extra = [row["extra_us"] for row in rows]
        errors = [
            [row["extra_us"] - row["extra_us_range"][0] for row in rows],
            [row["extra_us_range"][1] - row["extra_us"] for row in rows],
        ]
        axis.barh(names, extra, xerr=errors, color="#4c72b0")
        axis.axvline(0, color="black", linewidth=0.8)
        axis.invert_yaxis()
        axis.set_xlabel("extra CPU time per step over the hand-written loop (µs)")
        axis.set_title(results[key]["name"])
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return True


def suites_chart(suites: dict[str, Any], path: Path) -> bool:
    """Draw each suite's per-batch ratios with their 95% intervals; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    keys = [key for key in suites if key not in ("startup", "resume", "saving")]
    if not keys:
        return True
    figure, axes = plt.subplots(len(keys), 1, figsize=(8, 2.2 * len(keys)), squeeze=False)
    for axis, key in zip(axes[:, 0], keys, strict=True):
        rows = suites[key]["rows"]
        medians = [row["ratio"]["median"] for row in rows]
        errors = [
            [row["ratio"]["median"] - row["ratio"]["ci95"][0] for row in rows],
            [row["ratio"]["ci95"][1] - row["ratio"]["median"] for row in rows],
        ]
        axis.barh([row["loop"] for row in rows], medians, xerr=errors, color="#4c72b0")
        axis.axvline(1.0, color="black", linewidth=0.8)
        axis.set_xlim(min(0.9, *medians), max(1.1, *medians))
        axis.invert_yaxis()
        axis.set_title(suites[key]["name"], fontsize=8)
    axes[-1, 0].set_xlabel("per-batch time / hand-written (median, 95% CI)")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return True
