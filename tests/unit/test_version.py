"""One version: `pipeline.__version__` is the package's (pyproject reads it), `fleetpulse
--version` prints it, the chart deploys it (appVersion, the image tag's default), the image
says it (its version label), and the changelog's newest entry and the docs' build lines name it.
A release bumps `pipeline/__init__.py`; this test lists whatever else was forgotten."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml  # type: ignore[import-untyped]

from pipeline import __version__
from pipeline.cli import main

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "fleetpulse"


def test_the_version_is_a_release_number() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", __version__), __version__


def test_the_package_takes_its_version_from_the_code() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in project["project"], "a second version in pyproject.toml"
    assert "version" in project["project"]["dynamic"]
    dynamic = project["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "pipeline.__version__"}


def test_fleetpulse_version_prints_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["--version"])
    assert stopped.value.code == 0
    assert capsys.readouterr().out.strip() == f"fleetpulse {__version__}"


def test_the_chart_deploys_this_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == __version__, \
        f"Chart.yaml appVersion {chart['appVersion']!r}, the package is {__version__!r}"
    # the image tag: the values' tag when set, else the appVersion
    tag = yaml.safe_load((CHART / "values.yaml").read_text())["image"].get("tag") or __version__
    assert tag == __version__, f"values.yaml image.tag {tag!r}, the package is {__version__!r}"


def test_the_image_is_labelled_and_documented_with_this_version() -> None:
    containerfile = (REPO / "Containerfile").read_text()
    labels = re.findall(r'org\.opencontainers\.image\.version="([^"]*)"', containerfile)
    assert labels == [__version__], f"the Containerfile's version label: {labels}"
    # every `fleetpulse:<version>` image reference in the Containerfile and the docs
    texts = [containerfile, (REPO / "README.md").read_text()]
    texts += [p.read_text() for p in (REPO / "docs").glob("*.md")]
    tags = {t for text in texts for t in re.findall(r"fleetpulse:(\d+\.\d+\.\d+)", text)}
    assert tags <= {__version__}, f"image tags in the docs: {sorted(tags)}, not {__version__}"


def test_the_changelog_starts_with_this_version() -> None:
    headings = re.findall(r"^## \[?(\d+\.\d+\.\d+)", (REPO / "CHANGELOG.md").read_text(), re.M)
    assert headings and headings[0] == __version__, headings
