"""One frozen Settings object: defaults < TOML file < FLEETPULSE_<SECTION>__<KEY> environment.

Read once in the CLI and passed down; nothing else reads the environment or the file.
Example: FLEETPULSE_KAFKA__BOOTSTRAP=broker:9092 overrides [kafka] bootstrap.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from pipeline.errors import ConfigError

ENV_PREFIX = "FLEETPULSE_"
DEFAULT_CONFIG = Path("fleetpulse.toml")
PositiveInt = Annotated[int, Meta(ge=1)]
Fraction = Annotated[float, Meta(ge=0.0, le=1.0)]


class Section(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of a config section; unknown keys are errors, so typos never pass silently."""


class KafkaSettings(Section, frozen=True):
    bootstrap: str = "127.0.0.1:19092"
    client_id: str = "fleetpulse"
    # Co-partitioned topics (gpu telemetry / xid / findings by node; tpu / ici by slice)
    # must share this count so a node's or slice's records meet in one partition.
    partitions: PositiveInt = 6
    replication: PositiveInt = 1
    retention_ms: PositiveInt = 7 * 24 * 3600 * 1000
    topic_prefix: str = "fleet"


class MetricsSettings(Section, frozen=True):
    """Self-metrics of long-running processes (prometheus-client /metrics)."""

    port: Annotated[int, Meta(ge=0, le=65535)] = 9108  # 0 = pick a free port


class LakeSettings(Section, frozen=True):
    path: str = "lake"
    row_group_rows: PositiveInt = 128_000
    flush_rows: PositiveInt = 200_000
    flush_seconds: PositiveInt = 60


class SourcesSettings(Section, frozen=True):
    """Ingest adapters (`fleetpulse ingest <source>`): endpoints, identity, polling, checkpoints.

    Identity fields (cluster, pool, zone, node) fill what an endpoint does not say itself:
    dcgm-exporter has no cluster/pool/zone labels unless Prometheus adds them, a kernel log
    does not name its node.
    """

    state_dir: str = ".cache/sources"  # checkpoint files, one JSON per source
    cluster: str = "local"
    pool: str = "default"
    zone: str = "local-a"
    node: str = ""  # this host (xid, tpu_runtime); "" = the host name
    poll_interval_s: Annotated[float, Meta(gt=0)] = 15.0
    backoff_initial_s: Annotated[float, Meta(gt=0)] = 1.0
    backoff_max_s: Annotated[float, Meta(gt=0)] = 60.0
    prometheus_url: str = "http://127.0.0.1:9090"
    # Data younger than the lag is not read yet: a scrape lands up to one interval late.
    prometheus_lag_s: Annotated[float, Meta(ge=0)] = 30.0
    prometheus_max_lookback_s: Annotated[float, Meta(gt=0)] = 600.0
    cloudmon_endpoint: str = ""  # "" = the real API; "host:port" = a plaintext stand-in
    cloudmon_project: str = "fleetpulse-sim"
    cloudmon_inventory: str = ""  # JSON: tpu_worker -> node/slice/pool (see sources/cloudmon.py)
    cloudmon_lag_s: Annotated[float, Meta(ge=0)] = 180.0  # Cloud Monitoring is ~3 min behind
    cloudmon_max_lookback_s: Annotated[float, Meta(gt=0)] = 3600.0
    cloudmon_page_size: PositiveInt = 1000
    tpu_runtime_endpoint: str = "127.0.0.1:8431"
    tpu_slice: str = ""
    tpu_accelerator_type: str = ""
    tpu_topology: str = ""
    tpu_worker_id: Annotated[int, Meta(ge=0)] = 0
    xid_log_path: str = "/var/log/kern.log"


class AlertSettings(Section, frozen=True):
    """`fleetpulse alerts`: fleet.alerts to webhooks and Alertmanager; offsets commit after 2xx."""

    webhook_urls: list[str] = []
    alertmanager_url: str = ""  # e.g. http://127.0.0.1:9093
    group_id: str = "fleetpulse-alerts"
    timeout_s: Annotated[float, Meta(gt=0)] = 10.0
    max_attempts: PositiveInt = 5
    backoff_initial_s: Annotated[float, Meta(gt=0)] = 0.5
    backoff_max_s: Annotated[float, Meta(gt=0)] = 30.0


class Settings(Section, frozen=True):
    kafka: KafkaSettings = KafkaSettings()
    metrics: MetricsSettings = MetricsSettings()
    lake: LakeSettings = LakeSettings()
    sources: SourcesSettings = SourcesSettings()
    alerts: AlertSettings = AlertSettings()


def load_settings(path: Path | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """Load defaults, then the TOML file (if any), then environment overrides; validate all."""
    environ = os.environ if environ is None else environ
    data: dict[str, Any] = {}
    if path is None and "FLEETPULSE_CONFIG" in environ:
        path = Path(environ["FLEETPULSE_CONFIG"])
    chosen = path
    if chosen is not None:
        data = _read_toml(chosen)
    elif DEFAULT_CONFIG.exists():
        data = _read_toml(DEFAULT_CONFIG)
    for section, key, value in _env_overrides(environ):
        data.setdefault(section, {})[key] = _parse_env_value(value)
    try:
        return msgspec.convert(data, Settings, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid configuration: {_config_path(str(exc))}") from None


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None


def _env_overrides(environ: Mapping[str, str]) -> list[tuple[str, str, str]]:
    overrides = []
    for name, value in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX) or name == "FLEETPULSE_CONFIG":
            continue
        section, sep, key = name[len(ENV_PREFIX) :].lower().partition("__")
        if not sep or not key:
            raise ConfigError(
                f"environment variable {name}: expected FLEETPULSE_<SECTION>__<KEY>, "
                f"for example FLEETPULSE_KAFKA__BOOTSTRAP"
            )
        overrides.append((section, key, value))
    return overrides


def _parse_env_value(value: str) -> Any:
    # Values are parsed as TOML scalars where they can be ("5", "true", "[1, 2]"), else strings.
    try:
        return tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        return value


def _config_path(message: str) -> str:
    # msgspec says "... - at `$.kafka.partitions`"; users think in "kafka.partitions".
    return message.replace("`$.", "`").replace("$.", "")
