"""DCGM metrics from a Prometheus server → GpuSample, one per node per scrape timestamp (and,
with `sources.prometheus_fabric`, node_exporter's network ports → FabricSample: see
prometheus_fabric.py; with `sources.prometheus_step_metric`, the jobs' per-rank step compute
time joined into the readings: prometheus_step.py).

The query is an instant query of a range selector, `{__name__=~"(?i)dcgm_fi_.+"}[<window>]`,
which returns the raw samples with their own timestamps (a range *query* would resample them
at a step). Values arrive as strings (prometheus-api-client passes Prometheus's JSON through).
Series are grouped by node and timestamp, and within a node by GPU (`gpu`) and MIG instance
(`GPU_I_ID`): a MIG-partitioned GPU gives one reading per GPU instance with the instance's own
fields (profiling, framebuffer), and one reading of the whole GPU with the GPU-wide fields that
dcgm-exporter repeats on every instance (read once). `cluster`, `pool` and
`zone` come from target labels when Prometheus adds them, else from settings.

Every dcgm-exporter generation and deployment:
- identity is `UUID` (`uuid` in 1.x) and `gpu`; `pci_bus_id` (added in 2024) is kept when there.
- the node is the first of: the label named by `sources.prometheus_node_label` (default `node`,
  what a Kubernetes scrape config or ServiceMonitor relabels `__meta_kubernetes_pod_node_name`
  to), `node`, `Hostname` (released exporters; under Kubernetes it is the node only when the
  DaemonSet sets NODE_NAME, else the exporter pod's hostname), `hostname` (exporter HEAD), the
  host of `instance` (a static scrape of `<node>:9400`).
- the job is the workload's pod: `exported_pod` when Prometheus renamed the exporter's labels
  (the Prometheus Operator's default `honorLabels: false`, where `pod` is then the exporter's
  own pod), else `pod` (`pod_name` in 1.x).

Connection (sources.prometheus_http, as Alertmanager's http_config): certificates are checked
(against `tls_ca_file` or the system CAs) unless `tls_insecure_skip_verify`; a bearer token or
basic auth, from the setting or its file, remembered by pipeline.redact so no log shows it;
`prometheus_headers` are sent with every query (tenant headers of Thanos, Cortex, Mimir).
`prometheus_selector` adds label matchers to the query, so several adapters can each read one
shard of a large Prometheus.

Position: the newest timestamp read. Each poll reads `(position, now - lag]`; the lag leaves
room for a scrape that is still on its way, so a sample is read once.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from pipeline.config import HttpClientSettings, SourcesSettings, selector_matchers
from pipeline.errors import ConfigError, DecodeError
from pipeline.model import GpuReading, GpuSample
from pipeline.redact import load_secret, redact, redact_logs, remember
from pipeline.sources.base import (
    BadRecord,
    Batch,
    Parsed,
    load_checkpoint,
    save_checkpoint,
    validated,
)
from pipeline.sources.prometheus_read import PromReader
from pipeline.sources.prometheus_series import (
    Identity,
    gpu_index,
    job_of,
    matrix_series,
    node_name,
    points,
    raw_json,
    shown,
)

QUERY = '{__name__=~"(?i)dcgm_fi_.+"}'
log = logging.getLogger(__name__)


class PrometheusPosition(msgspec.Struct, frozen=True):
    last_ts_ms: int


# --- the pure parser ------------------------------------------------------------------------


def parse_series(
    results: Iterable[Mapping[str, Any]], identity: Identity, *, after_ms: int = 0
) -> Parsed:
    """Matrix results (`[{"metric": {…}, "values": [[ts, "v"], …]}]`) → GpuSamples.

    Points at or before `after_ms` are dropped; a series that is malformed becomes a BadRecord
    and the rest still count.
    """
    parsed = Parsed()
    nodes: dict[tuple[str, int], _NodeScrape] = {}
    for result in results:
        try:
            _add_series(nodes, result, identity, after_ms)
        except DecodeError as exc:
            parsed.bad.append(BadRecord(raw_json(result), exc))
    for (node, ts), scrape in sorted(nodes.items(), key=lambda item: (item[0][1], item[0][0])):
        try:
            parsed.events.append(validated(scrape.sample(node, ts)))
        except (DecodeError, ValueError, msgspec.ValidationError) as exc:
            error = exc if isinstance(exc, DecodeError) else _invalid(node, exc)
            parsed.bad.append(BadRecord(scrape.raw(node, ts), error))
    return parsed


@dataclass
class _Gpu:
    labels: Mapping[str, str]
    metrics: dict[str, float]
    rank: dict[str, int] = field(default_factory=dict)  # field -> MIG instance it came from


# Fields a MIG GPU instance has of its own (DCGM's profiling fields, and the framebuffer of the
# instance); every other DCGM field is the whole GPU's.
PER_INSTANCE = ("DCGM_FI_PROF_", "DCGM_FI_DEV_FB_")
# labels of one instance or its workload, which a GPU-wide reading does not have
_INSTANCE_LABELS = frozenset(
    {"GPU_I_ID", "GPU_I_PROFILE", "pod", "pod_name", "exported_pod", "namespace",
     "exported_namespace", "container", "exported_container"}
)  # fmt: skip


@dataclass
class _NodeScrape:
    cluster: str
    pool: str
    zone: str
    driver: str
    gpus: dict[tuple[int, int | None], _Gpu]  # by (gpu index, MIG instance or None)

    def sample(self, node: str, ts: int) -> GpuSample:
        return GpuSample(
            ts=ts,
            cluster=self.cluster,
            node=node,
            pool=self.pool,
            zone=self.zone,
            driver=self.driver,
            gpus=[_reading(key, gpu) for key, gpu in sorted(self.gpus.items(), key=_gpu_order)],
        )

    def raw(self, node: str, ts: int) -> bytes:
        gpus = {
            _device(key): {"labels": dict(g.labels), "metrics": g.metrics}
            for key, g in self.gpus.items()
        }
        return json.dumps({"node": node, "ts": ts, "gpus": gpus}, sort_keys=True).encode()


def _add_series(
    nodes: dict[tuple[str, int], _NodeScrape],
    result: Mapping[str, Any],
    identity: Identity,
    after_ms: int,
) -> None:
    labels, values = matrix_series(result)
    name = str(labels.get("__name__", "")).upper()
    if not name.startswith("DCGM_FI_"):
        raise DecodeError(field="__name__", expected="a DCGM_FI_* metric", got=repr(name))
    node = node_name(labels, identity.node_label)
    key = (gpu_index(labels), _mig_instance(labels))
    for ts_ms, value in points(values, name):
        if ts_ms <= after_ms or value is None:
            continue
        scrape = nodes.get((node, ts_ms))
        if scrape is None:
            scrape = nodes[(node, ts_ms)] = _NodeScrape(
                cluster=str(labels.get("cluster", identity.cluster)),
                pool=str(labels.get("pool", identity.pool)),
                zone=str(labels.get("zone", identity.zone)),
                driver=str(labels.get("DCGM_FI_DRIVER_VERSION", "")),
                gpus={},
            )
        _put(scrape, key, labels, name, value)


def _put(
    scrape: _NodeScrape,
    key: tuple[int, int | None],
    labels: Mapping[str, Any],
    name: str,
    value: float,
) -> None:
    """One value into its reading. dcgm-exporter repeats a GPU-wide field (temperature, power,
    clocks, ECC, XID, PCIe, NVLink) on every MIG instance of the GPU: it is one reading of the
    GPU, not one per instance, so it goes to the GPU's own reading (job-less), taken from the
    lowest instance that reports it (the same value, read once, whatever the series order)."""
    index, instance = key
    if instance is None or name.startswith(PER_INSTANCE):
        gpu = scrape.gpus.setdefault(key, _Gpu(labels=labels, metrics={}))
        gpu.metrics[name] = value
        gpu.rank[name] = -1
        return
    whole = scrape.gpus.setdefault((index, None), _Gpu(labels=_gpu_wide(labels), metrics={}))
    if instance < whole.rank.get(name, instance + 1):
        whole.metrics[name], whole.rank[name] = value, instance


def _gpu_wide(labels: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in labels.items() if k not in _INSTANCE_LABELS}


def _mig_instance(labels: Mapping[str, Any]) -> int | None:
    text = str(labels.get("GPU_I_ID", ""))
    if not text:
        return None  # a whole GPU (MIG off, or a GPU-wide series)
    if not text.isdigit():
        raise DecodeError(
            field="labels.GPU_I_ID", expected='a MIG GPU instance id like "1"', got=repr(text)
        )
    return int(text)


def _gpu_order(item: tuple[tuple[int, int | None], _Gpu]) -> tuple[int, int]:
    index, instance = item[0]
    return index, -1 if instance is None else instance


def _device(key: tuple[int, int | None]) -> str:
    index, instance = key
    return str(index) if instance is None else f"{index}/mig{instance}"


def _reading(key: tuple[int, int | None], gpu: _Gpu) -> GpuReading:
    index, instance = key
    labels = gpu.labels
    uuid = labels.get("UUID", labels.get("uuid"))
    if uuid is None:
        raise DecodeError(
            field=f"gpu {_device(key)} labels", expected="UUID (or uuid)", got=shown(labels)
        )
    pci_bus_id = labels.get("pci_bus_id")
    profile = labels.get("GPU_I_PROFILE")
    return GpuReading(
        index=index,
        uuid=str(uuid),
        pci_bus_id=str(pci_bus_id) if pci_bus_id else None,
        model=str(labels.get("modelName", labels.get("model_name", ""))),
        job=job_of(labels),
        metrics=dict(sorted(gpu.metrics.items())),
        mig_instance=instance,
        mig_profile=str(profile) if instance is not None and profile else None,
    )


def _invalid(node: str, exc: Exception) -> DecodeError:
    return DecodeError(
        field=f"node {node!r}", expected="values valid for gpu_sample/3", got=str(exc)
    )


def series_selector(selector: str = "") -> str:
    """The DCGM series selector with the configured matchers added (sources.prometheus_selector):
    '{shard="a"}' -> '{__name__=~"(?i)dcgm_fi_.+",shard="a"}'."""
    matchers = selector_matchers(selector)
    return f"{QUERY[:-1]},{matchers}}}" if matchers else QUERY


# --- the I/O side ---------------------------------------------------------------------------


def http_session(settings: SourcesSettings) -> Any:
    """A requests.Session for Prometheus: certificate checks (CA file, or skipped only when
    asked), bearer or basic auth with secrets read and remembered, extra headers."""
    import requests

    http = settings.prometheus_http
    session = requests.Session()
    session.headers.update(settings.prometheus_headers)
    token = load_secret(
        http.bearer_token, http.bearer_token_file, "sources.prometheus_http.bearer_token"
    )
    password = load_secret(
        http.basic_password, http.basic_password_file, "sources.prometheus_http.basic_password"
    )
    if token:
        session.headers["Authorization"] = f"Bearer {token}"
    elif http.basic_username or password:
        session.auth = (http.basic_username, password)
    session.verify = _verify(http, settings.prometheus_url)
    # Never follow a redirect: requests would resend our headers (tenant, auth on the same
    # host) to wherever it points; Prometheus itself does not redirect its API.
    session.max_redirects = 0
    return session


def _verify(http: HttpClientSettings, url: str) -> bool | str:
    if http.tls_insecure_skip_verify:
        log.warning(
            "prometheus: TLS certificate of %s is not checked "
            "(sources.prometheus_http.tls_insecure_skip_verify)",
            redact(url),
        )
        return False
    if http.tls_ca_file and not Path(http.tls_ca_file).is_file():
        raise ConfigError(f"sources.prometheus_http.tls_ca_file {http.tls_ca_file}: no such file")
    return http.tls_ca_file or True


def _userinfo(url: str) -> list[str]:
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    return [value for value in (parts.username, parts.password) if value]


class PrometheusSource:
    """Reads new DCGM samples from Prometheus with prometheus-api-client."""

    name = "prometheus"

    def __init__(
        self,
        settings: SourcesSettings,
        *,
        checkpoint: Path | None = None,
        clock: Callable[[], float] = time.time,
        client: Any = None,
    ) -> None:
        from prometheus_api_client import PrometheusConnect
        from urllib3.util.retry import Retry

        self._settings = settings
        self._identity = Identity(
            settings.cluster, settings.pool, settings.zone, settings.prometheus_node_label
        )
        self._clock = clock
        self._checkpoint = checkpoint or Path(settings.state_dir) / "prometheus.json"
        # retry=Retry(0): no retries inside the client. Ours (run_source, jittered) are the
        # only ones, so a failed poll is one log line, not three urllib3 warnings and ours.
        self._series = series_selector(settings.prometheus_selector)
        if client is None:
            redact_logs("urllib3.connectionpool")  # request lines may carry the URL's userinfo
            remember(*_userinfo(settings.prometheus_url))
            client = PrometheusConnect(
                url=settings.prometheus_url,
                session=http_session(settings),
                retry=Retry(total=0),
                timeout=30,
            )
        self._client = client
        self._reader = PromReader(client, settings.prometheus_url)
        saved = load_checkpoint(self._checkpoint, PrometheusPosition)
        self.position = saved.last_ts_ms if saved else None

    def poll(self) -> Batch:
        end_ms = int((self._clock() - self._settings.prometheus_lag_s) * 1000)
        oldest = end_ms - int(self._settings.prometheus_max_lookback_s * 1000)
        start_ms = max(self.position if self.position is not None else oldest, oldest)
        if end_ms <= start_ms:
            return Batch([], [], PrometheusPosition(start_ms))
        parsed = Parsed()
        for group in self._groups(start_ms, end_ms):
            parsed.extend(self._poll_nodes(group, start_ms, end_ms))
        return Batch(parsed.events, parsed.bad, PrometheusPosition(end_ms))

    def _groups(self, start_ms: int, end_ms: int) -> list[tuple[list[str], bool] | None]:
        """The nodes of each query of this poll, and whether it also reads the series without
        the node label; [None]: one query for every series (no shard, no bound)."""
        config = self._settings
        if not config.prometheus_shard and not config.prometheus_nodes_per_query:
            return [None]
        from pipeline.sources import prometheus_shard as shard

        label = config.prometheus_node_label
        names = self._reader.node_names(label, self._series, start_ms, end_ms)
        mine = shard.my_nodes(names, config.prometheus_shard)
        size = config.prometheus_nodes_per_query or max(1, len(mine))
        groups = [mine[i : i + size] for i in range(0, len(mine), size)] or [[]]
        unlabelled = shard.takes_unlabelled(config.prometheus_shard)
        if not mine and not unlabelled:
            return []  # no node of this shard has series in the window
        return [(group, unlabelled and i == 0) for i, group in enumerate(groups)]

    def _selector(self, group: tuple[list[str], bool] | None, also: Iterable[str] = ()) -> str:
        """The configured selector, with the group's nodes (and `also`) when there is one."""
        base = selector_matchers(self._settings.prometheus_selector)
        if group is None:
            return base
        from pipeline.sources.prometheus_shard import node_matchers

        names, unlabelled = group
        label = self._settings.prometheus_node_label
        (matcher,) = node_matchers(label, sorted({*names, *also}), 0, unlabelled)
        return f"{base},{matcher}" if base else matcher

    def _poll_nodes(
        self, group: tuple[list[str], bool] | None, start_ms: int, end_ms: int
    ) -> Parsed:
        """One query's nodes: their DCGM series, step times and ports. The step and port
        series of a node named only by a fallback label (Hostname, instance) carry the node
        label all the same: they are asked for by the names the DCGM series gave."""
        series = series_selector(self._selector(group))
        results = self._reader.matrix(series, start_ms, end_ms)
        parsed = parse_series(results, self._identity, after_ms=start_ms)
        del results  # a group's worth of decoded JSON: gone before the next query
        read = {e.node for e in parsed.events if isinstance(e, GpuSample)}
        selector = self._selector(group, read)
        if self._settings.prometheus_step_metric and parsed.events:
            # the jobs' own per-rank step compute time (prometheus_step.py), a little further
            # back: their scrapes are not the DCGM scrapes
            from pipeline.sources.prometheus_step import STEP_MAX_AGE_MS, joined, step_selector

            steps = self._reader.matrix(
                step_selector(self._settings.prometheus_step_metric, selector),
                start_ms - STEP_MAX_AGE_MS,
                end_ms,
            )
            parsed = joined(parsed, steps, self._identity)
        if self._settings.prometheus_fabric:
            # node_exporter's ports of the same nodes, same window (prometheus_fabric.py)
            from pipeline.sources.prometheus_fabric import fabric_selector, parse_fabric_series

            fabric = self._reader.matrix(fabric_selector(selector), start_ms, end_ms)
            parsed.extend(
                parse_fabric_series(
                    fabric,
                    self._identity,
                    after_ms=start_ms,
                    link_layers=self._settings.prometheus_fabric_link_layers,
                )
            )
        return parsed

    def commit(self, position: msgspec.Struct | None) -> None:
        if isinstance(position, PrometheusPosition):
            save_checkpoint(self._checkpoint, position)
            self.position = position.last_ts_ms

    def close(self) -> None:
        """Close the HTTP session's pooled connections to Prometheus (a stand-in client in
        tests may have none)."""
        session = getattr(self._client, "_session", None)
        if session is not None:
            session.close()
