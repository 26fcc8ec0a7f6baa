"""The Iceberg lake's test settings: tables in a SQLite catalog under a test's folder (or, with
`catalog="postgres"`, in the PostgreSQL that deploy/with-services.sh starts with
deploy/postgres/postgres.sh: PG_PORT, PG_USER, PG_PASSWORD, PG_DATABASE, with postgres.sh's
defaults), data on the s3proxy it starts (deploy/s3/s3.sh: S3_PORT, S3_ACCESS_KEY and
S3_SECRET_KEY, with s3.sh's defaults). Each call gets its own prefix in the bucket, and in the
shared PostgreSQL catalog its own namespace."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from pipeline.config import LakeSettings
from pipeline.lake.iceberg import create_bucket
from pipeline.lake.iceberg_writer import IcebergWriter
from pipeline.lake.writer import LakeWriter
from tests import lake_fixture as fx

BUCKET = "fleetpulse-tests"
# the SQL catalogs, for parametrize: SQLite (one machine) and PostgreSQL (several; marked
# `postgres`: it needs the server deploy/with-services.sh starts)
CATALOGS = ("sqlite", pytest.param("postgres", marks=pytest.mark.postgres))


def postgres_catalog() -> str:
    """The URL of the test PostgreSQL's catalog database (deploy/postgres/postgres.sh env)."""
    env = os.environ
    return (f"postgresql+psycopg2://{env.get('PG_USER', 'fleetpulse')}:"
            f"{env.get('PG_PASSWORD', 'fleetpulse-secret')}@127.0.0.1:"
            f"{env.get('PG_PORT', '19648')}/{env.get('PG_DATABASE', 'fleetpulse_catalog')}")


def iceberg_settings(folder: Path, catalog: str = "sqlite", **extra: Any) -> LakeSettings:
    """Settings for a fresh Iceberg lake: its catalog in `folder` (sqlite) or a namespace of
    its own in the test PostgreSQL (postgres), its data under a new prefix of the test bucket
    (created if missing)."""
    port = os.environ.get("S3_PORT", "19645")
    run = uuid.uuid4().hex[:12]
    if catalog == "sqlite":
        url, namespace = f"sqlite:///{folder / 'catalog.db'}", LakeSettings().namespace
    elif catalog == "postgres":
        url, namespace = postgres_catalog(), f"fleetpulse_{run}"
    else:
        raise ValueError(f"iceberg_settings: expected sqlite or postgres, got {catalog!r}")
    settings = LakeSettings(
        path=str(folder),
        uri=f"s3://{BUCKET}/{run}",
        catalog=url,
        namespace=namespace,
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
        "FLEETPULSE_LAKE__NAMESPACE": settings.namespace,
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


# The lake's backends, for parametrize, in tests about what the lake stores and answers: the
# local Parquet lake (tests/lake_fixture.py's folder) and the same tables as Iceberg on s3proxy
# (marked `s3`: it needs the s3proxy deploy/with-services.sh starts; `-m "not s3"` leaves it out).
BACKENDS = ("local", pytest.param("iceberg", marks=pytest.mark.s3))


def build_fixture_lake(backend: str, folder: Path) -> tuple[Path, LakeSettings]:
    """tests/lake_fixture.py's lake on `backend`: the folder and settings a `Lake` opens it with
    (local: `folder` itself and the default settings; iceberg: the catalog and cache in
    `folder`, the tables on s3proxy)."""
    if backend == "local":
        return fx.build_lake(folder), LakeSettings()
    if backend == "iceberg":
        folder.mkdir(parents=True, exist_ok=True)
        return folder, build_iceberg_lake(folder)
    raise ValueError(f"build_fixture_lake: expected local or iceberg, got {backend!r}")


def fixture_writer(root: Path, settings: LakeSettings) -> LakeWriter | IcebergWriter:
    """A writer into the lake `build_fixture_lake` gave (a test adds its own rows with it):
    `add(table, event, (topic, partition, offset))`, then `checkpoint()`."""
    return IcebergWriter(settings) if settings.uri else LakeWriter(root, settings)
