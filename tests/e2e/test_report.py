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
