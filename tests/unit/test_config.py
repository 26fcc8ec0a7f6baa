"""Settings: defaults < TOML < environment, validated with errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.config import Settings, load_settings
from pipeline.errors import ConfigError


def test_defaults_without_file_or_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert load_settings(environ={}) == Settings()


def test_toml_file_then_environment_override(tmp_path: Path) -> None:
    path = tmp_path / "fp.toml"
    path.write_text('[kafka]\nbootstrap = "kafka-1:9092"\npartitions = 12\n')
    settings = load_settings(path, environ={"FLEETPULSE_KAFKA__PARTITIONS": "24"})
    assert settings.kafka.bootstrap == "kafka-1:9092"
    assert settings.kafka.partitions == 24


def test_settings_are_frozen() -> None:
    settings = Settings()
    with pytest.raises(AttributeError):
        settings.kafka.partitions = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("environ", "words"),
    [
        ({"FLEETPULSE_KAFKA__PARTITIONS": "0"}, "kafka.partitions"),
        ({"FLEETPULSE_KAFKA__PARTITIONS": "many"}, "kafka.partitions"),
        ({"FLEETPULSE_KAFKA__BOOTSTRAPP": "x:1"}, "bootstrapp"),
        ({"FLEETPULSE_KAFKA": "x"}, "FLEETPULSE_<SECTION>__<KEY>"),
        # names stamped on every event: refused at start, not dead-lettered event by event
        ({"FLEETPULSE_SOURCES__POOL": "GPU pool"}, "sources.pool"),
        ({"FLEETPULSE_SOURCES__CLUSTER": ""}, "sources.cluster"),
        ({"FLEETPULSE_KUBERNETES__CLUSTER": "a/b"}, "kubernetes.cluster"),
    ],
)
def test_bad_overrides_name_the_key(
    environ: dict[str, str], words: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=words):
        load_settings(environ=environ)


def test_missing_and_broken_files_are_clear(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.toml", environ={})
    broken = tmp_path / "broken.toml"
    broken.write_text("[kafka\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(broken, environ={})
