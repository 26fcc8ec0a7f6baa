"""One frozen Settings object: defaults < TOML file < FLEETPULSE_<SECTION>__<KEY> environment.

Read once in the CLI and passed down; nothing else reads the environment or the file.
Example: FLEETPULSE_KAFKA__BOOTSTRAP=broker:9092 overrides [kafka] bootstrap.
"""

from __future__ import annotations

import base64
import binascii
import math
import os
import re
import tomllib
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from pipeline.errors import ConfigError
from pipeline.model import NAME_PATTERN
from pipeline.redact import redact

# The names the sources stamp on every event, which the events check as they are built: a
# bad one is a start-up error naming the key, not a dead letter per event.
FleetName = Annotated[str, Meta(pattern=NAME_PATTERN)]
FleetNameOrEmpty = Annotated[str, Meta(pattern=f"{NAME_PATTERN}|^$")]

ENV_PREFIX = "FLEETPULSE_"
DEFAULT_CONFIG = Path("fleetpulse.toml")
PositiveInt = Annotated[int, Meta(ge=1)]
Fraction = Annotated[float, Meta(ge=0.0, le=1.0)]
Percent = Annotated[float, Meta(ge=0.0, le=100.0)]


class Section(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of a config section; unknown keys are errors, so typos never pass silently."""


_SASL_FIELDS = ("sasl_mechanism", "sasl_username", "sasl_password", "sasl_password_file")
_SSL_FIELDS = ("ssl_cafile", "ssl_certfile", "ssl_keyfile")


class KafkaSettings(Section, frozen=True):
    bootstrap: str = "127.0.0.1:19092"
    client_id: str = "fleetpulse"
    # Co-partitioned topics (gpu telemetry / xid / findings by node; tpu / ici by slice)
    # must share this count so a node's or slice's records meet in one partition.
    partitions: PositiveInt = 6
    replication: PositiveInt = 1
    retention_ms: PositiveInt = 7 * 24 * 3600 * 1000
    topic_prefix: str = "fleet"
    # Every consumer refuses a value larger than this before parsing it (a dead letter with
    # reason "too_large"): our largest values, a big node's GPU scrape, are tens of kB, and a
    # runaway producer must not cost a consumer its memory. The broker's own limit
    # (message.max.bytes, 1 MiB by default) usually stops larger ones first.
    max_value_bytes: PositiveInt = 1 << 20
    # How FleetPulse's own producers (ingest adapters, simulator) write telemetry values (GPU,
    # TPU, ICI samples): msgpack (marked by a `content-type: application/msgpack` header,
    # smaller, and cheaper to decode) or JSON. Consumers accept both on every topic; actions,
    # alerts, node states and findings are always JSON (pipeline/wire/codec.py).
    telemetry_format: Literal["msgpack", "json"] = "msgpack"
    # Write each poll's (the simulator: each tick's) telemetry as batch records, one per topic
    # and partition holding many nodes' samples, instead of one record per node or slice: the
    # worker's per-record cost is then paid once per batch (pipeline/wire/batches.py; the
    # README's throughput table). The worker reads both; set false where another consumer of
    # the telemetry topics expects a record per node. Each value goes to the partition its
    # key's own record would (the producer asks the broker how many the topic has).
    telemetry_batch: bool = True
    # How FleetPulse's producers compress record batches on the wire (and so on the broker's
    # disk): zstd (17x on the simulator's telemetry, gzip 15x: bench/bench_compression.py),
    # lz4, gzip, snappy, or none. Every consumer decompresses whatever it is given; zstd needs
    # the zstandard (kafka-python) and cramjam (aiokafka, faust) packages, lz4 and snappy the
    # lz4 and python-snappy packages (not installed by default).
    compression: Literal["zstd", "lz4", "gzip", "snappy", "none"] = "zstd"
    # The worker writes its utilization rows (a row per device and window: most of what it
    # writes) as batch records too, one per partition and settled batch, each value JSON and
    # in the partition its own key picks. The lake sink reads both; set false where another
    # consumer of the utilization topic expects a JSON record per device.
    utilization_batch: bool = True
    # Security, one section for every client (pipeline/wire/kafka.py builds each library's
    # arguments from it). The password comes from sasl_password (e.g. from
    # FLEETPULSE_KAFKA__SASL_PASSWORD) or, better, sasl_password_file (a mounted secret).
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = ""
    sasl_username: str = ""
    sasl_password: str = ""
    sasl_password_file: str = ""
    ssl_cafile: str = ""  # "" = the system CAs
    ssl_certfile: str = ""  # client certificate (mutual TLS), with ssl_keyfile
    ssl_keyfile: str = ""
    ssl_check_hostname: bool = True  # the broker certificate must name the host we dialled

    def __post_init__(self) -> None:
        sasl = self.security_protocol.startswith("SASL_")
        given = [n for n in _SASL_FIELDS if getattr(self, n)]
        if not sasl and given:
            raise ValueError(
                f"{', '.join(given)} set, but security_protocol is {self.security_protocol}: "
                "use SASL_SSL or SASL_PLAINTEXT"
            )
        if sasl:
            if not self.sasl_mechanism:
                raise ValueError(
                    f"security_protocol {self.security_protocol} needs sasl_mechanism "
                    "(PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)"
                )
            if not self.sasl_username:
                raise ValueError(f"security_protocol {self.security_protocol} needs sasl_username")
            if not (self.sasl_password or self.sasl_password_file):
                raise ValueError(
                    f"security_protocol {self.security_protocol} needs sasl_password "
                    "or sasl_password_file"
                )
        if self.sasl_password and self.sasl_password_file:
            raise ValueError("set sasl_password or sasl_password_file, not both")
        if bool(self.ssl_certfile) != bool(self.ssl_keyfile):
            raise ValueError("set ssl_certfile and ssl_keyfile together (client certificate)")
        tls = self.security_protocol in ("SSL", "SASL_SSL")
        tls_given = [n for n in _SSL_FIELDS if getattr(self, n)]
        if not tls and tls_given:
            raise ValueError(
                f"{', '.join(tls_given)} set, but security_protocol is {self.security_protocol}: "
                "use SSL or SASL_SSL"
            )

    def __repr__(self) -> str:
        return _masked_repr(self, frozenset({"sasl_password"}))


# Each kind of long-running process has its own /metrics port, so the README's setup (worker,
# sink, alerts and the adapters on one host) starts without a clash; next to the exporters'
# usual 91xx range. An explicit metrics.port overrides it (0 = any free port).
DEFAULT_METRICS_PORTS: dict[str, int] = {
    "worker": 9108,
    "lake_sink": 9109,
    "alerts": 9110,
    "ingest_prometheus": 9111,
    "ingest_cloudmon": 9112,
    "ingest_tpu_runtime": 9113,
    "ingest_xid": 9114,
    "ingest_capacity": 9115,
    "actuate_kubernetes": 9116,
    "watch_kubernetes": 9117,
    "actuate_slurm": 9118,
    "watch_slurm": 9119,
}


class MetricsSettings(Section, frozen=True):
    """/metrics, /healthz and /readyz of long-running processes (worker, sinks, ingest, alerts).

    host: all interfaces by default, as exporters do, so Prometheus and the kubelet reach it;
    "127.0.0.1" keeps it on the host. port: unset = the process kind's default
    (DEFAULT_METRICS_PORTS), 0 = any free port (printed or logged at start). A taken port stops
    the process at start with an error naming it; there is no fallback.
    """

    host: str = "0.0.0.0"
    port: Annotated[int, Meta(ge=0, le=65535)] | None = None

    def port_for(self, process: str) -> int:
        """The port `process` (a DEFAULT_METRICS_PORTS key) listens on."""
        if self.port is not None:
            return self.port
        return DEFAULT_METRICS_PORTS[process]


class LakeSettings(Section, frozen=True):
    """The Parquet lake (`fleetpulse sink lake`, `lake compact`, `sql`, `report`)."""

    path: str = "lake"
    # Measured (bench/lake.py, `compression_choices` in bench/results/lake.json): on a million
    # utilization rows every codec lands at 2.7-3.2 B/row (the columns are dictionary- and
    # run-length-encoded first). zstd 3 is the smallest and, within the noise, as fast as
    # zstd 1; snappy and lz4 are 5-10 % bigger and not reliably faster; zstd 6 is slower for
    # nothing. 512k-row groups save 2 % more but make the queries' row-group pruning coarser.
    row_group_rows: PositiveInt = 128_000
    flush_rows: PositiveInt = 200_000
    flush_seconds: PositiveInt = 60
    compression_level: Annotated[int, Meta(ge=1, le=22)] = 3  # zstd
    group_id: str = "fleetpulse-lake"
    # how long a crashed sink keeps its partitions before the group hands them to another
    session_timeout_s: Annotated[int, Meta(ge=6, le=300)] = 45
    # Compaction merges a partition's files once it holds this many, into files of at most
    # compact_rows rows; temporary files older than stale_tmp_s are left-overs of a crash.
    compact_min_files: Annotated[int, Meta(ge=2)] = 4
    compact_rows: PositiveInt = 2_000_000
    stale_tmp_s: PositiveInt = 3600
    # merged files stay this long after compaction, so queries that listed them can finish
    compact_keep_s: Annotated[int, Meta(ge=0)] = 600
    # USD per accelerator-hour by model regex (as in catalog/prices.csv), ahead of the list
    # prices: {"H100" = 6.5} makes every H100 cost 6.5 whatever the catalog says.
    prices: dict[str, Annotated[float, Meta(gt=0)]] = {}
    # A device-window below this mean utilization counts as idle in the canned analyses.
    idle_util_pct: Annotated[float, Meta(ge=0.0, le=100.0)] = 5.0
    # Iceberg tables on an S3-API store instead of the local Parquet lake (docs/lake-iceberg.md):
    # uri = "s3://bucket/prefix" switches the sink and every reader to the tables of the SQL
    # catalog `catalog` (a SQLAlchemy URL: sqlite:////var/lib/fleetpulse/catalog.db on one
    # machine, postgresql+psycopg2://… for many). Empty uri: the local lake at `path`.
    uri: str = ""
    catalog: str = ""
    namespace: str = "fleetpulse"
    s3_endpoint: str = ""  # empty: AWS itself; else e.g. http://127.0.0.1:19645
    s3_region: str = "us-east-1"
    # empty: the AWS SDK's own chain (AWS_ACCESS_KEY_ID…, instance roles)
    s3_access_key_id: str = ""
    s3_secret_access_key: str = ""
    # snapshots older than this are expired by `lake compact` (the newest is always kept)
    snapshot_keep_s: Annotated[int, Meta(ge=0)] = 7 * 86400
    # per Iceberg table (a TABLES name or utilization_hourly): `lake compact` drops its day
    # partitions older than this many days (absent: kept for ever), and expires its snapshots
    # after these seconds instead of snapshot_keep_s
    retention_days: dict[str, Annotated[int, Meta(ge=1)]] = {}
    snapshot_keep_s_by_table: dict[str, Annotated[int, Meta(ge=0)]] = {}
    # a utilization_timeline over at least this range (whole hours) reads the hourly rollup
    rollup_min_range_s: Annotated[int, Meta(ge=3600)] = 3 * 86400
    # readers copy the Iceberg data files they read here once (they never change), so DuckDB
    # scans them at local speed; empty: <path>/_iceberg_cache. Safe to wipe at any time.
    cache_path: str = ""

    def __post_init__(self) -> None:
        if self.uri and not self.uri.startswith("s3://"):
            raise ValueError(f"lake.uri: expected s3://bucket/prefix or empty, got {self.uri!r}")
        if self.uri and not self.catalog:
            raise ValueError("lake.uri is set: lake.catalog (a SQLAlchemy URL) must be too")

    def __repr__(self) -> str:
        return _masked_repr(self, frozenset({"s3_secret_access_key"}))


class AggregateSettings(Section, frozen=True):
    """Event-time utilization windows (pipeline/stages/windows.py)."""

    window_s: Annotated[int, Meta(ge=1, le=3600)] = 60
    # A window closes once the key's newest event time passes its end by grace_s; records
    # older than a closed window are late: counted, not aggregated.
    grace_s: Annotated[int, Meta(ge=0, le=3600)] = 30


class SourcesSettings(Section, frozen=True):
    """Ingest adapters (`fleetpulse ingest <source>`): endpoints, identity, polling, checkpoints.

    Identity fields (cluster, pool, zone, node) fill what an endpoint does not say itself:
    dcgm-exporter has no cluster/pool/zone labels unless Prometheus adds them, a kernel log
    does not name its node.
    """

    state_dir: str = ".cache/sources"  # checkpoint files, one JSON per source
    cluster: FleetName = "local"
    pool: FleetName = "default"
    zone: FleetName = "local-a"
    node: FleetNameOrEmpty = ""  # this host (xid, tpu_runtime); "" = the host name
    poll_interval_s: Annotated[float, Meta(gt=0)] = 15.0
    backoff_initial_s: Annotated[float, Meta(gt=0)] = 1.0
    backoff_max_s: Annotated[float, Meta(gt=0)] = 60.0
    prometheus_url: str = "http://127.0.0.1:9090"
    # Data younger than the lag is not read yet: a scrape lands up to one interval late.
    prometheus_lag_s: Annotated[float, Meta(ge=0)] = 30.0
    prometheus_max_lookback_s: Annotated[float, Meta(gt=0)] = 600.0
    # The label that names a GPU's node, tried before `node`, `Hostname`, `hostname` and the
    # host of `instance`. Static scrape of <node>:9400: instance is the node (or the DaemonSet
    # sets NODE_NAME, so Hostname is). Kubernetes/Prometheus Operator: relabel
    # __meta_kubernetes_pod_node_name to `node` (or name your target label here), because
    # Hostname is the exporter pod's hostname unless NODE_NAME is set.
    prometheus_node_label: str = "node"
    # Auth and TLS as Alertmanager's http_config (certificates checked unless told otherwise):
    # prometheus_http = {bearer_token_file = "/run/secrets/prom-token", tls_ca_file = "ca.pem"}
    # or FLEETPULSE_SOURCES__PROMETHEUS_HTTP='{basic_username = "u", basic_password_file = "/p"}'
    # (a factory: HttpClientSettings is defined further down this module)
    prometheus_http: HttpClientSettings = msgspec.field(
        default_factory=lambda: HttpClientSettings()
    )
    # Sent with every query, e.g. {"X-Scope-OrgID" = "team-a"} for Thanos / Cortex / Mimir
    # tenants. Not treated as secrets: put credentials in prometheus_http.
    prometheus_headers: dict[str, str] = {}
    # Label matchers added to the DCGM query, so several adapters can each read a shard of a
    # large Prometheus: '{shard="a"}' or 'cluster=~"eu-.*",pool!="spare"'. "" = every series.
    # In the environment leave out the braces (a braced value reads as a TOML table):
    # FLEETPULSE_SOURCES__PROMETHEUS_SELECTOR='shard="a"'.
    prometheus_selector: str = ""
    # This adapter's share of the nodes, "i/N" (0 <= i < N): N adapters with i = 0..N-1 read
    # disjoint sets of nodes, every node once (a node goes to the shard its name hashes to;
    # series without the node label go to shard 0). "" = every node. docs/sizing.md.
    prometheus_shard: str = ""
    # Nodes per query: a poll reads its nodes in queries of at most this many, so no response
    # grows with the fleet (about 30 series per GPU); 0 = one query for every series.
    prometheus_nodes_per_query: Annotated[int, Meta(ge=0)] = 0
    # Also read node_exporter's InfiniBand / netdev port series (node_infiniband_*,
    # node_network_*) through the same Prometheus, as fabric_sample/2 (telemetry.fabric).
    prometheus_fabric: bool = True
    # node_exporter does not say whether an HCA's port is InfiniBand or Ethernet (RoCE,
    # iWARP): HCA name patterns (fnmatch) -> link layer, the first match winning over what the
    # names suggest, e.g. {"mlx5_[0-7]" = "infiniband", "mlx5_*" = "ethernet"}. A port no
    # source and no pattern names is "unknown" (sources/prometheus_ports.py).
    prometheus_fabric_link_layers: dict[str, Literal["infiniband", "ethernet"]] = {}
    # The gauge a training job publishes per rank: seconds its last step computed (waits in
    # collectives left out), labels node and gpu (sources/prometheus_step.py); joined into
    # gpu_sample readings as step_compute_s for the job-peer check. "" = not read.
    prometheus_step_metric: str = "job_step_compute_seconds"
    cloudmon_endpoint: str = ""  # "" = the real API; "host:port" = a plaintext stand-in
    cloudmon_project: str = "fleetpulse-sim"
    cloudmon_inventory: str = ""  # JSON: tpu_worker -> node/slice/pool (see sources/cloudmon.py)
    # which TPUs: tpu-vm (tpu_worker), gke (k8s_node/k8s_container/k8s_node_pool) or all
    cloudmon_mode: Literal["tpu-vm", "gke", "all"] = "tpu-vm"
    cloudmon_lag_s: Annotated[float, Meta(ge=0)] = 180.0  # Cloud Monitoring is ~3 min behind
    cloudmon_max_lookback_s: Annotated[float, Meta(gt=0)] = 3600.0
    cloudmon_page_size: PositiveInt = 1000
    tpu_runtime_endpoint: str = "127.0.0.1:8431"
    tpu_slice: str = ""
    tpu_accelerator_type: str = ""
    tpu_topology: str = ""
    tpu_worker_id: Annotated[int, Meta(ge=0)] = 0
    xid_log_path: str = "/var/log/kern.log"
    # XID storms (a node can print hundreds of thousands of lines): a GPU's first line of an
    # Xid goes out at once; repeats of the same GPU, Xid and process within this many seconds
    # go out as one record with their count (sources/xid.py Coalescer). 0 = every line its own
    # record. Keep it below detect.xid_dedupe_s: a record must fall within one episode.
    xid_coalesce_s: Annotated[float, Meta(ge=0, le=60)] = 10.0
    # Bound on the GPU/Xid/process windows held at once; beyond it the oldest goes out early.
    xid_coalesce_max_keys: Annotated[int, Meta(ge=1)] = 4096

    def __post_init__(self) -> None:
        if self.prometheus_shard and shard_of(self.prometheus_shard) is None:
            raise ValueError(
                f"sources.prometheus_shard: expected \"i/N\" with 0 <= i < N (e.g. \"0/4\"), "
                f"got {self.prometheus_shard!r}"
            )
        if not _MATCHERS.fullmatch(selector_matchers(self.prometheus_selector)):
            raise ValueError(
                f"prometheus_selector {self.prometheus_selector!r}: expected label matchers "
                "like '{shard=\"a\"}' or 'zone=~\"us-.*\",pool!=\"spare\"'"
            )
        if self.prometheus_step_metric and not _METRIC.fullmatch(self.prometheus_step_metric):
            raise ValueError(
                f"prometheus_step_metric {self.prometheus_step_metric!r}: expected a metric "
                'name like "job_step_compute_seconds" (or "" to read none)'
            )
        headers = {name.lower() for name in self.prometheus_headers}
        if "authorization" in headers and _has_auth(self.prometheus_http):
            raise ValueError("set prometheus_http auth or an Authorization header, not both")


# One PromQL label matcher: name, operator, double-quoted value (escapes allowed).
_MATCHER = r'\s*[A-Za-z_][A-Za-z0-9_]*\s*(?:=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"\s*'
_MATCHERS = re.compile(rf"(?:{_MATCHER}(?:,{_MATCHER})*)?")
_METRIC = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def shard_of(text: str) -> tuple[int, int] | None:
    """"i/N" -> (i, N) when 0 <= i < N, else None."""
    index, _, count = text.strip().partition("/")
    if not (index.isdigit() and count.isdigit()) or not 0 <= int(index) < int(count):
        return None
    return int(index), int(count)


def selector_matchers(selector: str) -> str:
    """The matchers of a selector, without braces: '{shard="a"}' -> 'shard="a"'."""
    text = selector.strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1]
    return text.strip().rstrip(",").strip()


def _has_auth(http: HttpClientSettings) -> bool:
    secrets = (http.bearer_token, http.bearer_token_file, http.basic_password)
    return any(secrets) or bool(http.basic_username or http.basic_password_file)


def _masked_repr(struct: msgspec.Struct, secrets: frozenset[str]) -> str:
    """repr with secret values shown as ***, so printing or logging settings leaks nothing."""
    fields = ", ".join(
        f"{name}={'***' if name in secrets and value else repr(value)}"
        for name, value in msgspec.structs.asdict(struct).items()
    )
    return redact(f"{type(struct).__name__}({fields})")  # URLs may hold credentials too


_HTTP_SECRETS = frozenset({"bearer_token", "basic_password"})


class HttpClientSettings(Section, frozen=True):
    """How to reach one HTTP target, as Alertmanager's `http_config`: auth and TLS.

    Credentials come from the value itself (e.g. the whole target list set in
    FLEETPULSE_ALERTS__WEBHOOKS) or, better, from a file (a mounted Kubernetes secret); they are
    never logged. Redirects are never followed: a 3xx answer to a POST is a refusal.
    """

    bearer_token: str = ""  # Authorization: Bearer <token>
    bearer_token_file: str = ""
    basic_username: str = ""  # Authorization: Basic (with basic_password or its file)
    basic_password: str = ""
    basic_password_file: str = ""
    tls_ca_file: str = ""  # "" = the system CAs
    tls_insecure_skip_verify: bool = False  # only for a test target; logged at start

    def __post_init__(self) -> None:
        if self.bearer_token and self.bearer_token_file:
            raise ValueError("set bearer_token or bearer_token_file, not both")
        if self.basic_password and self.basic_password_file:
            raise ValueError("set basic_password or basic_password_file, not both")
        basic = self.basic_username or self.basic_password or self.basic_password_file
        if basic and (self.bearer_token or self.bearer_token_file):
            raise ValueError("set bearer or basic auth, not both")

    def __repr__(self) -> str:
        return _masked_repr(self, _HTTP_SECRETS)


class WebhookTarget(HttpClientSettings, frozen=True, kw_only=True):
    """One webhook receiver with its own auth / TLS settings ([[alerts.webhooks]]) and,
    optionally, its own signing key (secret_file; default: alerts.webhook_secret[_file])."""

    url: str
    secret_file: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_http_url(self.url, "url")


MIN_KEY_BYTES = 24  # HMAC-SHA256 keys: 192 bits, well beyond guessing (the spec's own are 24+)
GENERATE = ('python3 -c "import base64, secrets; '
            "print('whsec_' + base64.b64encode(secrets.token_bytes(32)).decode())\"")


def check_webhook_secret(secret: str) -> None:
    """A Standard Webhooks secret (`whsec_` + base64) of at least MIN_KEY_BYTES, or a ValueError
    that never names the secret (pipeline/sinks/signing.py signs with it)."""
    try:
        size = len(base64.b64decode(secret.removeprefix("whsec_"), validate=True))
    except (binascii.Error, ValueError) as exc:
        raise ValueError(
            f"not a Standard Webhooks secret (expected whsec_ + base64): {type(exc).__name__}"
        ) from None
    if size < MIN_KEY_BYTES:
        raise ValueError(
            f"the key is {size} bytes, expected at least {MIN_KEY_BYTES} random bytes; "
            f"generate one with: {GENERATE}"
        )


def _check_http_url(url: str, setting: str) -> None:
    """Only http(s) URLs with a host: anything else (file://, a bare path) is no receiver."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{setting}: expected an http:// or https:// URL with a host, "
                         f"got {redact(url)!r}")


def _check_seconds(value: float, setting: str) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{setting}: expected a finite number of seconds > 0, got {value}")


class AlertSettings(Section, frozen=True):
    """`fleetpulse alerts`: fleet.alerts to webhooks and Alertmanager; offsets commit after 2xx.

    Webhooks are signed (Standard Webhooks: webhook-id, webhook-timestamp, webhook-signature;
    pipeline/sinks/signing.py verifies them) when a secret is set: webhook_secret (e.g. from
    FLEETPULSE_ALERTS__WEBHOOK_SECRET) or webhook_secret_file, `whsec_` + base64 of at least 24
    random bytes; a [[alerts.webhooks]] target may have its own (secret_file).

    Each target has its own queue and delivers on its own: one slow or failing target never
    delays another. A target whose oldest alert has waited stalled_after_s is stalled (/readyz
    not ready, naming it; fleetpulse_alerts_target_stalled{target} 1); the offsets commit up to
    the oldest alert some target still holds, and past target_queue_max waiting alerts a
    target's oldest go to fleet.dlq (reason target_stalled) so the commit moves on.
    """

    webhook_urls: list[str] = []  # targets without auth settings
    webhooks: list[WebhookTarget] = []  # targets with auth / TLS settings
    webhook_secret: str = ""
    webhook_secret_file: str = ""
    alertmanager_url: str = ""  # e.g. http://127.0.0.1:9093
    alertmanager_http: HttpClientSettings = HttpClientSettings()
    group_id: str = "fleetpulse-alerts"
    # how long a crashed alerts process keeps fleet.alerts before its restart (or another
    # one) may take it over: alerts wait that long (kafka-python's default is 45 s)
    session_timeout_s: Annotated[int, Meta(ge=6, le=300)] = 10
    # seconds, each finite and > 0 (__post_init__ says which arrived otherwise):
    timeout_s: float = 10.0  # the deadline of one whole POST (connect to the answer's last byte)
    max_attempts: PositiveInt = 5
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    stalled_after_s: float = 60.0
    target_queue_max: PositiveInt = 10_000

    def __post_init__(self) -> None:
        if self.webhook_secret and self.webhook_secret_file:
            raise ValueError("set webhook_secret or webhook_secret_file, not both")
        for name in ("timeout_s", "backoff_initial_s", "backoff_max_s", "stalled_after_s"):
            _check_seconds(getattr(self, name), name)
        for i, url in enumerate(self.webhook_urls):
            _check_http_url(url, f"webhook_urls[{i}]")
        if self.alertmanager_url:
            _check_http_url(self.alertmanager_url, "alertmanager_url")
        if self.webhook_secret:
            try:
                check_webhook_secret(self.webhook_secret)
            except ValueError as exc:
                raise ValueError(f"webhook_secret: {exc}") from None

    def __repr__(self) -> str:
        return _masked_repr(self, frozenset({"webhook_secret"}))


class CheckTuning(Section, frozen=True):
    """One check's own settings, overriding the shared ones its catalog spec names:
    persistence (`[detect.checks."gpu.temp.peer"] open_after = 6`, in the spec's unit,
    samples or seconds) and thresholds (`settings = {temp_peer_delta_c = 8.0}`: any `[detect]`
    setting the spec lists; docs/checks.md lists them)."""

    open_after: Annotated[int, Meta(ge=0)] | None = None  # bad this long before it opens
    clear_after: Annotated[int, Meta(ge=1)] | None = None  # good this long before it clears
    settings: dict[str, float | int | bool] = {}  # [detect] settings, for this check only


class DetectSettings(Section, frozen=True):
    """Detector thresholds (pipeline/detect). Sample counts are scrapes of one node or host.

    Defaults assume 15-30 s scrapes; docs/checks.md (generated from pipeline/detect/catalog.py)
    lists every check with the settings it reads. The keys below are shared by the checks that
    name them; `checks` tunes one check's persistence alone:
    `[detect.checks."gpu.temp.peer"]` `open_after = 6`, or from the environment
    FLEETPULSE_DETECT__CHECKS='{"gpu.temp.peer" = {open_after = 6}}'.
    """

    heartbeat_s: PositiveInt = 60  # at most one heartbeat finding per target per this event time
    # own-history baselines: EW mean and EW mean absolute deviation, Huber-clipped updates
    half_life_samples: PositiveInt = 240  # ~1-2 h: slow enough that a fault is not learned
    warmup_samples: PositiveInt = 20  # no statistical verdict before this many samples
    clip_z: Annotated[float, Meta(gt=0)] = 3.0  # residuals clipped to this many scales
    anomaly_adapt: Fraction = 0.05  # baseline learning rate while a series is anomalous
    cusum_k: Annotated[float, Meta(ge=0)] = 0.5  # CUSUM slack, in scales
    cusum_h: Annotated[float, Meta(gt=0)] = 8.0  # CUSUM alarm level, in scales
    # peer comparison (a GPU vs the GPUs of its node on the same job, a chip vs its slice)
    peer_min: Annotated[int, Meta(ge=2)] = 3  # fewer peers in a group: no peer verdict
    peer_mad_k: Annotated[float, Meta(ge=0)] = 4.0  # deviation must also exceed k robust sigmas
    busy_util_pct: Percent = 50.0  # a GPU below this utilisation is not judged on clocks/power
    # ... except its clock, from this utilisation up, while its clock event reasons say it is
    # not idle (0x1): a GPU serving a light load runs kernels at its working clock all the same
    clock_active_util_pct: Percent = 10.0
    temp_peer_delta_c: Annotated[float, Meta(gt=0)] = 6.0  # above its usual offset to peers
    temp_alone_delta_c: Annotated[float, Meta(gt=0)] = 15.0  # above peers, whatever its history
    temp_drift_min_c: Annotated[float, Meta(ge=0)] = 3.0  # CUSUM drift must be at least this
    clock_drop_frac: Fraction = 0.05  # SM clock below peers (or own baseline) by this fraction
    clock_alone_frac: Fraction = 0.15  # below peers by this, whatever its history
    clock_own_frac: Fraction = 0.10  # below its own same-job baseline, no hardware evidence:
    slow_escalate_s: PositiveInt = 1200  # watch first; cordon once it lasted this long
    power_drop_frac: Fraction = 0.15  # power below same-job peers: straggler candidate
    violation_frac: Fraction = 0.05  # share of time throttled (thermal) that counts as evidence
    straggler_min_jobs: PositiveInt = 2  # uncorroborated slowness must follow the GPU across jobs
    gray_persist_samples: PositiveInt = 4  # consecutive anomalous samples before a gray finding
    clear_persist_samples: PositiveInt = 6  # consecutive normal samples before it clears
    # counters (rates derived here; a drop is a reset and counts from zero)
    counter_persist_samples: PositiveInt = 2  # scrapes over a rate limit before a finding
    pcie_replays: Annotated[float, Meta(gt=0)] = 10.0  # PCIe replays within the window ...
    pcie_window_s: PositiveInt = 300  # ... (DCGM alerts at 8/min; a degrading link ramps up)
    pcie_traffic_frac: Fraction = 0.1  # a GPU moving this share of its peers' PCIe bytes ...
    pcie_traffic_min_bps: Annotated[float, Meta(ge=0)] = 5e5  # ... while they move this much
    nvlink_error_scrapes: PositiveInt = 3  # scrapes with NVLink errors within the window
    nvlink_window_s: PositiveInt = 300  # a single correctable burst is noise, not a finding
    nvlink_span_s: Annotated[int, Meta(ge=0)] = 120  # errors must spread over this long
    sbe_watch_per_hour: Annotated[float, Meta(gt=0)] = 5000.0  # SBE noise: watch only
    counter_quiet_s: PositiveInt = 900  # an ECC/remap episode clears after this long quiet
    # staleness
    node_stale_s: PositiveInt = 40  # a node/host silent this long (at least) is stale
    # ... and this long, down (fatal: nothing else will come); 0 = off. Both runtimes pass node
    # and targeted capacity events to detect.note_event, so a preempted, drained or maintained
    # node going silent is expected and never reaches this.
    node_down_s: Annotated[int, Meta(ge=0)] = 120
    stale_intervals: Annotated[float, Meta(ge=1)] = 2.5  # ... or this many of its intervals
    missing_samples: PositiveInt = 2  # scrapes without a known GPU/chip before it is missing
    device_flap_window_s: PositiveInt = 3600  # a GPU/chip back within this is a flap ...
    device_flap_persist: Annotated[int, Meta(ge=2)] = 3  # ... and persistent from this many
    # XIDs
    xid_dedupe_s: PositiveInt = 180  # same XID on the same GPU within this is one episode
    xid_clear_s: PositiveInt = 600  # an XID episode clears after this long without a repeat
    app_xid_window_s: PositiveInt = 86_400  # application-XID recurrence window
    app_xid_min_jobs: PositiveInt = 3  # distinct jobs hit on one GPU before it is blamed
    app_xid_min_strikes: PositiveInt = 4  # or this many separate strikes, whatever the jobs
    # strikes on one GPU alone before it is watched (recurrence has begun; it is not yet blamed)
    app_xid_watch_strikes: Annotated[int, Meta(ge=2)] = 2
    # TPU chips and ICI links
    tpu_busy_pct: Percent = 50.0  # slice peers below this duty cycle: no chip verdict
    tpu_duty_drop_pct: Percent = 30.0  # chip duty cycle this many points below its peers
    tpu_util_drop_frac: Fraction = 0.3  # chip TensorCore utilisation below peers: watch
    tpu_persist_s: PositiveInt = 30  # a chip/link condition must hold this long
    tpu_clear_s: PositiveInt = 120  # ... and be gone this long to clear
    ici_down_health: Annotated[int, Meta(ge=1, le=10)] = 10  # health at or above: link down
    ici_link_persist_s: Annotated[int, Meta(ge=0)] = 5  # both ends down: confirm once (OCS)
    ici_one_sided_s: PositiveInt = 120  # down at one end only, the other end healthy
    ici_flit_drop_frac: Fraction = 0.5  # link flit rate below its usual share: degraded
    ici_errors_per_s: Annotated[float, Meta(gt=0)] = 1.0  # link error rate: degraded
    ici_ocs_min_links: PositiveInt = 4  # this many links down in one dimension: OCS, watch
    # GPU fabric ports (node_exporter infiniband/netdev; pipeline/detect/fabric*.py)
    fabric_flap_window_s: PositiveInt = 300  # toggles within this are one flapping episode ...
    fabric_flap_persist: Annotated[int, Meta(ge=2)] = 2  # ... persistent from this many scrapes
    fabric_errors_per_s: Annotated[float, Meta(gt=0)] = 0.05  # symbol/rcv/recovery errors ...
    fabric_error_samples: PositiveInt = 3  # ... in this many scrapes in a row: gray loss
    fabric_group_window_s: PositiveInt = 60  # port troubles this close are one element's ...
    fabric_switch_min_nodes: Annotated[int, Meta(ge=2)] = 2  # ... a switch's from this many nodes
    # the fleet stage waits for a node still heard but this far behind the cluster's newest
    # time (a backlogged partition) before judging across nodes; past it (a partition stuck,
    # a host clock far slow) the node's signals are judged as they come (stages/cluster.py)
    fleet_wait_max_s: PositiveInt = 900
    # a node against its job's other nodes (pipeline/detect/job_peers.py): clocks only go down
    # when something is wrong, so one peer is enough to tell which of two is the slow one
    job_peers_min: PositiveInt = 1
    # SM activity, NVLink and PCIe bytes fall on the nodes that wait for a slow one too: judged
    # against the job's median node, from this many peers, this far below it (watched)
    job_activity_peers_min: Annotated[int, Meta(ge=2)] = 2
    job_activity_drop_frac: Fraction = 0.25
    # step compute time (where the job publishes it) this far above the job's other nodes'
    # median: watched; cordoned after slow_escalate_s while its SM clock is also this far
    # below theirs (job_peers.py: why both)
    job_step_rise_frac: Annotated[float, Meta(gt=0)] = 0.04
    job_step_clock_frac: Fraction = 0.025
    # single-series detector (fleetpulse backtest on timestamp,value series)
    # the one sensitivity: robust sds at which an episode opens (lower: more found, more false
    # alarms); pipeline/detect/series.py says what is scored
    series_sensitivity: Annotated[float, Meta(gt=0)] = 4.5
    series_min_scale_rel: Fraction = 0.01  # scale floor relative to the level
    # per-check persistence overrides, by check name (only checks the episode engine counts)
    # (the detect layer checks them against its catalog: detect/catalog.validate_tunings,
    # called by the CLI as it loads the settings)
    checks: dict[str, CheckTuning] = {}

    def tuned(self, check: str) -> DetectSettings:
        """These settings as `check` sees them: its own `settings` overrides applied (the
        same object when it has none). Detectors read a check's thresholds through this."""
        if not self.checks:
            return self
        tuning = self.checks.get(check)
        if tuning is None or not tuning.settings:
            return self
        own = _TUNED.get((id(self), check))
        if own is None or own[0] is not self:
            if len(_TUNED) > 256:
                _TUNED.clear()
            own = _TUNED[(id(self), check)] = (self, _with(self, tuning.settings))
        return own[1]


# Settings are frozen and few: a check's own copy is made once per settings object.
_TUNED: dict[tuple[int, str], tuple[DetectSettings, DetectSettings]] = {}


def _with(settings: DetectSettings, overrides: dict[str, float | int | bool]) -> DetectSettings:
    fields = msgspec.structs.asdict(settings) | dict(overrides) | {"checks": {}}
    return msgspec.convert(fields, DetectSettings)


class HealthSettings(Section, frozen=True):
    """Node / slice health state machine (pipeline/decide/health.py); event-time seconds."""

    persist_s: PositiveInt = 120  # an actionable condition must hold this long before degraded
    probation_s: PositiveInt = 600  # healthy this long after a repair before it counts as done
    reproposal_s: PositiveInt = 300  # re-send a proposal the policy has not acted on
    dry_run_reproposal_s: PositiveInt = 3600  # ... and one answered by a dry-run action
    flap_window_s: PositiveInt = 1800  # conditions closing more than flap_max times in this
    flap_max: PositiveInt = 3  # ... window make a target "flapping":
    flap_persist_factor: PositiveInt = 4  # it needs persist_s x this before degraded
    flap_hold_s: PositiveInt = 900  # and stays suspect until quiet this long
    drain_timeout_s: PositiveInt = 3600  # no "drained" report by then: the drain failed
    # Opt-in: repair a node whose drain failed (blocked by a PodDisruptionBudget, skipped, or
    # no "drained" by drain_timeout_s) with its pods still running, as draino/NVSentinel's
    # DeleteAfterTimeout do. Off: such a node stays cordoned for a person.
    repair_after_failed_drain: bool = False
    # our own action may come back this long (event time) after its proposal and still be put
    # where it would have come live (a worked-off backlog); the signals since are kept for it
    late_action_s: PositiveInt = 3 * 3600
    # a node event this far ahead of the target's clock (heartbeats move it every minute, live)
    # waits for the clock: a backlog's sparse events.node runs ahead of its findings
    event_ahead_s: PositiveInt = 300
    repair_window_s: PositiveInt = 7 * 86_400  # repairs counted for escalation and the cap
    max_repairs: PositiveInt = 4  # repairs in the window before the target is left to a human
    node_ladder: tuple[str, ...] = ("reset_gpu", "reboot", "replace")
    slice_ladder: tuple[str, ...] = ("repair_slice", "replace")

    def __post_init__(self) -> None:
        repairs = {"reset_gpu", "reboot", "repair", "replace", "repair_slice"}
        ladders = (("node_ladder", self.node_ladder), ("slice_ladder", self.slice_ladder))
        for name, ladder in ladders:
            if not ladder or not set(ladder) <= repairs:
                raise ValueError(f"{name}: expected repair kinds from {sorted(repairs)}")


class PolicySettings(Section, frozen=True):
    """Remediation policy per pool (pipeline/decide/policy.py); event-time seconds."""

    dry_run: bool = False  # every action is published with dry_run=true
    dry_run_checks: tuple[str, ...] = ()  # disruptive actions justified only by these: dry run
    max_unavailable_pct: Percent = 10.0  # blast radius: unavailable targets per pool, percent
    max_unavailable: PositiveInt = 10  # ... and absolute cap; the smaller one wins
    budget_floor: Annotated[int, Meta(ge=0)] = 1  # always allow this many (small pools)
    fatal_max_unavailable_pct: Percent = 50.0  # fatal faults may exceed the budget up to this
    burst_cordons: PositiveInt = 3  # this many cordons within burst_window_s ...
    burst_window_s: PositiveInt = 600
    slow_start_interval_s: PositiveInt = 300  # ... then at most one per interval
    calm_s: PositiveInt = 1800  # ... until this long after the last slow-start cordon
    max_actions_per_hour: PositiveInt = 30  # cordons and repairs per pool (fatal ones exempt)
    action_ttl_s: PositiveInt = 900  # expires_at (for the actuators)
    # an action of ours is open (one per target) until the health machine reports it, or this
    # long of the pool's time: working off a backlog, reports come up to hours late
    report_ttl_s: PositiveInt = 3 * 3600
    pending_ttl_s: PositiveInt = 1200  # a withheld proposal not re-sent for this long is dropped
    dedupe_window_s: PositiveInt = 86_400  # proposal ids remembered this long
    maintenance_lead_s: PositiveInt = 1800  # cordon and drain this long before a window
    maintenance_release_s: PositiveInt = 900  # release this long after a window without DONE
    # Scheduled maintenance passes the same guard as faults, with an allowance of its own: at
    # most this share of a pool, a zone and the fleet out for maintenance at once (never below
    # maintenance_floor), beside the failure budget and caps. Notices for more than
    # common_cause_share of a scope within common_cause_window_s are a maintenance storm: one
    # common cause, canaries only, until a person releases it or each announced window starts.
    maintenance_max_unavailable_pct: Percent = 10.0
    maintenance_floor: PositiveInt = 1
    capacity_hold_s: PositiveInt = 3600  # a quota / stock-out signal holds this long
    quota_near_frac: Fraction = 0.95  # quota usage at or above this is "near the limit"
    # Caps above the pool (pipeline/decide/guard.py): targets out of service per zone and
    # fleet-wide, fatal faults included; the smaller of percent and absolute wins, never below
    # cap_floor (a small fleet may still lose a few broken nodes at once).
    zone_max_unavailable_pct: Percent = 20.0
    zone_max_unavailable: PositiveInt = 50
    fleet_max_unavailable_pct: Percent = 15.0
    fleet_max_unavailable: PositiveInt = 100
    cap_floor: PositiveInt = 3
    # Common cause: more than this share of a pool, zone or the fleet raising the same check
    # within common_cause_window_s (and at least common_cause_min_targets targets) is one
    # cause, not many faults: removals for that check stop beyond common_cause_canaries.
    common_cause_share: Fraction = 0.2
    common_cause_min_targets: Annotated[int, Meta(ge=2)] = 3
    common_cause_window_s: PositiveInt = 600
    common_cause_canaries: Annotated[int, Meta(ge=0)] = 1
    # Silence is no evidence of a node fault while its peers are silent too: a removal citing
    # silence only waits this long after it was first proposed, so an outage's peers are seen
    # going silent before its first node is judged, and a silence cause lets no canary through
    # (only a node with evidence of its own, another check, is removed during a cause).
    silence_grace_s: Annotated[int, Meta(ge=0)] = 120
    # Alert links: annotation runbook_url = runbook_base/<check>; generatorURL =
    # generator_base/<cluster>/<node, slice or pool> (pipeline/decide/alerts.py)
    runbook_base: str = "https://fleetpulse.io/runbooks"
    generator_base: str = "https://fleetpulse.io/fleet"


class CapacitySettings(Section, frozen=True):
    """`fleetpulse ingest capacity`: the cloud's capacity signals (pipeline/sources/capacity.py).

    Feeds: `quota` (Cloud Monitoring quota usage/limit/exceeded on consumer_quota), `tpu`
    (TPU API nodes' upcoming maintenance and queued resources), `compute` (Compute Engine
    instances' upcoming maintenance), `metadata` (this host's metadata server:
    maintenance-event and preempted), `reservations` (Compute Engine and Cloud TPU
    reservations: devices reserved and in use). Empty endpoints mean the real APIs
    (Application Default Credentials); a stand-in is `host:port` (gRPC, plaintext) or
    `http://host:port` (REST).
    """

    project: str = "fleetpulse-sim"
    zones: tuple[str, ...] = ()  # TPU locations to list; regional quotas fan out to these
    feeds: tuple[Literal["quota", "tpu", "compute", "metadata", "reservations"], ...] = (
        "quota",
        "tpu",
        "compute",
        "reservations",
    )
    inventory: bool = True  # also publish TPU slices and GPU instances to fleet.inventory
    # a poll: each feed once; the metadata feed's long poll takes up most of it, so a notice
    # is seen within seconds, and SIGTERM waits at most metadata_wait_s for the poll to end
    poll_interval_s: Annotated[float, Meta(gt=0)] = 30.0
    monitoring_endpoint: str = ""  # "" = the real API; "host:port" = a plaintext stand-in
    tpu_endpoint: str = ""  # "" = the real API; "host:port" = a plaintext stand-in
    compute_endpoint: str = ""  # "" = the real API; "http://host:port" = a stand-in
    # "" = GCE_METADATA_HOST from the environment, else metadata.google.internal
    metadata_url: str = ""
    # long-poll timeout of maintenance-event (not with --once); under the poll interval:
    # a notice ends the wait at once
    metadata_wait_s: Annotated[float, Meta(ge=0)] = 25.0
    quota_lag_s: Annotated[float, Meta(ge=0)] = 180.0  # Cloud Monitoring is ~3 min behind
    quota_lookback_s: Annotated[float, Meta(gt=0)] = 86_400.0  # allocation usage is sparse
    page_size: PositiveInt = 500
    timeout_s: Annotated[float, Meta(gt=0)] = 30.0  # per API call
    # -- the capacity view (pipeline/capacity, fleet.capacity; issue 37) --
    snapshot_interval_s: PositiveInt = 300  # every key re-published this often, and on change
    silent_after_s: PositiveInt = 600  # a member unheard this long is out of service: silent
    idle_util_pct: Percent = 5.0  # an allocated device under this is allocated but idle
    quota_window_s: PositiveInt = 6 * 3600  # the quota trend is fitted over this much history
    forecast_min_points: Annotated[int, Meta(ge=3)] = 6  # fewer points: no forecast
    # FleetPulseCapacityCrunch, per accelerator type and region: healthy free devices under
    # crunch_free_below, or quota out within crunch_quota_within_s (at a forecast confidence
    # of at least crunch_confidence), or crunch_stockouts stock-outs in the last hour.
    # crunch_free_below 0 (the default) turns the free rule off: a fleet kept full is healthy,
    # and unmet demand shows as quota and stock-outs; set it to the spare you keep (hot spares).
    crunch_free_below: Annotated[int, Meta(ge=0)] = 0
    crunch_quota_within_s: PositiveInt = 6 * 3600
    crunch_confidence: Fraction = 0.5
    crunch_stockouts: PositiveInt = 3
    # a target out of service longer than this raises an alert: the common goal of repairing
    # an unhealthy GPU node or TPU slice within the hour
    out_of_service_alert_s: PositiveInt = 3600
    # which catalog column prices on-demand devices (spot devices take the spot column)
    price_basis: Literal["on-demand", "committed-1y", "committed-3y"] = "on-demand"
    # the fleet's own prices, USD per device-hour by accelerator type (e.g.
    # {"nvidia-h100-80gb" = 6.5}): ahead of the catalog, and said so in every cost figure
    negotiated_prices: dict[str, Annotated[float, Meta(gt=0)]] = {}
    advice_counts: tuple[PositiveInt, ...] = (8,)  # fleet.capacity.advice: per type, these counts


class InventorySettings(Section, frozen=True):
    """Membership from fleet.inventory (`fleetpulse inventory load`, watchers), not telemetry.

    With `enforce` (the default), once any inventory record has arrived budgets count inventory
    members, no target the inventory does not know is ever removed, and a record naming another
    pool/zone than the inventory's is dead-lettered (on_mismatch = "dead_letter") or passed on
    with the inventory's identity ("flag"). Until an inventory arrives (or with enforce = false)
    the pool named in each record is believed: the FleetPulseNoInventory alert fires, and caps
    are sized by the largest fleet seen, which after `warmup_s` grows by at most
    `growth_pct` per hour (a burst of new names never widens them at once).
    """

    enforce: bool = True
    warmup_s: PositiveInt = 900  # guard time in which sizes follow the names seen freely
    growth_pct: Percent = 10.0  # then a scope's size grows at most this much per hour (>= 1)
    on_mismatch: Literal["dead_letter", "flag"] = "dead_letter"


class ClockSettings(Section, frozen=True):
    """Event time checked at the door (pipeline/stages/clock.py, streams/README.md).

    The reference is the partition's robust clock (the newest event time that at least
    `quorum_pct` of its keys, and never fewer than two, have reached), and in the worker also
    the wall clock: one host's clock cannot move it.
    """

    max_ahead_s: PositiveInt = 300  # further ahead of the reference: dead letter
    max_behind_s: PositiveInt = 3600  # further behind (older than the state it would touch)
    # A control record (inventory, node/capacity event, release) further ahead of the
    # telemetry's clock than this is a dead letter too: looser than max_ahead_s, since a
    # monitoring outage stops the telemetry's clock while the cloud's events keep their time.
    control_max_ahead_s: PositiveInt = 86_400
    skew_finding_s: PositiveInt = 60  # a host this far off gets a watch-only clock_skew finding
    min_keys: Annotated[int, Meta(ge=1)] = 3  # keys reporting before the reference is trusted
    quorum_pct: Annotated[float, Meta(gt=0.0, le=50.0)] = 10.0  # keys that must agree on "now"


class WorkerSettings(Section, frozen=True):
    """`fleetpulse worker`: the faust app in streams/ (agents, tables, acks, failover)."""

    group_id: str = ""  # consumer group and faust app id; "" = "<topic_prefix>-worker"
    store: str = "memory://"  # table store; memory replays the compacted changelog at start
    datadir: str = ".cache/worker"  # faust's data directory (one folder per app id)
    standby_replicas: Annotated[int, Meta(ge=0)] = 0  # warm table copies: rocksdb only
    ack_batch: PositiveInt = 500  # records whose outputs are awaited together before acking
    # ... or this often, whichever comes first. Outputs are sent at once whatever this is; it
    # sets how often changed states are written (a cluster's fleet state is ~400 kB): at 50 ms
    # the 10k-GPU load kept the worker too busy to meet the latency goal (bench/latency.py)
    ack_interval_ms: PositiveInt = 250
    # records an agent takes from faust at once (Stream.noack_take, waiting at most
    # ack_interval_ms for a batch to fill); 0 = one event at a time (Stream.events)
    take: Annotated[int, Meta(ge=0)] = 0
    commit_interval_s: Annotated[float, Meta(gt=0)] = 1.0  # offset commits (replay window)
    session_timeout_s: Annotated[float, Meta(ge=6)] = 10.0  # a dead worker's partitions move
    heartbeat_interval_s: Annotated[float, Meta(gt=0)] = 2.0
    send_give_up_s: Annotated[float, Meta(gt=0)] = 300.0  # outputs unsendable this long: exit
    capacity_memory: PositiveInt = 64  # capacity events kept per zone for pools learnt later
    # event-time order of a partition's topics while catching up (pipeline/stages/align.py)
    align_grace_ms: Annotated[int, Meta(ge=0)] = 1000  # wait for older records this long
    align_always: bool = False  # also when live (adds up to the grace to every record)


class SimSettings(Section, frozen=True):
    """`fleetpulse simulate` and the in-process simulator (pipeline/sim): fleet, time, fault rates.

    `intensity` multiplies fault rates so a short run holds enough faults to score (noise types
    use `noise_intensity`; fleet-level episodes lasting days are not compressed); no type fires
    more often than `max_rate_per_node_h` per node (or node-sized unit of exposure).
    """

    seed: Annotated[int, Meta(ge=0)] = 7
    start_ms: Annotated[int, Meta(ge=1_000_000_000_000)] = 1_767_225_600_000  # 2026-01-01Z
    duration_s: PositiveInt = 3600
    gpu_nodes: Annotated[int, Meta(ge=0)] = 64
    tpu_slices: Annotated[int, Meta(ge=0)] = 4
    # accelerator type:topology, cycled over the slices
    tpu_slice_types: tuple[str, ...] = (
        "v5litepod-16:4x4",
        "v6e-32:4x8",
        "v5p-64:2x4x4",
        "v5p-128:4x4x4",
    )
    clusters: PositiveInt = 2
    nodes_per_rack: PositiveInt = 4
    gpu_interval_s: PositiveInt = 10
    tpu_interval_s: PositiveInt = 10
    ici_interval_s: PositiveInt = 10
    capacity_interval_s: PositiveInt = 300
    fleet_multiplier: Annotated[float, Meta(ge=0)] = 1.0  # m_fleet: scales hardware rates
    intensity: Annotated[float, Meta(ge=0)] = 1.0
    noise_intensity: Annotated[float, Meta(ge=0)] = 1.0
    max_rate_per_node_h: Annotated[float, Meta(gt=0)] = 0.05
    random_faults: bool = True  # False: only faults passed in explicitly (tests, demos)
    fault_types: tuple[str, ...] = ()  # only these ("G1", "T2/ici"); empty: every type
    # random faults (and confounders) begin only in the first this many seconds (0: anywhere
    # in the run); the rest is a quiet tail in which the pipeline finishes deciding about them
    faults_for_s: Annotated[int, Meta(ge=0)] = 0
    diurnal: bool = True
    # A capacity crunch (issue 37): in this zone ("" none) the GPU quota's other users ramp
    # up so it runs out crunch_exhaust_s into the run (no increase is granted), a wave of
    # stock-outs of its type comes from an hour before that to an hour after, and half the
    # nodes of that type outside the zone's region stay idle: the spare capacity.
    crunch_zone: str = ""
    crunch_exhaust_s: PositiveInt = 3 * 3600


class ActuatorSettings(Section, frozen=True):
    """What every actuator reads (pipeline/actuate): its name on the wire and its defences.

    actor: who it says did it on fleet.events.node; group_id: its consumer group ("" =
    fleetpulse-actuator-<cluster>). An action needs `expires_at` and a `ts` at most
    max_action_age_s old (max_action_ahead_s ahead); at most max_removals (cluster),
    max_removals_per_pool and max_removals_per_zone targets newly cordoned, drained or sent to
    repair per removal_window_s; drain_workers: targets drained at once (order kept per
    target); api_rejections: tries of an action its system refuses before it is dead-lettered.
    """

    actor: str = "fleetpulse-actuator"
    group_id: str = ""  # "" = fleetpulse-actuator-<cluster>
    max_action_age_s: Annotated[float, Meta(gt=0)] = 3600.0
    max_action_ahead_s: Annotated[float, Meta(ge=0)] = 300.0
    removal_window_s: Annotated[float, Meta(gt=0)] = 3600.0
    max_removals: Annotated[int, Meta(ge=0)] = 20
    max_removals_per_pool: Annotated[int, Meta(ge=0)] = 8
    max_removals_per_zone: Annotated[int, Meta(ge=0)] = 12
    drain_workers: Annotated[int, Meta(ge=1, le=1024)] = 32
    api_rejections: Annotated[int, Meta(ge=1, le=100)] = 3


class KubernetesSettings(ActuatorSettings, frozen=True):
    """`fleetpulse actuate kubernetes` and `fleetpulse watch kubernetes` (pipeline/kube).

    kubeconfig: "" = in-cluster when `in_cluster` (the pod's ServiceAccount), else the usual
    $KUBECONFIG / ~/.kube/config. cluster: the FleetPulse cluster name these nodes are in
    ("" = sources.cluster); the actuator acts only on actions for it. pool_label: a node label
    naming the pool, tried before the GKE and EKS ones. held_annotation: a person's "hands off"
    on a node (any value); maintenance_label: a person's maintenance mark. drain_timeout_s: how
    long a drain retries evictions a PodDisruptionBudget refuses before it is reported blocked.

    The actuator's defences and caps (ActuatorSettings) hold whatever the policy decided
    (docs/kubernetes.md); a slice's nodes must all carry tpu_label.
    """

    kubeconfig: str = ""
    context: str = ""
    in_cluster: bool = False
    cluster: FleetNameOrEmpty = ""
    pool_label: str = ""
    slice_label: str = "cloud.google.com/gke-nodepool"  # a TPU slice's nodes share this label
    held_annotation: Annotated[str, Meta(min_length=1)] = "fleetpulse.io/hold"
    maintenance_label: str = "fleetpulse.io/maintenance"
    drain_timeout_s: Annotated[float, Meta(gt=0)] = 600.0
    eviction_backoff_initial_s: Annotated[float, Meta(gt=0)] = 1.0
    eviction_backoff_max_s: Annotated[float, Meta(gt=0)] = 15.0
    request_timeout_s: Annotated[float, Meta(gt=0)] = 30.0
    watch_timeout_s: Annotated[int, Meta(ge=1, le=3600)] = 300  # server-side end of one watch
    tpu_label: Annotated[str, Meta(min_length=1)] = "cloud.google.com/gke-tpu-accelerator"


class SlurmSettings(ActuatorSettings, frozen=True):
    """`fleetpulse actuate slurm` and `fleetpulse watch slurm` (pipeline/slurm; docs/slurm.md).

    conf: the slurm.conf path the commands get as SLURM_CONF ("" = the environment's, else
    Slurm's default); bin_dir: where scontrol, sinfo and squeue are ("" = PATH);
    command_timeout_s: how long one of them may take before the try counts as failed.
    cluster: the FleetPulse cluster these nodes are in ("" = sources.cluster). A node's pool is
    its first partition, or with pool_feature_prefix (e.g. "pool-") the rest of the feature that
    starts with it; its zone the rest of a feature starting with zone_feature_prefix, else
    `zone`. reason_prefix marks FleetPulse's drains (NHC's convention): it resumes only those.
    drain_timeout_s: how long a drain waits for the node's jobs before it is reported blocked,
    polling every drain_poll_s. poll_s: the watcher's `sinfo --json` interval. The defences
    and caps are the Kubernetes actuator's (max_action_*, removal_window_s, max_removals*).
    """

    conf: str = ""
    bin_dir: str = ""
    command_timeout_s: Annotated[float, Meta(gt=0)] = 20.0
    cluster: FleetNameOrEmpty = ""
    pool_feature_prefix: str = ""
    zone_feature_prefix: str = "zone-"
    zone: FleetNameOrEmpty = ""
    reason_prefix: Annotated[str, Meta(min_length=3, max_length=40)] = "fleetpulse:"
    drain_timeout_s: Annotated[float, Meta(gt=0)] = 600.0
    drain_poll_s: Annotated[float, Meta(gt=0)] = 2.0
    poll_s: Annotated[float, Meta(gt=0)] = 10.0
    actor: str = "fleetpulse-slurm-actuator"


class Settings(Section, frozen=True):
    kafka: KafkaSettings = KafkaSettings()
    metrics: MetricsSettings = MetricsSettings()
    lake: LakeSettings = LakeSettings()
    aggregate: AggregateSettings = AggregateSettings()
    sources: SourcesSettings = SourcesSettings()
    capacity: CapacitySettings = CapacitySettings()
    alerts: AlertSettings = AlertSettings()
    detect: DetectSettings = DetectSettings()
    health: HealthSettings = HealthSettings()
    policy: PolicySettings = PolicySettings()
    inventory: InventorySettings = InventorySettings()
    clock: ClockSettings = ClockSettings()
    worker: WorkerSettings = WorkerSettings()
    sim: SimSettings = SimSettings()
    kubernetes: KubernetesSettings = KubernetesSettings()
    slurm: SlurmSettings = SlurmSettings()


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
