"""The Iceberg lake's test settings: tables in a SQLite catalog under a test's folder, data on
the s3proxy that deploy/with-services.sh (deploy/s3/s3.sh) starts: S3_PORT, S3_ACCESS_KEY and
S3_SECRET_KEY, with s3.sh's defaults. Each call gets its own prefix in the bucket."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

from pipeline.config import LakeSettings
from pipeline.lake.iceberg import IcebergWriter, create_bucket
from tests import lake_fixture as fx

BUCKET = "fleetpulse-tests"


def iceberg_settings(folder: Path, **extra: Any) -> LakeSettings:
    """Settings for a fresh Iceberg lake: its catalog in `folder`, its data under a new
    prefix of the test bucket (created if missing)."""
    port = os.environ.get("S3_PORT", "19645")
    settings = LakeSettings(
        path=str(folder),
        uri=f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}",
        catalog=f"sqlite:///{folder / 'catalog.db'}",
        s3_endpoint=f"http://127.0.0.1:{port}",
        s3_access_key_id=os.environ.get("S3_ACCESS_KEY", "fleetpulse"),
        s3_secret_access_key=os.environ.get("S3_SECRET_KEY", "fleetpulse-secret"),
        **extra,
    )
    create_bucket(settings)
    return settings


def settings_env(settings: LakeSettings) -> dict[str, str]:
    """The FLEETPULSE_LAKE__* variables that give a `fleetpulse` process these settings."""
    return {
        "FLEETPULSE_LAKE__PATH": settings.path,
        "FLEETPULSE_LAKE__URI": settings.uri,
        "FLEETPULSE_LAKE__CATALOG": settings.catalog,
        "FLEETPULSE_LAKE__S3_ENDPOINT": settings.s3_endpoint,
        "FLEETPULSE_LAKE__S3_ACCESS_KEY_ID": settings.s3_access_key_id,
        "FLEETPULSE_LAKE__S3_SECRET_ACCESS_KEY": settings.s3_secret_access_key,
    }


def build_iceberg_lake(folder: Path, **extra: Any) -> LakeSettings:
    """tests/lake_fixture.py's lake, every table, as Iceberg tables (one commit per table)."""
    settings = iceberg_settings(folder, **extra)
    writer = IcebergWriter(settings)
    for table, events in fx.EVERYTHING.items():
        for offset, event in enumerate(events()):
            writer.add(table, event, (f"t.{table}", 0, offset))
    writer.checkpoint()
    return settings


# The lake's backends, for tests about what the lake stores and answers: the local Parquet lake
# (tests/lake_fixture.py's folder) and the same tables as Iceberg on s3proxy.
BACKENDS = ("local", "iceberg")


def build_fixture_lake(backend: str, folder: Path) -> tuple[Path, LakeSettings]:
    """tests/lake_fixture.py's lake on `backend`: the folder and settings a `Lake` opens it with
    (local: `folder` itself and the default settings; iceberg: the catalog and cache in
    `folder`, the tables on s3proxy)."""
    if backend == "local":
        return fx.build_lake(folder), LakeSettings()
    if backend == "iceberg":
        folder.mkdir(parents=True, exist_ok=True)
        return folder, build_iceberg_lake(folder)
    raise ValueError(f"build_fixture_lake: expected one of {BACKENDS}, got {backend!r}")
