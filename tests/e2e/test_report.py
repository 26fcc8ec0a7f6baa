"""`fleetpulse report` opened in headless Chromium: every chart renders, no script errors, and a
screenshot shows a page that is not blank. No network: the page must need nothing outside it.

The tests of what the report says (its tables, the alert count, the health changes, the XID
heatmap's scale) run on both lake backends (`backend_lake`: local Parquet, and Iceberg on
s3proxy through FLEETPULSE_LAKE__*); those of how the page renders and lays out read the local
lake only (the page is made the same way from the same answers)."""

from __future__ import annotations

import itertools
import os
import re
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from pipeline.catalog import price_for
from pipeline.report.html import natural_key
from tests import lake_fixture as fx
from tests.iceberg_fixture import BACKENDS, build_fixture_lake, settings_env

pytestmark = pytest.mark.chromium
CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
CHARTS = {"utilization", "health", "xid", "capacity", "cost", "capacity_time"}
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
    var links = document.querySelectorAll('a[href^="#"]'), broken = [];
    for (var k = 0; k < links.length; k++) {
      var id = decodeURIComponent(links[k].getAttribute('href').slice(1));
      if (!document.getElementById(id)) { broken.push(id); }
    }
    document.body.setAttribute('data-links', String(links.length));
    document.body.setAttribute('data-broken-links', broken.join(' '));
    var boxes = document.querySelectorAll('div.scroll'), wide = [];
    for (var t = 0; t < boxes.length; t++) {
      if (boxes[t].scrollWidth > boxes[t].clientWidth + 1) {
        var owner = boxes[t].closest('[data-part],[data-table]');
        wide.push((owner.getAttribute('data-part') || owner.getAttribute('data-table')) + ':' +
                  boxes[t].scrollWidth + '>' + boxes[t].clientWidth);
      }
    }
    document.body.setAttribute('data-wide-tables', wide.join(' '));
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


def report(lake: Path, out: Path, *args: str, env: dict[str, str] | None = None) -> Path:
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "report", "--lake", str(lake), "--out", str(out),
         *args], capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, **(env or {})},
    )
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module", params=BACKENDS)
def backend_lake(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                 ) -> tuple[Path, dict[str, str]]:
    """The fixture lake on each backend (the tests only read it): its `--lake` folder and the
    environment that selects the backend (empty for the local lake)."""
    root, settings = build_fixture_lake(request.param, tmp_path_factory.mktemp("report-lake"))
    return root, settings_env(settings) if settings.uri else {}


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


def test_a_window_without_data_still_renders_every_chart_as_empty(tmp_path: Path) -> None:
    # (a folder holding no lake at all is refused: tests/e2e/test_cli_errors.py)
    lake = fx.build_lake(tmp_path / "lake")
    page = report(lake, tmp_path / "empty.html", "--until", "2025-06-01T00:00")
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
    assert body["data-broken-links"] == "", "links to sections that are not there"
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


def test_the_xid_heatmap_has_a_colour_scale(
    tmp_path: Path, backend_lake: tuple[Path, dict[str, str]]
) -> None:
    lake, env = backend_lake
    html = report(lake, tmp_path / "report.html", env=env).read_text()
    xid = re.search(r'<svg class="chart" data-chart="xid".*?</svg>', html, flags=re.S)
    assert xid and "XID events per cell" in xid.group(0)
    swatches = [float(o) for o in re.findall(r'class="legend"[^>]*fill-opacity="([\d.]+)"',
                                             xid.group(0))]
    # the busiest fixture cell holds 5 lines (a coalesced record counts its repeats): swatches
    # for 1, 2, 4 and 5 events, darker as they grow
    assert len(swatches) == 4 and swatches == sorted(swatches) and swatches[-1] == 1.0


def table(html: str, name: str) -> list[dict[str, str]]:
    """The rows of the table `data-table=name` as {column: cell text}."""
    section = html.split(f'data-table="{name}"')[1].split("</table>")[0]
    columns = re.findall(r'<th data-column="([^"]*)">', section)  # the query's column names
    rows = re.findall(r"<tr>(.*?)</tr>", section.split("<tbody>")[1])
    cells = [[re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", r)]
             for r in rows]
    return [dict(zip(columns, c, strict=True)) for c in cells if len(c) == len(columns)]


def target_section(html: str, section_id: str) -> str:
    return html.split(f'id="{section_id}"')[1].split('<section class="target"')[0]


def test_table_rows_link_to_a_section_per_target_with_its_window(
    tmp_path: Path, backend_lake: tuple[Path, dict[str, str]]
) -> None:
    lake, env = backend_lake
    html = report(lake, tmp_path / "report.html", env=env).read_text()
    offenders = html.split('data-table="top-offenders"')[1].split("</table>")[0]
    links = re.findall(r'<a href="#([^"]+)">([^<]+)</a>', offenders)
    assert links == [("target-node-g1", "g1"), ("target-slice-s1", "s1"),
                     ("target-node-g3", "g3")]
    assert '<a href="#target-node-g1">g1</a>' in html.split('data-table="open-actions"')[1]
    g1 = target_section(html, "target-node-g1")
    assert "pool train, zone z-a, state now degraded" in g1
    parts = {part: table(f'data-table="{part}"' + body, part)
             for part, body in re.findall(r'data-part="(\w+)"(.*?</table>)', g1, flags=re.S)}
    unhealthy = [f for f in fx.FINDINGS if f.entity.target.name == "g1" and not f.healthy]
    assert len(parts["findings"]) == len(unhealthy) == 3
    assert [a["kind"] for a in parts["actions"]] == ["cordon", "repair", "cordon"]
    # why not: its second cordon was held for the budget (then acted on, 5 min later)
    assert [(w["kind"], w["reason"], w["detail"]) for w in parts["withheld"]] == [
        ("cordon", "budget", "budget in words")]
    # one row for all the node's devices (a 64-chip slice was 64 rows)
    assert [(u["devices"], u["util_mean_pct"], u["lowest_device"]) for u in parts["utilization"]
            ] == [("2", f"{fx.BUSY:.1f}", "#0")]  # fmt: skip
    assert [(x["xid"], x["events"]) for x in parts["xids"]] == [("79", "2")]
    s1 = target_section(html, "target-slice-s1")
    (s1_util,) = table('data-table="utilization"' + s1.split('data-part="utilization"')[1],
                       "utilization")  # fmt: skip
    assert (s1_util["accelerator"], s1_util["nodes"], s1_util["devices"]) == ("v5litepod-4", "2",
                                                                               "4")  # fmt: skip
    assert 'data-part="xids"' not in s1
    dom = laid_out(tmp_path, tmp_path / "report.html")
    (body,) = attributes(dom, "body")
    assert int(body["data-links"]) >= 4 and body["data-broken-links"] == ""


def test_tpu_slices_ici_links_cost_per_useful_hour_and_mtbf_per_pool(
    tmp_path: Path, backend_lake: tuple[Path, dict[str, str]]
) -> None:
    lake, env = backend_lake
    html = report(lake, tmp_path / "report.html", env=env).read_text()
    (s1,) = table(html, "tpu-slice-availability")
    assert (s1["slice"], s1["available_pct"]) == ("s1", f"{100 * (1 - 0.5 / fx.HOURS):.1f}")
    assert '<a href="#target-slice-s1">s1</a>' in html.split('data-table="degraded-ici-links"')[1]
    (link,) = table(html, "degraded-ici-links")
    assert (link["slice"], link["link"], link["worst_severity"]) == ("s1", "0", "critical")
    cost = {r["pool"]: r for r in table(html, "cost-per-useful-accelerator-hour")}
    h100 = price_for(fx.H100)
    assert h100 is not None
    useful = (3 * fx.BUSY + fx.IDLE) / 4 / 100  # g1 and g2: three busy GPUs, one idle
    assert cost["train"]["usd_per_useful_hour"] == f"{h100.usd_per_hour / useful:,.2f}"
    mtbf = {r["pool"]: r["mtbf_hours"] for r in table(html, "mtbf-per-pool")}
    assert mtbf == {"train": "4.0", "tpu": "4.0", "infer": ""}


def alerts_fired(html: str) -> str:
    found = re.search(r'<div class="value">([^<]*)</div><div class="label">alerts fired', html)
    assert found, "no alerts fired card"
    return found.group(1)


def test_pool_filters_the_alert_count(
    tmp_path: Path, backend_lake: tuple[Path, dict[str, str]]
) -> None:
    lake, env = backend_lake
    everything = report(lake, tmp_path / "all.html", env=env).read_text()
    infer = report(lake, tmp_path / "infer.html", "--pool", "infer", env=env).read_text()
    train = report(lake, tmp_path / "train.html", "--pool", "train", env=env).read_text()
    assert (alerts_fired(everything), alerts_fired(infer), alerts_fired(train)) == ("1", "0", "1")


def test_health_changes_leave_out_targets_arriving_healthy(
    tmp_path: Path, backend_lake: tuple[Path, dict[str, str]]
) -> None:
    lake, env = backend_lake
    html = report(lake, tmp_path / "report.html", env=env).read_text()
    health = re.search(r'<svg class="chart" data-chart="health".*?</svg>', html, flags=re.S)
    assert health
    bars = re.findall(r'<rect class="mark"[^>]*><title>([^<]*)</title>', health.group(0))
    # g1 and s1 arrive healthy at 00:00 (no change); the real changes are all there
    assert not any(b.startswith("2026-01-01 00:00 healthy") for b in bars)
    assert sum(float(b.rsplit(": ", 1)[1]) for b in bars) == 8


@pytest.fixture(scope="module")
def demo_lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A demo run's lake: real names (fp-us-east5-h200-train-010), long checks and reasons,
    quota metrics, and a 64-chip v5p-128 slice."""
    out = tmp_path_factory.mktemp("demo")
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "demo", "--out", str(out), "--gpu-nodes", "24",
         "--tpu-slices", "4", "--hours", "0.5", "--intensity", "2000", "--no-report"],
        capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return out / "lake"


@pytest.mark.parametrize("source", ["fixture", "demo"])
def test_no_table_is_wider_than_the_page_and_headers_are_words(
    tmp_path: Path, demo_lake: Path, source: str
) -> None:
    lake = demo_lake if source == "demo" else fx.build_lake(tmp_path / "lake")
    page = report(lake, tmp_path / "report.html")
    html = page.read_text()
    headers = re.findall(r"<th[^>]*>([^<]*)</th>", html)
    assert headers and [h for h in headers if "_" in h] == [], "column names, not words"
    dom = laid_out(tmp_path, page)
    (body,) = attributes(dom, "body")
    assert body["data-wide-tables"] == "", f"tables wider than their box: {body['data-wide-tables']}"
    assert int(body["data-scroll-width"]) <= WIDTH


def test_a_slice_is_one_utilization_row_and_names_sort_naturally(tmp_path: Path,
                                                                 demo_lake: Path) -> None:
    html = report(demo_lake, tmp_path / "report.html").read_text()
    slices = {r["slice"]: r for r in table(html, "tpu-slice-availability")}
    big = next(name for name, row in slices.items() if row["chips"] == "64")
    section = target_section(html, f"target-slice-{big}")
    (util,) = table('data-table="utilization"' + section.split('data-part="utilization"')[1],
                    "utilization")  # fmt: skip
    assert (util["devices"], util["nodes"]) == ("64", "16")
    assert re.fullmatch(r"\d+\.\d", util["util_mean_pct"]), util  # 0.1 %, not 0.01
    assert util["lowest_device"].startswith(big)  # names the least used chip's host
    # rows that tie on every number keep their names in natural order (node-2 before node-10;
    # the simulator's names are zero-padded, so tests/unit/test_report_format.py shows that)
    text = ("target_name", "target_kind", "pool", "zone", "checks", "action_kinds")
    rows = [(r["target_name"], [v for k, v in r.items() if k not in text])
            for r in table(html, "top-offenders")]  # fmt: skip
    for (a, numbers_a), (b, numbers_b) in itertools.pairwise(rows):
        assert numbers_a != numbers_b or natural_key(a) <= natural_key(b), (a, b)
