"""The report's Capacity section, opened in headless Chromium: the snapshot per zone and type,
the crunch, the type comparison, reservations, the quota outlook and time back in service."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import lake_fixture as fx

pytestmark = pytest.mark.chromium
CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip


def dump_dom(tmp_path: Path, page: Path) -> str:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium (make system-deps)")
    done = subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=3000",
         "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def section(dom: str, name: str) -> str:
    return dom.split(f'data-table="{name}"', 1)[1].split("</section>", 1)[0]


def test_the_capacity_section_renders_every_part(tmp_path: Path) -> None:
    lake = fx.build_lake(tmp_path / "lake")
    page = tmp_path / "report.html"
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "report", "--lake", str(lake), "--out", str(page)],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "FLEETPULSE_CAPACITY__CRUNCH_FREE_BELOW": "8"},  # off by default
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    dom = dump_dom(tmp_path, page)
    assert re.search(r'<body[^>]*data-errors="0"', dom)
    assert "<h2>Capacity</h2>" in dom
    now = section(dom, "capacity-now")
    assert now.count("<tr>") == 1 + 3  # the header, then one row per zone and type
    assert "<td>nvidia-h100-80gb</td>" in now and "<td>14 of 64</td>" in now
    assert "(on-demand, " in now, "every cost names the price it used"
    crunch = section(dom, "capacity-crunch")
    assert "nvidia-a100-80gb in z" in crunch and "2 healthy free devices" in crunch
    roi = section(dom, "accelerator-types-compared")
    assert roi.index("tpu-v5e") < roi.index("nvidia-h100-80gb")
    # the H100 jobs' step time (0.375 s a rank) and the cost of 1000 of their steps
    assert ">USD per 1000 job steps<" in roi and ">0.38<" in roi
    back = re.sub(r"<td[^>]*>", "<td>", section(dom, "time-back-in-service"))
    assert "<td>tpu</td><td>cordoned</td><td>1</td><td>30.0</td>" in back
    assert ">none<" in section(dom, "reservations")  # the fixture reserves nothing
    (chart,) = re.findall(r'<figure[^>]*data-chart="capacity_time"[^>]*>', dom)
    assert 'data-rendered="yes"' in chart
    # one line per region and type: z · nvidia-h100-80gb, nvidia-a100-80gb, tpu-v5e
    assert dom.count("<title>z · ") >= 3
