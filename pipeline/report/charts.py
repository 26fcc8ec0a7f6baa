"""Inline SVG charts for the HTML report: no scripts, no fonts, nothing fetched.

Every chart is an `<svg class="chart">` whose data marks carry `class="mark"` and a `<title>`
(the browser shows it on hover). Text from the lake is escaped; numbers are formatted here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from html import escape

WIDTH = 960
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
           "#ff9da7", "#9c755f", "#bab0ac")
STATE_COLORS = {
    "healthy": "#59a14f", "suspect": "#edc948", "degraded": "#f28e2b", "cordoned": "#e15759",
    "draining": "#b07aa1", "repairing": "#4e79a7", "probation": "#76b7b2",
}
LEFT, RIGHT, TOP, BOTTOM = 70, 170, 20, 40


@dataclass(frozen=True)
class Series:
    name: str
    points: list[tuple[datetime, float]]


@dataclass(frozen=True)
class Marker:
    at: datetime
    label: str
    color: str


@dataclass(frozen=True)
class Part:
    name: str
    color: str
    values: list[float]


def shorten(text: str, size: int) -> str:
    """Cut the middle, not the end: names differ at their ends (…-h100-train-003)."""
    if len(text) <= size:
        return text
    keep = size - 1
    return text[: keep // 2] + "…" + text[len(text) - (keep - keep // 2) :]


def color_of(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def _svg(name: str, height: int, body: list[str], title: str) -> str:
    return (f'<svg class="chart" data-chart="{escape(name)}" xmlns="http://www.w3.org/2000/svg" '
            f'viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" role="img" '
            f'aria-label="{escape(title)}">' + "".join(body) + "</svg>")


def _text(x: float, y: float, text: str, anchor: str = "start", size: int = 11,
          extra: str = "") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" '
            f'fill="#333" {extra}>{escape(text)}</text>')


def _empty(body: list[str], height: int) -> None:
    body.append(_text(WIDTH / 2, height / 2, "no data in this period", "middle", 14,
                      'class="empty"'))


class TimeAxis:
    """Maps [since, until] onto the plot's x range and draws its ticks."""

    def __init__(self, since: datetime, until: datetime, x0: float, x1: float) -> None:
        self.since, self.until, self.x0, self.x1 = since, until, x0, x1
        self.span = max((until - since).total_seconds(), 1.0)

    def x(self, at: datetime) -> float:
        offset = (at - self.since).total_seconds() / self.span
        return self.x0 + min(max(offset, 0.0), 1.0) * (self.x1 - self.x0)

    def ticks(self, y: float) -> list[str]:
        step = _tick_step(self.span)
        first = self.since + (-(self.since - datetime(1970, 1, 1)) % step)
        marks, at = [], first
        fmt = "%H:%M" if self.span <= 86_400 else "%m-%d %H:%M"
        while at <= self.until:
            x = self.x(at)
            marks.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{y}" stroke="#eee"/>')
            marks.append(_text(x, y + 16, at.strftime(fmt), "middle", 10))
            at += step
        return marks


def _tick_step(span_s: float) -> timedelta:
    for hours in (0.25, 0.5, 1, 2, 3, 6, 12, 24, 48, 168):
        if span_s / (hours * 3600) <= 8:
            return timedelta(hours=hours)
    return timedelta(days=30)


def line_chart(name: str, title: str, series: Sequence[Series], since: datetime,
               until: datetime, y_max: float = 100.0, unit: str = "%") -> str:
    height = 300
    bottom = height - BOTTOM
    axis = TimeAxis(since, until, LEFT, WIDTH - RIGHT)
    body = [*axis.ticks(bottom), *_y_grid(y_max, unit, bottom)]
    if not any(s.points for s in series):
        _empty(body, height)
    for index, one in enumerate(series):
        color = color_of(index)
        path = " ".join(f"{'M' if i == 0 else 'L'}{axis.x(at):.1f},{_y(v, y_max, bottom):.1f}"
                        for i, (at, v) in enumerate(one.points))
        body.append(f'<path class="mark" d="{path}" fill="none" stroke="{color}" '
                    f'stroke-width="2"><title>{escape(one.name)}</title></path>')
        for at, value in one.points:
            y = _y(value, y_max, bottom)
            body.append(f'<circle cx="{axis.x(at):.1f}" cy="{y:.1f}" r="2.5" '
                        f'fill="{color}"><title>{escape(one.name)} {at:%Y-%m-%d %H:%M}: '
                        f'{value:.1f}{escape(unit)}</title></circle>')
        body.append(_legend(index, one.name, color))
    return _svg(name, height, body, title)


def _y(value: float, y_max: float, bottom: float) -> float:
    return bottom - (min(max(value, 0.0), y_max) / y_max) * (bottom - TOP)


def _y_grid(y_max: float, unit: str, bottom: float) -> list[str]:
    marks = []
    for i in range(5):
        value = y_max * i / 4
        y = _y(value, y_max, bottom)
        marks.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" '
                     f'stroke="#ddd"/>')
        marks.append(_text(LEFT - 6, y + 4, f"{value:g}{unit}", "end", 10))
    return marks


def _legend(index: int, label: str, color: str) -> str:
    y = TOP + 14 * index + 6
    return (f'<rect x="{WIDTH - RIGHT + 12}" y="{y - 8}" width="10" height="10" fill="{color}"/>'
            + _text(WIDTH - RIGHT + 26, y + 1, shorten(label, 26), size=10))


def timeline_chart(name: str, title: str, buckets: list[datetime], bucket: timedelta,
                   stacks: dict[str, list[float]], markers: Sequence[Marker],
                   since: datetime, until: datetime) -> str:
    """Stacked bars per time bucket (state changes) and a lane of markers (actions) below."""
    height = 320
    lane = height - BOTTOM - 16
    bottom = lane - 24
    axis = TimeAxis(since, until, LEFT, WIDTH - RIGHT)
    top = max([sum(v[i] for v in stacks.values()) for i in range(len(buckets))] or [0]) or 1
    body = [*axis.ticks(lane + 6), *_y_grid(float(top), "", bottom)]
    if not buckets and not markers:
        _empty(body, height)
    width = max(axis.x(since + bucket) - axis.x(since) - 2, 2.0)
    for i, start in enumerate(buckets):
        base = 0.0
        for state, values in stacks.items():
            if not values[i]:
                continue
            y0, y1 = _y(base, top, bottom), _y(base + values[i], top, bottom)
            body.append(f'<rect class="mark" x="{axis.x(start) + 1:.1f}" y="{y1:.1f}" '
                        f'width="{width:.1f}" height="{y0 - y1:.1f}" '
                        f'fill="{STATE_COLORS.get(state, "#999")}"><title>{start:%Y-%m-%d %H:%M} '
                        f'{escape(state)}: {values[i]:g}</title></rect>')
            base += values[i]
    body.append(_text(LEFT - 6, lane + 4, "actions", "end", 10))
    for marker in markers:
        x = axis.x(marker.at)
        body.append(f'<path class="mark" d="M{x:.1f},{lane - 6} l5,10 l-10,0 z" '
                    f'fill="{marker.color}"><title>{escape(marker.label)}</title></path>')
    for index, state in enumerate(stacks):
        body.append(_legend(index, state, STATE_COLORS.get(state, "#999")))
    return _svg(name, height, body, title)


def heatmap(name: str, title: str, rows: list[str], columns: list[datetime],
            values: dict[tuple[str, datetime], float], labels: dict[tuple[str, datetime], str]
            ) -> str:
    cell_h = 16
    # tall enough for the rows and for the colour scale beside them
    height = max(TOP + max(len(rows), 1) * cell_h + BOTTOM + 10, TOP + 14 * 7 + 10)
    x0, x1 = LEFT + 110, WIDTH - RIGHT
    cell_w = (x1 - x0) / max(len(columns), 1)
    top = max(values.values(), default=0) or 1
    body: list[str] = []
    if not rows:
        _empty(body, height)
    for r, row in enumerate(rows):
        y = TOP + r * cell_h
        body.append(_text(x0 - 6, y + cell_h - 4, shorten(row, 30), "end", 10))
        for c, column in enumerate(columns):
            value = values.get((row, column), 0)
            if not value:
                continue
            shade = 0.15 + 0.85 * value / top
            body.append(f'<rect class="mark" x="{x0 + c * cell_w:.1f}" y="{y}" '
                        f'width="{max(cell_w - 1, 1):.1f}" height="{cell_h - 1}" '
                        f'fill="#e15759" fill-opacity="{shade:.2f}"><title>{escape(row)} '
                        f'{column:%Y-%m-%d %H:%M}: {value:g} '
                        f'({escape(labels.get((row, column), ""))})</title></rect>')
    bottom = TOP + len(rows) * cell_h
    body.extend(_column_labels(columns, x0, x1, cell_w, bottom + 14))
    body.append(f'<rect x="{x0}" y="{TOP}" width="{x1 - x0}" height="{max(bottom - TOP, 1)}" '
                'fill="none" stroke="#ccc"/>')
    if rows:
        body.extend(_shade_legend(top, "events"))
    return _svg(name, height, body, title)


def _column_labels(columns: list[datetime], x0: float, x1: float, cell_w: float,
                   y: float) -> list[str]:
    """Time labels under heatmap columns, every so many columns that no two touch."""
    if not columns:
        return []
    same_day = columns[0].date() == columns[-1].date()
    fmt = "%H:%M" if same_day else "%m-%d %H:%M"
    width = _text_width(columns[0].strftime(fmt), 10) + 8  # room between two labels
    step = max(1, math.ceil(width / cell_w))
    marks = []
    for c in range(0, len(columns), step):
        x = x0 + c * cell_w
        if x + width - 8 > x1:  # would run past the grid into the legend
            break
        marks.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y - 14}" y2="{y - 10}" '
                     'stroke="#999"/>')
        marks.append(_text(x, y, columns[c].strftime(fmt), size=10))
    return marks


def _text_width(text: str, size: int) -> float:
    """A generous guess at a label's width in a sans-serif font: digits are ~0.56 em."""
    return len(text) * size * 0.62


def _shade_legend(top: float, unit: str) -> list[str]:
    """The heatmap's colour scale: five swatches from one event to the busiest cell."""
    x = WIDTH - RIGHT + 12
    marks = [_text(x, TOP + 6, f"XID {unit} per cell", size=10)]
    values = sorted({max(1, round(top * i / 4)) for i in range(1, 5)} | {1})
    for i, value in enumerate(values):
        y = TOP + 14 * (i + 1) + 6
        shade = 0.15 + 0.85 * value / top
        marks.append(f'<rect class="legend" x="{x}" y="{y - 8}" width="10" height="10" '
                     f'fill="#e15759" fill-opacity="{shade:.2f}"/>')
        marks.append(_text(x + 14, y + 1, f"{value:g}", size=10))
    return marks


def bar_chart(name: str, title: str, labels: list[str], parts: Sequence[Part],
              prefix: str = "") -> str:
    """Horizontal stacked bars, one per label, each with its total at its end."""
    bar_h = 22
    height = TOP + max(len(labels), 1) * (bar_h + 8) + BOTTOM
    x0, x1 = LEFT + 180, WIDTH - RIGHT - 60
    totals = [sum(p.values[i] for p in parts) for i in range(len(labels))]
    top = max(totals, default=0) or 1
    body: list[str] = []
    if not labels:
        _empty(body, height)
    for i, label in enumerate(labels):
        y = TOP + i * (bar_h + 8)
        body.append(_text(x0 - 6, y + bar_h - 6, shorten(label, 40), "end", 10))
        base = 0.0
        for part in parts:
            value = part.values[i]
            if value <= 0:
                continue
            x = x0 + base / top * (x1 - x0)
            body.append(f'<rect class="mark" x="{x:.1f}" y="{y}" height="{bar_h}" '
                        f'width="{max(value / top * (x1 - x0), 1):.1f}" fill="{part.color}">'
                        f'<title>{escape(label)} {escape(part.name)}: {escape(prefix)}{value:,.2f}'
                        '</title></rect>')
            base += value
        body.append(_text(x0 + base / top * (x1 - x0) + 4, y + bar_h - 6,
                          f"{prefix}{totals[i]:,.2f}", size=10))
    for index, part in enumerate(parts):
        body.append(_legend(index, part.name, part.color))
    return _svg(name, height, body, title)
