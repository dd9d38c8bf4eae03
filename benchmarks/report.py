"""Turn benchmark results into Markdown tables, PNG charts and the figures of the docs.

``python -m benchmarks.report`` rewrites the marked blocks of ``docs/performance.md`` from
``benchmarks/results/overhead.json`` (what ``make bench`` wrote): each block lies between
``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->`` and is replaced whole; a block whose
figures the results do not hold (a suite not run, or failed) is left as it was and named.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from benchmarks import call_cost, saving

RESULTS = Path(__file__).parent / "results" / "overhead.json"
DOCS = Path(__file__).parent.parent / "docs" / "performance.md"
SUITE_BLOCKS = ("train-2", "inference-1", "inference-2", "images", "loaders", "startup", "call-2")
BLOCK_NAMES = frozenset({"tiny", "medium", "calls", "fresh", "step-logging"}) | {
    f"suite-{key}" for key in (*SUITE_BLOCKS, "resume", "saving")
}
"""The names of the blocks ``blocks`` can render (the docs' markers must be among them)."""
BLOCK = re.compile(r"(<!-- bench:([\w.-]+) -->\n)(.*?)(<!-- /bench:\2 -->)", re.DOTALL)


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
    if "fresh" in results:
        lines += [
            "### Fresh processes (CPU seconds)",
            "",
            "| program | median | min-max |",
            "| --- | ---: | ---: |",
        ]
        for name, values in results["fresh"].items():
            lines.append(
                f"| {name} | {values['median_s']:.2f} "
                f"| {values['min_s']:.2f}-{values['max_s']:.2f} |"
            )
        lines.append("")
    lines += suites_markdown(results.get("suites", {}))
    for name, error in results.get("failed", {}).items():
        lines += [f"**{name} failed:**", "", "```", error.strip()[-2000:], "```", ""]
    return "\n".join(lines) + "\n"


def suites_markdown(suites: dict[str, Any]) -> list[str]:
    """Render each paired suite as a table, and the start-up figures."""
    lines: list[str] = []
    for key, suite in suites.items():
        lines += _suite_table(key, suite, heading=True)
    return lines


def _suite_table(key: str, suite: Any, heading: bool) -> list[str]:
    if key == "startup":
        lines = _startup_table(suite)
        return lines if heading else lines[2:]
    if key == "resume":
        lines = _resume_table(suite)
        return lines if heading else lines[2:]
    if key == "saving":
        lines = ["### Stall per save (training states)", "", saving.markdown(suite), ""]
        return lines if heading else lines[2:]
    if key == "loaders":
        return _loaders_table(suite, heading)
    if key == "call-2":
        lines = ["### Fixed cost per `train()` call, 2 processes", "", *call_cost.markdown(suite)]
        lines.append("")
        return lines if heading else lines[2:]
    lines = [f"### {suite['name']}", ""] if heading else []
    lines += [
        "| loop | per batch (ms) | per-batch ratio [95% CI] (min-max) | whole-call ratio "
        "[95% CI] | extra fixed per call (ms) [95% CI] |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for row in suite["rows"]:
        lines.append(
            f"| {row['loop']} | {row['per_batch_ms']:.2f} | {_ratio(row['ratio'], True)} "
            f"| {_ratio(row['whole_ratio'], False)} | {_ms(row['extra_fixed_ms'])} |"
        )
    return [*lines, ""]


def _loaders_table(suite: dict[str, Any], heading: bool) -> list[str]:
    lines = [f"### {suite['name']}", ""] if heading else []
    lines += [
        "| data | setting | per call (ms) | vs the best fixed setting [95% CI] |",
        "| --- | --- | ---: | ---: |",
    ]
    for row in suite["rows"]:
        lines.append(
            f"| {row['data']} | {row['setting']} | {row['per_call_ms']:.1f} "
            f"| {_ratio(row['vs_best'], False)} |"
        )
    return [*lines, ""]


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
    keys = [key for key in suites if key not in ("startup", "resume", "saving", "loaders")]
    keys = [key for key in keys if key != "call-2"]
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


def provenance(results: dict[str, Any], rounds: str = "") -> str:
    """The line under each generated block: when and how its figures were measured."""
    machine = results["machine"]
    quick = " `--quick`" if results.get("quick") else ""
    return (
        f"*Generated by `python -m benchmarks.report` from `make bench`{quick} of "
        f"{results.get('started', 'an unrecorded date')} (Python {machine['python']}, torch "
        f"{machine['torch']}, {machine['processor']}, {machine['threads']} thread"
        f"{rounds}).*"
    )


def blocks(results: dict[str, Any]) -> dict[str, str]:
    """The text of every block of the docs that ``results`` holds figures for, by name."""
    texts: dict[str, str] = {}
    for key in ("tiny", "medium"):
        if key in results:
            workload = results[key]
            rounds = f"; {workload.get('rounds', '?')} rounds of {workload.get('steps', '?')} steps"
            table = _workload_table(workload)[2:]  # without its heading
            while table and table[-1] == "":
                table.pop()
            overhead = [line for line in table if line.startswith("Logging every")]
            table = [line for line in table if line not in overhead]
            while table and table[-1] == "":
                table.pop()
            texts[key] = "\n".join([*table, "", provenance(results, rounds)])
    if "tiny" in results:
        texts["calls"] = _calls_sentence(results["tiny"])
        step_logging = _step_logging_table(results["tiny"])
        if step_logging:
            texts["step-logging"] = "\n".join([*step_logging, "", provenance(results)])
    if "fresh" in results:
        lines = ["| program | median (CPU s) | min-max |", "| --- | ---: | ---: |"]
        for name, values in results["fresh"].items():
            lines.append(
                f"| {name} | {values['median_s']:.2f} "
                f"| {values['min_s']:.2f}-{values['max_s']:.2f} |"
            )
        texts["fresh"] = "\n".join([*lines, "", provenance(results)])
    for key, suite in results.get("suites", {}).items():
        table = _suite_table(key, suite, heading=False)
        while table and table[-1] == "":
            table.pop()
        texts[f"suite-{key}"] = "\n".join([*table, "", provenance(results)])
    return texts


def _calls_sentence(workload: dict[str, Any]) -> str:
    calls = {row["loop"]: row["calls_per_step"] for row in workload["rows"]}
    base = calls.get("hand-written")
    default = calls.get("pytorch-accel, default callbacks")
    bare = calls.get("pytorch-accel, no callbacks")
    if base is None or default is None or bare is None:
        return "(Python calls per step: not measured in these results.)"
    return (
        f"The trainer adds {bare - base:.0f} Python calls to the hand-written step's "
        f"{base:.0f} without callbacks ({bare:.0f} in all) and {default - base:.0f} with the "
        f"default ones ({default:.0f}), counted with `sys.setprofile` by `make bench`."
    )


def _step_logging_table(workload: dict[str, Any]) -> list[str]:
    rows = [
        ("every 50 updates", workload.get("logging_overhead")),
        ("every update", workload.get("logging_every_update_overhead")),
    ]
    rows = [(name, figures) for name, figures in rows if figures]
    if not rows:
        return []
    lines = [
        "| step logging (`TrackingCallback`, CSV) | per-step ratio to the default callbacks, "
        "median (min-max) | extra per run (ms) | whole-epoch ratio, median (min-max) |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, figures in rows:
        whole = "-"
        if "whole_ratio" in figures:
            whole = (
                f"{figures['whole_ratio']:.3f} ({figures['whole_ratio_min']:.3f}-"
                f"{figures['whole_ratio_max']:.3f})"
            )
        lines.append(
            f"| {name} | {figures['per_step_ratio']:.3f} ({figures['per_step_ratio_min']:.3f}-"
            f"{figures['per_step_ratio_max']:.3f}) | {figures['extra_fixed_ms']:+.1f} | {whole} |"
        )
    return lines


def update_document(text: str, texts: dict[str, str]) -> tuple[str, list[str], list[str]]:
    """Replace the marked blocks of ``text`` that ``texts`` has.

    Returns:
        The new text, the names of the blocks replaced, and those left as they were.
    """
    replaced: list[str] = []
    kept: list[str] = []

    def replace(match: re.Match[str]) -> str:
        name = match.group(2)
        if name not in texts:
            kept.append(name)
            return match.group(0)
        replaced.append(name)
        return f"{match.group(1)}{texts[name]}\n{match.group(4)}"

    return BLOCK.sub(replace, text), replaced, kept


def main(argv: list[str] | None = None) -> None:
    """Rewrite the marked blocks of the docs from the benchmark results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="overhead.json to read")
    parser.add_argument("--docs", type=Path, default=DOCS, help="the Markdown page to rewrite")
    args = parser.parse_args(argv)
    if not args.results.is_file():
        sys.exit(f"benchmarks.report: no results at {args.results}: run `make bench` first.")
    results = json.loads(args.results.read_text())
    text, replaced, kept = update_document(args.docs.read_text(), blocks(results))
    partial = args.docs.with_name(f".{args.docs.name}.partial")
    partial.write_text(text)
    os.replace(partial, args.docs)
    print(f"benchmarks.report: rewrote {', '.join(replaced) or 'no block'} in {args.docs}")
    if kept:
        print(f"benchmarks.report: no figures for {', '.join(kept)} (left as they were)")


if __name__ == "__main__":
    main()
