"""`fleetpulse report` opened in headless Chromium: every chart renders, no script errors, and a
screenshot shows a page that is not blank. No network: the page must need nothing outside it."""

from __future__ import annotations

import re
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from tests import lake_fixture as fx

pytestmark = pytest.mark.chromium
CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
CHARTS = {"utilization", "health", "xid", "capacity", "cost"}
WIDTH = 1280
# Injected into a copy of the page: after layout, every text box of each chart against every
# other (any two that intersect by more than half a pixel both ways are unreadable), and how
# wide the page is compared with the window; the answers go into the DOM for --dump-dom.
LAYOUT_PROBE = """
(function () {
  function overlap(a, b) {
    var w = Math.min(a.right, b.right) - Math.max(a.left, b.left);
    var h = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
    return w > 0.5 && h > 0.5;
  }
  function measure() {
    var figures = document.querySelectorAll('figure[data-chart]');
    for (var i = 0; i < figures.length; i++) {
      var texts = figures[i].querySelectorAll('svg.chart text'), boxes = [], pairs = [];
      for (var j = 0; j < texts.length; j++) { boxes.push(texts[j].getBoundingClientRect()); }
      for (var a = 0; a < boxes.length; a++) {
        for (var b = a + 1; b < boxes.length; b++) {
          if (overlap(boxes[a], boxes[b])) {
            pairs.push(texts[a].textContent + ' / ' + texts[b].textContent);
          }
        }
      }
      figures[i].setAttribute('data-texts', String(texts.length));
      figures[i].setAttribute('data-overlaps', pairs.join(' ; '));
    }
    var root = document.documentElement;
    document.body.setAttribute('data-scroll-width', String(root.scrollWidth));
    document.body.setAttribute('data-inner-width', String(window.innerWidth));
  }
  window.addEventListener('load', measure);
})();
"""
# the fixture's window; one where the XID heatmap has 15 columns of 5 min (labels of the old
# code, one per column, ran into each other); a week, mostly empty, of 6 h columns
WINDOWS = [(), ("--since", "2026-01-01T01:00", "--until", "2026-01-01T02:15"), ("--since", "7d")]


def chromium(tmp_path: Path, page: Path, *args: str) -> str:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium (make system-deps)")
    profile = tmp_path / "chromium-profile"
    done = subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=3000", *args,
         page.as_uri()],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def report(lake: Path, out: Path, *args: str) -> Path:
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "report", "--lake", str(lake), "--out", str(out),
         *args], capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr
    return out


def attributes(dom: str, tag: str) -> list[dict[str, str]]:
    return [dict(re.findall(r'([\w-]+)="([^"]*)"', m)) for m in re.findall(rf"<{tag}\b([^>]*)>", dom)]


def png_summary(path: Path) -> tuple[int, int, int]:
    """(width, height, distinct byte values in the pixel data) of a PNG, without Pillow."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    position, idat, width, height = 8, b"", 0, 0
    while position < len(data):
        length, kind = struct.unpack(">I4s", data[position : position + 8])
        chunk = data[position + 8 : position + 8 + length]
        if kind == b"IHDR":
            width, height = struct.unpack(">II", chunk[:8])
        elif kind == b"IDAT":
            idat += chunk
        position += 12 + length
    return width, height, len(set(zlib.decompress(idat)))


def test_every_chart_renders_without_script_errors_and_the_page_is_self_contained(
    tmp_path: Path,
) -> None:
    lake = fx.build_lake(tmp_path / "lake")
    page = report(lake, tmp_path / "report.html")
    html = page.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html), "external reference"
    assert "<link" not in html

    dom = chromium(tmp_path, page, "--dump-dom")
    (body,) = attributes(dom, "body")
    assert body["data-errors"] == "0"
    assert body["data-charts"] == body["data-charts-rendered"] == str(len(CHARTS))
    figures = {f["data-chart"]: f for f in attributes(dom, "figure")}
    assert set(figures) == CHARTS
    assert all(f["data-rendered"] == "yes" and int(f["data-marks"]) > 0 for f in figures.values())
    # one line per pool, one heatmap cell per (node, time bucket) with XIDs
    assert figures["utilization"]["data-marks"] == str(len({u[0] for u in fx.UNITS}))
    assert figures["xid"]["data-marks"] == "2"
    offenders = dom.split('data-table="top-offenders"')[1].split("</table>")[0]
    assert offenders.index(">g1<") < offenders.index(">s1<") < offenders.index(">g3<")

    shot = tmp_path / "report.png"
    chromium(tmp_path, page, f"--screenshot={shot}", "--window-size=1280,2400")
    width, height, distinct = png_summary(shot)
    assert (width, height) == (1280, 2400)
    assert distinct > 100, "the screenshot is (nearly) blank"


def test_an_empty_lake_still_renders_every_chart_as_empty(tmp_path: Path) -> None:
    (tmp_path / "lake").mkdir()
    page = report(tmp_path / "lake", tmp_path / "empty.html", "--until", "2026-01-01T00:00")
    dom = chromium(tmp_path, page, "--dump-dom")
    (body,) = attributes(dom, "body")
    assert (body["data-errors"], body["data-charts-rendered"]) == ("0", str(len(CHARTS)))
    assert {f["data-rendered"] for f in attributes(dom, "figure")} == {"empty"}


def test_the_page_check_catches_a_script_error_and_a_broken_chart(tmp_path: Path) -> None:
    lake = fx.build_lake(tmp_path / "lake")
    page = report(lake, tmp_path / "report.html")
    html = page.read_text()
    broken = re.sub(r'<svg class="chart" data-chart="cost".*?</svg>', "", html, flags=re.S)
    broken = broken.replace("</body>", "<script>undefinedFunction();</script></body>")
    page.write_text(broken)
    dom = chromium(tmp_path, page, "--dump-dom")
    (body,) = attributes(dom, "body")
    assert body["data-errors"] == "1"
    assert body["data-charts-rendered"] == str(len(CHARTS) - 1)
    cost = next(f for f in attributes(dom, "figure") if f["data-chart"] == "cost")
    assert cost["data-rendered"] == "no"


def laid_out(tmp_path: Path, page: Path) -> str:
    """The DOM of `page` with LAYOUT_PROBE's answers, opened at WIDTH px."""
    probed = page.with_name(f"probed-{page.name}")
    probed.write_text(page.read_text().replace("</body>", f"<script>{LAYOUT_PROBE}</script></body>"))
    return chromium(tmp_path, probed, "--dump-dom", f"--window-size={WIDTH},2000")


@pytest.mark.parametrize("window", WINDOWS, ids=["fixture", "75min", "7d"])
def test_chart_text_never_overlaps_and_the_page_does_not_scroll_sideways(
    tmp_path: Path, window: tuple[str, ...]
) -> None:
    lake = fx.build_lake(tmp_path / "lake")
    dom = laid_out(tmp_path, report(lake, tmp_path / "report.html", *window))
    (body,) = attributes(dom, "body")
    assert body["data-inner-width"] == str(WIDTH)
    assert int(body["data-scroll-width"]) <= WIDTH, "the page scrolls sideways"
    figures = {f["data-chart"]: f for f in attributes(dom, "figure")}
    assert set(figures) >= CHARTS
    for name, figure in figures.items():
        assert int(figure["data-texts"]) > 0, name
        assert figure["data-overlaps"] == "", f"{name}: overlapping labels {figure['data-overlaps']}"


def test_wide_tables_scroll_inside_their_box_not_the_page(tmp_path: Path) -> None:
    lake = fx.build_lake(tmp_path / "lake")
    dom = laid_out(tmp_path, report(lake, tmp_path / "report.html"))
    tables = re.findall(r'<section data-table="[^"]*"><h2>[^<]*</h2>(<[^>]*>)<table>', dom)
    assert tables and all(t == '<div class="scroll">' for t in tables)


def test_the_xid_heatmap_has_a_colour_scale(tmp_path: Path) -> None:
    lake = fx.build_lake(tmp_path / "lake")
    html = report(lake, tmp_path / "report.html").read_text()
    xid = re.search(r'<svg class="chart" data-chart="xid".*?</svg>', html, flags=re.S)
    assert xid and "XID events per cell" in xid.group(0)
    swatches = [float(o) for o in re.findall(r'class="legend"[^>]*fill-opacity="([\d.]+)"',
                                             xid.group(0))]
    # the busiest fixture cell holds 3 events: one swatch per count, darker as it grows
    assert len(swatches) == 3 and swatches == sorted(swatches) and swatches[-1] == 1.0
