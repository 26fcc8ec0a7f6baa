"""A gRPC client of the libtpu runtime-metrics stand-in, and the tpu_runtime source through it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import msgspec
import pytest

from pipeline.catalog import ici_neighbours, slice_shape
from pipeline.config import SimSettings, SourcesSettings
from pipeline.model import IciLink, IciSample, TpuChipReading, TpuSample
from pipeline.sim.endpoints.tpu_runtime import TpuRuntimeStandIn
from pipeline.sim.engine import Simulation
from pipeline.sources.libtpu_proto import runtime_protocol
from pipeline.sources.tpu_hosts import TpuHost, host_chips
from pipeline.sources.tpu_runtime import TpuRuntimeSource

HOST = TpuHost(
    cluster="gke-tpu",
    node="gke-tpu-v5p-w1",
    pool="v5p-pool",
    zone="us-east5-a",
    slice="v5p-16-slice-a",
    accelerator_type="v5p-16",
    topology="2x2x2",
    worker_id=1,
)
T0 = 1_764_424_800_000


def _chips(ts: int, duty: float) -> TpuSample:
    chips = [
        TpuChipReading(
            chip_id=chip_id,
            coords=coords,
            metrics={
                "duty_cycle_pct": duty + n,
                "tensorcore_util": duty / 2 + n,
                "hbm_used_bytes": float(2**30 * (10 + n)),
                "hbm_total_bytes": float(95 * 2**30),
                "tpu_throttle_score": float(n % 2),
            },
        )
        for n, (chip_id, coords) in enumerate(host_chips("v5p-16", "2x2x2", 1))
    ]
    return TpuSample(
        ts=ts,
        cluster=HOST.cluster,
        node=HOST.node,
        pool=HOST.pool,
        zone=HOST.zone,
        slice=HOST.slice,
        accelerator_type=HOST.accelerator_type,
        topology=HOST.topology,
        worker_id=HOST.worker_id,
        chips=chips,
    )


def _links(ts: int, flits: int) -> IciSample:
    shape = slice_shape("v5p-16", "2x2x2")
    links = [
        IciLink(
            chip_id=chip_id,
            port=port,
            peer_chip_id=peer,
            health=10 if chip_id == 5 else 0,
            flits_tx=flits + chip_id,
            flits_rx=flits + port,
            errors=chip_id * port,
        )
        for chip_id, _ in host_chips("v5p-16", "2x2x2", 1)
        for port, peer in ici_neighbours(shape, chip_id)
    ]
    return IciSample(
        ts=ts,
        cluster=HOST.cluster,
        node=HOST.node,
        pool=HOST.pool,
        zone=HOST.zone,
        slice=HOST.slice,
        links=links,
    )


@pytest.fixture
def stand_in() -> Iterator[TpuRuntimeStandIn]:
    with TpuRuntimeStandIn() as server:
        server.update_chips(_chips(T0, 40.0))
        server.update_links(_links(T0, 10**9))
        yield server


def _method(channel: grpc.Channel, name: str, request: str, response: str) -> Callable[..., Any]:
    protocol = runtime_protocol()
    return channel.unary_unary(
        protocol.method(name),
        request_serializer=protocol.messages[request].SerializeToString,
        response_deserializer=protocol.messages[response].FromString,
    )


def test_grpc_client_lists_and_reads_metrics(stand_in: TpuRuntimeStandIn) -> None:
    messages = runtime_protocol().messages
    with grpc.insecure_channel(stand_in.address) as channel:
        listing = _method(
            channel,
            "ListSupportedMetrics",
            "ListSupportedMetricsRequest",
            "ListSupportedMetricsResponse",
        )
        get = _method(channel, "GetRuntimeMetric", "MetricRequest", "MetricResponse")
        names = [
            m.metric_name
            for m in listing(messages["ListSupportedMetricsRequest"]()).supported_metric
        ]
        assert "tpu.runtime.hbm.memory.usage.bytes" in names
        assert "tpu.runtime.ici.link.health" in names
        hbm = listing(messages["ListSupportedMetricsRequest"](filter=".*hbm.*")).supported_metric
        assert {m.metric_name for m in hbm} == {
            "tpu.runtime.hbm.memory.usage.bytes",
            "tpu.runtime.hbm.memory.total.bytes",
        }

        # read as tpu-info does: sort points by the device-id int attribute
        usage = get(messages["MetricRequest"](metric_name="tpu.runtime.hbm.memory.usage.bytes"))
        points = sorted(usage.metric.metrics, key=lambda m: m.attribute.value.int_attr)
        assert [p.gauge.as_int for p in points] == [2**30 * (10 + n) for n in range(4)]
        assert {p.timestamp.seconds for p in points} == {T0 // 1000}

        with pytest.raises(grpc.RpcError) as failure:
            get(messages["MetricRequest"](metric_name="tpu.runtime.no.such.metric"))
        assert failure.value.code() == grpc.StatusCode.NOT_FOUND


def test_source_reads_chips_and_links_once(stand_in: TpuRuntimeStandIn, tmp_path: Path) -> None:
    settings = SourcesSettings(tpu_runtime_endpoint=stand_in.address, state_dir=str(tmp_path))
    source = TpuRuntimeSource(settings, host=HOST)
    try:
        first = source.poll()
        assert first.bad == []
        assert sorted(first.events, key=lambda e: type(e).__name__) == [
            _links(T0, 10**9),
            _chips(T0, 40.0),
        ]
        source.commit(first.position)
        assert source.poll().events == [], "an unchanged reading is not published twice"

        stand_in.update_chips(_chips(T0 + 1000, 55.5))
        second = source.poll()
        assert second.events == [_chips(T0 + 1000, 55.5)]
        source.commit(second.position)
    finally:
        source.close()
    reopened = TpuRuntimeSource(settings, host=HOST)
    try:
        assert reopened.position == msgspec.convert(
            {"chips_ts_ms": T0 + 1000, "links_ts_ms": T0}, type(reopened.position)
        )
        assert reopened.poll().events == []
    finally:
        reopened.close()


def test_source_reports_an_unreachable_endpoint(tmp_path: Path) -> None:
    from pipeline.errors import SourceError

    settings = SourcesSettings(tpu_runtime_endpoint="127.0.0.1:1", state_dir=str(tmp_path))
    source = TpuRuntimeSource(settings, host=HOST, timeout_s=0.5)
    try:
        with pytest.raises(SourceError, match="ListSupportedMetrics"):
            source.poll()
    finally:
        source.close()


def test_simulated_hosts_read_back_through_grpc(tmp_path: Path) -> None:
    settings = SimSettings(
        seed=5,
        duration_s=20,
        gpu_nodes=0,
        tpu_slices=1,
        clusters=1,
        tpu_slice_types=("v5p-16:2x2x2",),
        random_faults=False,
    )
    sim = Simulation(settings)
    [tpu_slice] = sim.fleet.slices
    for tick in sim.ticks():
        for tpu_host in tpu_slice.hosts:
            chips = next(e for e in tick if isinstance(e, TpuSample) and e.node == tpu_host.node)
            links = next(e for e in tick if isinstance(e, IciSample) and e.node == tpu_host.node)
            host = TpuHost(
                cluster=tpu_slice.cluster,
                node=tpu_host.node,
                pool=tpu_slice.pool,
                zone=tpu_slice.zone,
                slice=tpu_slice.name,
                accelerator_type=tpu_slice.accelerator_type,
                topology=tpu_slice.topology,
                worker_id=tpu_host.worker_id,
            )
            with TpuRuntimeStandIn() as server:
                server.update_chips(chips)
                server.update_links(links)
                config = SourcesSettings(
                    tpu_runtime_endpoint=server.address, state_dir=str(tmp_path)
                )
                source = TpuRuntimeSource(
                    config, host=host, checkpoint=tmp_path / f"{host.node}.json"
                )
                batch = source.poll()
                source.close()
            assert batch.bad == []
            # libtpu does not know jobs
            unjobbed = [msgspec.structs.replace(c, job=None) for c in chips.chips]
            assert sorted(batch.events, key=lambda e: type(e).__name__) == [
                links,
                msgspec.structs.replace(chips, chips=unjobbed),
            ]
