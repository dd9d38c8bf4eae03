"""The run report's page: metric curves as inline SVG, and the run's settings, in one HTML file.

No dependency: the curves are drawn here as SVG polylines, so the page opens in any browser,
offline, from a single file.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Points = list[tuple[float, float]]
"""A curve: (x, y) pairs, x increasing."""

_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2")
_WIDTH, _HEIGHT = 460, 250
_LEFT, _RIGHT, _TOP, _BOTTOM = 74, 12, 12, 34


@dataclass
class Panel:
    """One plot: its title, x label, and its curves by name (train and eval together)."""

    title: str
    x_label: str
    curves: dict[str, Points] = field(default_factory=dict)
    log_x: bool = False
    marker: float | None = None  # an x to mark (the LR finder's suggestion)


@dataclass
class ReportContent:
    """What the page shows, gathered on the training thread (plain Python values)."""

    title: str
    status: str
    panels: list[Panel]
    sections: dict[str, Any]


def panel_key(name: str) -> tuple[str, str]:
    """The panel a metric goes to and its label there: train and eval of a metric together.

    ``train_loss_epoch`` and ``eval_loss_epoch`` go to panel ``loss`` as ``train`` and
    ``eval``; ``ema_model_eval_loss_epoch`` to ``ema_model_loss`` as ``eval``; any other
    name is a panel of its own.
    """
    base = name.removesuffix("_epoch").removesuffix("_step")
    for split in ("train", "eval"):
        if base.startswith(f"{split}_"):
            return base[len(split) + 1 :], split
        head, marker, tail = base.partition(f"_{split}_")
        if marker:
            return f"{head}_{tail}", split
    return base, base


def group_panels(series: Mapping[str, Points], x_label: str, suffix: str = "") -> list[Panel]:
    """One panel per metric, with a metric's train and eval curves on the same panel."""
    panels: dict[str, Panel] = {}
    for name in sorted(series):
        points = [(x, y) for x, y in series[name] if math.isfinite(y)]
        if not points:
            continue
        key, label = panel_key(name)
        panel = panels.setdefault(key, Panel(f"{key}{suffix}", x_label))
        panel.curves[label if label not in panel.curves else name] = points
    for panel in panels.values():  # train first, then eval, then the rest
        rank = {"train": 0, "eval": 1}
        panel.curves = dict(sorted(panel.curves.items(), key=lambda item: rank.get(item[0], 2)))
    return sorted(panels.values(), key=lambda p: ("loss" not in p.title, p.title))


def number(value: float) -> str:
    """4 significant digits, as the console prints."""
    return f"{value:.4g}"


def svg_panel(panel: Panel) -> str:
    """The panel as an inline ``<svg>``: axes with their ranges, one polyline per curve."""
    xs = [x for points in panel.curves.values() for x, _ in points]
    ys = [y for points in panel.curves.values() for _, y in points]
    if panel.log_x:
        xs = [math.log10(x) for x in xs if x > 0]
    x_first, x_last = (min(xs), max(xs)) if xs else (0.0, 1.0)
    x_low, x_high = _span(xs)
    y_low, y_high = _span(ys)
    plot_w, plot_h = _WIDTH - _LEFT - _RIGHT, _HEIGHT - _TOP - _BOTTOM

    def to_x(x: float) -> float:
        value = math.log10(x) if panel.log_x else x
        return _LEFT + (value - x_low) / (x_high - x_low) * plot_w

    def to_y(y: float) -> float:
        return _TOP + (1 - (y - y_low) / (y_high - y_low)) * plot_h

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{_HEIGHT}" '
        f'viewBox="0 0 {_WIDTH} {_HEIGHT}" role="img" aria-label="{html.escape(panel.title)}">',
        f'<rect x="{_LEFT}" y="{_TOP}" width="{plot_w}" height="{plot_h}" fill="#fafafa" '
        'stroke="#999"/>',
    ]
    for fraction in (0.25, 0.5, 0.75):
        y = _TOP + fraction * plot_h
        parts.append(
            f'<line x1="{_LEFT}" x2="{_LEFT + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e4e4e4"/>'
        )
    for y_value in (y_low, (y_low + y_high) / 2, y_high):
        parts.append(
            f'<text x="{_LEFT - 4}" y="{to_y(y_value) + 4:.1f}" text-anchor="end" '
            f'font-size="11">{number(y_value)}</text>'
        )
    for x_value in (x_first, x_last):  # the data's first and last x, under their points
        shown = 10**x_value if panel.log_x else x_value
        x = _LEFT + (x_value - x_low) / (x_high - x_low) * plot_w
        parts.append(
            f'<text x="{x:.1f}" y="{_TOP + plot_h + 14}" text-anchor="middle" '
            f'font-size="11">{number(shown)}</text>'
        )
    parts.append(
        f'<text x="{_LEFT + plot_w / 2:.1f}" y="{_HEIGHT - 4}" text-anchor="middle" '
        f'font-size="11" fill="#555">{html.escape(panel.x_label)}</text>'
    )
    if panel.marker is not None and (not panel.log_x or panel.marker > 0):
        x = to_x(panel.marker)
        parts.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{_TOP}" y2="{_TOP + plot_h}" '
            'stroke="#d62728" stroke-dasharray="4 3"/>'
        )
    for index, (label, points) in enumerate(panel.curves.items()):
        colour = _COLOURS[index % len(_COLOURS)]
        if panel.log_x:
            points = [(x, y) for x, y in points if x > 0]
        coordinates = " ".join(f"{to_x(x):.1f},{to_y(y):.1f}" for x, y in points)
        parts.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{coordinates}"/>'
        )
        if len(points) <= 60:
            parts.extend(
                f'<circle cx="{to_x(x):.1f}" cy="{to_y(y):.1f}" r="2.5" fill="{colour}"/>'
                for x, y in points
            )
        parts.append(
            f'<text x="{_LEFT + plot_w - 6}" y="{_TOP + 16 + 14 * index}" text-anchor="end" '
            f'font-size="12" fill="{colour}">{html.escape(label)} '
            f"{number(points[-1][1]) if points else ''}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _span(values: Sequence[float]) -> tuple[float, float]:
    if not values:
        return 0.0, 1.0
    low, high = min(values), max(values)
    if high == low:
        pad = abs(low) * 0.05 or 1.0
        return low - pad, high + pad
    pad = (high - low) * 0.04
    return low - pad, high + pad


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 24px; color: #222; background: #fff; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 22px 0 8px; }
.status { font-size: 15px; color: #444; margin-bottom: 12px; }
.panels { display: flex; flex-wrap: wrap; gap: 12px; }
figure { margin: 0; border: 1px solid #ddd; padding: 6px; background: #fff; }
figcaption { font-weight: 600; font-size: 13px; margin-bottom: 2px; }
pre { background: #f4f4f4; padding: 10px; overflow-x: auto; font-size: 12px; }
details { margin: 6px 0; } summary { cursor: pointer; font-weight: 600; }
"""


def render(content: ReportContent) -> str:
    """The whole page, self-contained (no script, no external resource)."""
    title = html.escape(content.title)
    body = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{title}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{title}</h1>",
        f'<div class="status">{html.escape(content.status)}</div>',
    ]
    groups: dict[str, list[Panel]] = {}
    for panel in content.panels:
        groups.setdefault(panel.x_label, []).append(panel)
    for x_label, panels in groups.items():
        heading = {"epoch": "By epoch", "update": "By update"}.get(x_label, x_label)
        body.append(f"<h2>{html.escape(heading)}</h2><div class='panels'>")
        for panel in panels:
            body.append(
                f"<figure><figcaption>{html.escape(panel.title)}</figcaption>"
                f"{svg_panel(panel)}</figure>"
            )
        body.append("</div>")
    if not content.panels:
        body.append("<p>No metric recorded yet.</p>")
    for heading, value in content.sections.items():
        text = value if isinstance(value, str) else json.dumps(value, indent=2, default=str)
        body.append(
            f"<details open><summary>{html.escape(heading)}</summary>"
            f"<pre>{html.escape(text)}</pre></details>"
        )
    body.append("</body></html>\n")
    return "\n".join(body)
