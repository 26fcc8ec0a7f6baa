"""Event types: one msgspec Struct per topic value, mirrored by a JSON Schema in schemas/.

Every value carries `schema: "<name>/<version>"`; a field change means a new version (a new
Struct and a new schema file), never a silent edit. Timestamps are Unix epoch milliseconds,
event time. Names that arrive from the outside world (cluster, node, pool, zone, slice) are
constrained here, once, because they later become file paths, metric labels and SQL values.
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Callable
from typing import Annotated, Literal, Protocol

import msgspec
from msgspec import Meta

from pipeline.errors import InvalidNameError
from pipeline.redact import redact

# 2001-09-09 .. 2286-11-20 in ms: catches seconds-instead-of-milliseconds at the door.
TimestampMs = Annotated[int, Meta(ge=1_000_000_000_000, le=9_999_999_999_999)]
# Kubernetes node names are DNS subdomains (253); we allow dots, dashes, underscores, colons
# but never a leading dot or a slash, so a name can never climb out of a lake directory.
# The pattern is checked in each struct's __post_init__ (KnownNames: why), and stated in the
# schema.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,252}$"
Name = Annotated[
    str, Meta(min_length=1, max_length=253, extra_json_schema={"pattern": NAME_PATTERN})
]
Text = Annotated[str, Meta(max_length=4096)]
ShortText = Annotated[str, Meta(max_length=256)]
Id = Annotated[str, Meta(min_length=8, max_length=128, pattern=r"^[A-Za-z0-9._:-]+$")]
NonNegInt = Annotated[int, Meta(ge=0)]
Percent = Annotated[float, Meta(ge=0.0, le=100.0)]

TargetKind = Literal["node", "slice"]
# What an action can apply to: a node or slice, or a network element (a leaf switch, a rail,
# a TPU OCS: "switch"; one cable or optic between a NIC port and its switch: "link"), which the
# network team's actuator repairs; no node is taken out of service for it.
ActionTargetKind = Literal["node", "slice", "switch", "link"]
EntityKind = Literal[
    "gpu", "tpu_chip", "ici_link", "node", "slice", "nic", "fabric_port", "switch", "link"
]
Severity = Literal["info", "warning", "critical"]
ActionKind = Literal[
    "cordon",
    "uncordon",
    "drain",
    "reset_gpu",
    "reboot",
    "repair",
    "replace",
    "repair_slice",
    "repair_link",
    "repair_switch",
]
RecommendedAction = Literal[
    "none",
    "watch",
    "cordon",
    "drain",
    "reset_gpu",
    "reboot",
    "repair",
    "replace",
    "repair_slice",
    "repair_link",
    "repair_switch",
]
HealthStateName = Literal[
    "healthy", "suspect", "degraded", "cordoned", "draining", "repairing", "probation"
]

# Words the decisions share (pipeline/decide: health, policy, guard), said once here so that
# none of them imports another for its vocabulary.
HEARTBEAT = "heartbeat"  # a finding's check that only says the target still reports
MAINTENANCE_CHECK = "maintenance"  # reason.checks of the policy's scheduled-maintenance actions
REPAIR_KINDS: frozenset[str] = frozenset(
    {"reset_gpu", "reboot", "repair", "replace", "repair_slice"}
)
PRE_CORDON: frozenset[str] = frozenset({"healthy", "suspect", "degraded"})  # still in service

# Every field of every schema carries a description (a contract test checks it): these are the
# fields that recur, documented once.
EventTs = Annotated[
    TimestampMs,
    Meta(description="Event time: when it happened or was measured, Unix epoch ms, UTC."),
]
Cluster = Annotated[Name, Meta(description="Cluster (Kubernetes cluster) of the node or slice.")]
Pool = Annotated[Name, Meta(description="Node pool within the cluster (one accelerator type).")]
Zone = Annotated[Name, Meta(description="Cloud zone (or on-prem site) of the node or slice.")]
NodeName = Annotated[Name, Meta(description="Host (Kubernetes node) name.")]
SliceName = Annotated[Name, Meta(description="TPU slice (multi-host unit) the host is in.")]
JobName = Annotated[
    Name | None, Meta(description="Workload (job) running on the device, when known.")
]


def _check_finite(where: Callable[[], str], metrics: dict[str, float]) -> None:
    # Fast path for the hot decode loop: a sum of finite values is finite (or overflows to
    # inf, which only sends us down the slow path); NaN and inf always propagate. `where`
    # names the reading, built only for the error (an f-string per reading costs).
    if math.isfinite(sum(metrics.values())):
        return
    for name, value in metrics.items():
        if not math.isfinite(value):
            raise ValueError(f"{where()}.metrics.{name}: expected a finite number, got {value!r}")


class MetricNames:
    """The pattern every metric name of a reading must match, checked once per distinct name.

    msgspec would run the regex on every key of every reading as it decodes (36 fields x 8
    GPUs per scrape: most of the decoder's time); the names are a small fixed vocabulary, so
    the names already seen to match are remembered (at most `MAX_KNOWN`, so hostile input
    cannot grow the set without bound) and a reading whose names are all known costs one
    set operation. The JSON Schema still states the pattern (`schema`)."""

    MAX_KNOWN = 4096

    def __init__(self, pattern: str, what: str) -> None:
        self.pattern = pattern
        self.what = what
        self._regex = re.compile(pattern)
        self._known: set[str] = set()

    def schema(self) -> dict[str, object]:
        return {"propertyNames": {"pattern": self.pattern}}

    def validate(self, where: Callable[[], str], metrics: dict[str, float]) -> None:
        """Names and values of one reading; the decoder's hot path (known names, finite values)
        is one set operation and one sum."""
        if self._known.issuperset(metrics) and math.isfinite(sum(metrics.values())):
            return
        self.check(where, metrics)
        _check_finite(where, metrics)

    def check(self, where: Callable[[], str], metrics: dict[str, float]) -> None:
        if self._known.issuperset(metrics):
            return
        for name in metrics:
            if name in self._known:
                continue
            if self._regex.search(name) is None:  # search, as msgspec's `pattern` does
                raise ValueError(
                    f"{where()}.metrics: expected {self.what} matching {self.pattern!r}, "
                    f"got {name!r}"
                )
            if len(self._known) < self.MAX_KNOWN:
                self._known.add(name)


class KnownNames:
    """Name fields (cluster, pool, zone, node, slice, job; a GPU's uuid and PCI id; a NIC's
    name) checked against their pattern once per distinct name, for the reason MetricNames
    gives: msgspec would run the regex on every such field of every value (five per
    utilization row: half the lake sink's decode; two per GPU of a scrape), and a fleet's
    names are a vocabulary that repeats. At most `MAX_KNOWN` are remembered, so hostile input
    cannot grow the set without bound; past it, names are still checked.

    The error (InvalidNameError) reads `$.<field>: expected ..., got ...`; decoding, the codec
    puts the field after msgspec's path, so a bad node reads `$.node` as msgspec's own pattern
    error did, and a bad target name `$.target.name`."""

    MAX_KNOWN = 1 << 17

    def __init__(self, pattern: str, what: str) -> None:
        self.pattern = pattern
        self.what = what
        self._regex = re.compile(pattern)
        self._known: set[str] = set()

    def check(self, struct: object, *fields: str) -> None:
        known = self._known
        for field in fields:
            value = getattr(struct, field)
            if value is not None and value not in known:
                self._admit(field, value)

    def _admit(self, field: str, value: str) -> None:
        if self._regex.search(value) is None:  # search, as msgspec's `pattern` does
            shown = msgspec.json.encode(value).decode()
            raise InvalidNameError(field, f"{self.what} matching regex {self.pattern!r}", shown)
        if len(self._known) < self.MAX_KNOWN:
            self._known.add(value)


NAMES = KnownNames(NAME_PATTERN, "a name")
GPU_UUIDS = KnownNames(r"^GPU-[0-9a-fA-F-]{8,60}$", "a GPU UUID")
PCI_IDS = KnownNames(r"^[0-9a-fA-F:.]+$", "a PCI bus id")
NIC_NAMES = KnownNames(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", "an HCA or NIC name")
NETDEVS = KnownNames(r"^[A-Za-z0-9][A-Za-z0-9_.@-]*$", "a network interface name")
DCGM_NAMES = MetricNames(r"^DCGM_[A-Z0-9_]+$", "a dcgm-exporter field name")
LIBTPU_NAMES = MetricNames(r"^[a-z0-9_]+$", "a libtpu metric name")
FABRIC_NAMES = MetricNames(r"^node_(infiniband|network)_[a-z0-9_]+$", "a node_exporter metric name")


class Event(msgspec.Struct, kw_only=True, frozen=True):
    """Base of every topic value (kw_only so defaults can follow required fields)."""


# --- inputs -------------------------------------------------------------------------------


class GpuReading(Event, frozen=True, kw_only=True):
    """One GPU, or one MIG instance of a GPU, in a scrape.

    A MIG-partitioned GPU reports one reading per GPU instance, each with the GPU's index and
    uuid plus `mig_instance`/`mig_profile`; `device` tells the readings of one GPU apart."""

    index: Annotated[int, Meta(ge=0, le=63, description="GPU index on the node (nvidia-smi).")]
    uuid: Annotated[
        str,
        Meta(
            max_length=64,
            extra_json_schema={"pattern": GPU_UUIDS.pattern},
            description="GPU UUID as NVML reports it.",
        ),
    ]
    pci_bus_id: Annotated[
        Annotated[str, Meta(max_length=32, extra_json_schema={"pattern": PCI_IDS.pattern})]
        | None,
        Meta(
            description="PCI bus id of the GPU; null when the exporter does not say "
            "(dcgm-exporter before 2024 has no pci_bus_id label).",
        ),
    ] = None
    model: Annotated[ShortText, Meta(description="GPU model name, e.g. NVIDIA H100 80GB HBM3.")]
    job: JobName = None
    # dcgm-exporter metric names, raw values; counters stay raw (rates are derived in detect).
    metrics: Annotated[
        dict[str, float],  # names checked in __post_init__ (MetricNames: why)
        Meta(
            description="dcgm-exporter field name -> raw value; counters are not rates.",
            extra_json_schema=DCGM_NAMES.schema(),
        ),
    ]
    mig_instance: Annotated[
        Annotated[int, Meta(ge=0, le=63)] | None,
        Meta(description="MIG GPU instance id (GPU_I_ID); null for a whole GPU."),
    ] = None
    mig_profile: Annotated[
        ShortText | None,
        Meta(description='MIG profile of the instance (GPU_I_PROFILE, e.g. "3g.40gb").'),
    ] = None
    step_compute_s: Annotated[
        Annotated[float, Meta(ge=0, le=86_400)] | None,
        Meta(
            description="Seconds the job's rank on this GPU spent computing its latest step, "
            "waits in collectives left out, as the job publishes it (job_step_compute_seconds); "
            "null when the job publishes none.",
        ),
    ] = None

    def __post_init__(self) -> None:
        NAMES.check(self, "job")
        GPU_UUIDS.check(self, "uuid")
        PCI_IDS.check(self, "pci_bus_id")
        DCGM_NAMES.validate(self._where, self.metrics)

    def _where(self) -> str:
        return f"gpu {self.device}"

    @property
    def device(self) -> str:
        """The reading's key within its node: "0" for GPU 0, "0/mig1" for its GPU instance 1."""
        if self.mig_instance is None:
            return str(self.index)
        return f"{self.index}/mig{self.mig_instance}"


class GpuSample(Event, frozen=True, kw_only=True, tag_field="schema", tag="gpu_sample/3"):
    """One node's dcgm-exporter scrape (fleet.telemetry.gpu, key = node).

    v2: `pci_bus_id` may be null (older exporters); MIG instances are their own readings
    (`mig_instance`, `mig_profile`). v3: a reading may carry its job's per-rank step compute
    time (`step_compute_s`). A gpu_sample/2 value is still read, as a v3 without it."""

    ts: EventTs
    cluster: Cluster
    node: NodeName
    pool: Pool
    zone: Zone
    driver: Annotated[ShortText, Meta(description="NVIDIA driver version on the node.")]
    gpus: Annotated[
        list[GpuReading],
        Meta(description="One reading per GPU of the node (per GPU instance under MIG)."),
    ]

    def __post_init__(self) -> None:
        NAMES.check(self, "cluster", "node", "pool", "zone")


class GpuSampleV2(GpuSample, frozen=True, kw_only=True, tag="gpu_sample/2"):
    """A gpu_sample/2 value as it arrives from a producer not yet upgraded: the codec reads it
    and hands on the same fields as a GpuSample (`upgraded`). Not a topic value of its own."""

    def upgraded(self) -> GpuSample:
        return GpuSample(
            ts=self.ts, cluster=self.cluster, node=self.node, pool=self.pool, zone=self.zone,
            driver=self.driver, gpus=self.gpus,
        )  # fmt: skip


class TpuChipReading(Event, frozen=True, kw_only=True):
    """One TPU chip in a scrape."""

    chip_id: Annotated[int, Meta(ge=0, le=100_000, description="Chip id within the slice.")]
    coords: Annotated[
        list[NonNegInt], Meta(description="Chip coordinates in the slice topology (x, y[, z]).")
    ]
    job: JobName = None
    # duty_cycle_pct, tensorcore_util, hbm_used_bytes, hbm_total_bytes, ...
    metrics: Annotated[
        dict[str, float],  # names checked in __post_init__ (MetricNames: why)
        Meta(
            description="libtpu metric name (duty_cycle_pct, hbm_used_bytes, ...) -> value.",
            extra_json_schema=LIBTPU_NAMES.schema(),
        ),
    ]

    def __post_init__(self) -> None:
        NAMES.check(self, "job")
        LIBTPU_NAMES.validate(self._where, self.metrics)

    def _where(self) -> str:
        return f"chip {self.chip_id}"


class TpuSample(Event, frozen=True, kw_only=True, tag_field="schema", tag="tpu_sample/1"):
    """One TPU host's chip metrics (fleet.telemetry.tpu, key = slice)."""

    ts: EventTs
    cluster: Cluster
    node: NodeName
    pool: Pool
    zone: Zone
    slice: SliceName
    accelerator_type: Annotated[
        str,
        Meta(
            pattern=r"^(v[0-9a-z]+|tpu7x)-[0-9]+$",
            description="TPU accelerator type and size, e.g. v5p-128.",
        ),
    ]
    topology: Annotated[
        str, Meta(pattern=r"^[0-9]+(x[0-9]+){1,2}$", description="Slice topology, e.g. 4x4x4.")
    ]
    worker_id: Annotated[NonNegInt, Meta(description="This host's worker index in the slice.")]
    chips: Annotated[list[TpuChipReading], Meta(description="One reading per chip of the host.")]

    def __post_init__(self) -> None:
        NAMES.check(self, "cluster", "node", "pool", "zone", "slice")


class IciLink(Event, frozen=True, kw_only=True):
    """One ICI link of a chip."""

    chip_id: Annotated[NonNegInt, Meta(description="Chip at this end of the link.")]
    port: Annotated[int, Meta(ge=0, le=15, description="ICI port of the chip.")]
    peer_chip_id: Annotated[NonNegInt, Meta(description="Chip at the other end of the link.")]
    # libtpu ici_link_health scale as observed in the field: 0 = healthy; higher is worse,
    # 10 = down. The scale is undocumented upstream (reference/data-shapes.md §3.3).
    health: Annotated[
        int, Meta(ge=0, le=10, description="libtpu link health: 0 healthy, higher worse, 10 down.")
    ]
    flits_tx: Annotated[NonNegInt, Meta(description="Flits sent (counter).")]
    flits_rx: Annotated[NonNegInt, Meta(description="Flits received (counter).")]
    errors: Annotated[
        NonNegInt | None, Meta(description="Link errors (counter), when the runtime reports it.")
    ] = None


class IciSample(Event, frozen=True, kw_only=True, tag_field="schema", tag="ici_sample/1"):
    """One TPU host's ICI link counters (fleet.telemetry.ici, key = slice)."""

    ts: EventTs
    cluster: Cluster
    node: NodeName
    pool: Pool
    zone: Zone
    slice: SliceName
    links: Annotated[list[IciLink], Meta(description="One entry per ICI link of the host.")]

    def __post_init__(self) -> None:
        NAMES.check(self, "cluster", "node", "pool", "zone", "slice")


class FabricPort(Event, frozen=True, kw_only=True):
    """One network port of a GPU node as node_exporter publishes it: an InfiniBand port
    (infiniband collector, `device` = HCA, `port` = port number) with its IPoIB or RoCE netdev
    (netdev collector), or an Ethernet NIC (netdev only, `port` 1)."""

    device: Annotated[
        str,
        Meta(
            min_length=1,
            max_length=64,
            extra_json_schema={"pattern": NIC_NAMES.pattern},
            description='HCA or NIC name, e.g. "mlx5_0" (node_exporter\'s `device` label).',
        ),
    ]
    port: Annotated[
        int, Meta(ge=0, le=255, description="Port number on the HCA (IB ports count from 1).")
    ]
    netdev: Annotated[
        Annotated[str, Meta(max_length=64, extra_json_schema={"pattern": NETDEVS.pattern})]
        | None,
        Meta(description='Network interface of the port (e.g. "ib0"), when known.'),
    ] = None
    link_layer: Annotated[
        Literal["infiniband", "ethernet", "unknown"],
        Meta(
            description="InfiniBand, Ethernet (RoCE, iWARP or plain), or unknown: no source "
            "said which (node_exporter's infiniband collector does not export it)."
        ),
    ] = "infiniband"
    metrics: Annotated[
        dict[str, float],  # names checked in __post_init__ (MetricNames: why)
        Meta(
            description="node_exporter metric name -> raw value, e.g. node_infiniband_state_id "
            "(4 = ACTIVE), node_infiniband_physical_state_id (5 = LinkUp), "
            "node_infiniband_link_downed_total, node_network_up, "
            "node_network_carrier_changes_total; counters are not rates.",
            extra_json_schema=FABRIC_NAMES.schema(),
        ),
    ]
    saturated: Annotated[
        list[Annotated[str, Meta(max_length=128)]],
        Meta(
            description="Counters of `metrics` stuck at their hardware maximum (IB port "
            "counters saturate: link_downed at 255, port_xmit_discards at 65535, ...): their "
            "delta across this sample is unknown, neither a reset nor a burst."
        ),
    ] = []

    def __post_init__(self) -> None:
        NIC_NAMES.check(self, "device")
        NETDEVS.check(self, "netdev")
        FABRIC_NAMES.validate(self._where, self.metrics)

    def _where(self) -> str:
        return f"port {self.key}"

    @property
    def key(self) -> str:
        """The port's name within its node: "mlx5_0:1"."""
        return f"{self.device}:{self.port}"


class FabricSample(Event, frozen=True, kw_only=True, tag_field="schema", tag="fabric_sample/2"):
    """One GPU node's network ports as node_exporter reports them (fleet.telemetry.fabric,
    key = node): InfiniBand port state and counters, netdev carrier and error counters."""

    ts: EventTs
    cluster: Cluster
    node: NodeName
    pool: Pool
    zone: Zone
    ports: Annotated[
        list[FabricPort],
        Meta(description="One entry per network port of the node (a missing NIC is absent)."),
    ]

    def __post_init__(self) -> None:
        NAMES.check(self, "cluster", "node", "pool", "zone")


class JobLevels(Event, frozen=True, kw_only=True):
    """One job's share of a node in one scrape: medians over the node's busy GPUs of that job."""

    clock: Annotated[
        float | None, Meta(description="Median SM clock, MHz (null: fewer than two busy GPUs).")
    ] = None
    levels: Annotated[
        dict[str, float],
        Meta(description="Activity check (job.straggler.*) -> median over the busy GPUs."),
    ] = {}


class PeerSample(Event, frozen=True, kw_only=True, tag_field="schema", tag="peer_sample/1"):
    """What the job-peer comparison needs of one GPU scrape (the worker's internal fleet-input
    topic, key = cluster): per job, the node's median clock and activity levels. The telemetry
    stage computes it from the gpu_sample, so the fleet stage does not read whole scrapes."""

    ts: EventTs
    cluster: Cluster
    node: NodeName
    pool: Pool
    zone: Zone
    jobs: Annotated[
        dict[str, JobLevels], Meta(description="Job -> the node's levels on it (may be empty).")
    ]

    def __post_init__(self) -> None:
        NAMES.check(self, "cluster", "node", "pool", "zone")


class XidEvent(Event, frozen=True, kw_only=True, tag_field="schema", tag="xid_event/2"):
    """One NVRM Xid kernel-log line, or `count` repeats of one GPU's Xid coalesced by the
    source (fleet.events.xid, key = node): `ts` is the first line's time, `last_ts` the last's."""

    ts: EventTs
    cluster: Cluster
    node: NodeName
    pool: Pool
    zone: Zone
    # normalised BDF without function: "0000:53:00" (kernel form), see codec.normalize_pci
    pci_bus_id: Annotated[
        str,
        Meta(
            pattern=r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}$",
            description="PCI id of the GPU in kernel form without function, e.g. 0000:53:00.",
        ),
    ]
    gpu_index: Annotated[
        Annotated[int, Meta(ge=0, le=63)] | None,
        Meta(description="GPU index on the node, when it could be resolved."),
    ] = None
    uuid: Annotated[ShortText | None, Meta(description="GPU UUID, when known.")] = None
    xid: Annotated[int, Meta(ge=0, le=100_000, description="NVIDIA Xid error number.")]
    pid: Annotated[NonNegInt | None, Meta(description="Process id named in the line.")] = None
    process: Annotated[
        ShortText | None, Meta(description="Process name named in the line.")
    ] = None
    job: JobName = None
    message: Annotated[Text, Meta(description="The NVRM Xid line as logged.")]
    source: Annotated[
        Literal["kernel_log", "dcgm", "simulator"], Meta(description="Where the line was read.")
    ]
    count: Annotated[
        int,
        Meta(
            ge=1,
            description="Lines this record stands for: repeats of the same GPU, Xid and "
            "process within sources.xid_coalesce_s are one record (1: one line).",
        ),
    ] = 1
    last_ts: Annotated[
        EventTs | None,
        Meta(description="Time of the last line counted (null: one line, at ts)."),
    ] = None

    def __post_init__(self) -> None:
        NAMES.check(self, "cluster", "node", "pool", "zone", "job")

    @property
    def end_ts(self) -> int:
        """The time of the last line counted (never before `ts`: a schema cannot say so)."""
        return self.ts if self.last_ts is None else max(self.ts, self.last_ts)


class XidEventV1(XidEvent, frozen=True, kw_only=True, tag="xid_event/1"):
    """An xid_event/1 value from a source not yet upgraded (one line, no count): the codec
    reads it as an XidEvent (`upgraded`). Not a topic value of its own."""

    def upgraded(self) -> XidEvent:
        return XidEvent(**msgspec.structs.asdict(self))


NodeEventKind = Literal[
    "cordoned",
    "uncordoned",
    "drained",
    "deleted",
    "repaired",
    "created",
    "held",
    "blocked",
    "skipped",
    "repair_requested",
    "ready",
    "not_ready",
    "refused",
]
NODE_EVENT_KINDS_DOC = (
    "What happened to the target. cordoned, uncordoned, drained, deleted, repaired, created: "
    "the change was made. held: a person holds the target (cordoned it, or annotated it as "
    "held, or put it in maintenance); an actuator did not act on it. blocked: a drain was "
    "refused (a PodDisruptionBudget) until the drain timeout; the target stays cordoned. "
    "skipped: an action was not carried out (stale, not supported, target gone; `reason` says "
    "why). repair_requested: a repair was handed to a repair controller (a label on the node); "
    "`repaired` or `created` follows when it is done. ready, not_ready: the node's Ready "
    "condition changed. refused: an actuator refused the action as not credible (no "
    "`expires_at`, a `ts` too old, a key or labels that disagree with the target, a removal cap, a "
    "repair of a node not drained); `reason` says which."
)


class NodeEvent(Event, frozen=True, kw_only=True, tag_field="schema", tag="node_event/2"):
    """Someone else changed a node or slice (fleet.events.node): the health machine respects it.

    `action_id` is set when an actuator reports carrying out one of our own actions; without it
    the change is a human or cloud override. v2 adds the kinds an actuator reports when it did
    not do what was asked (held, blocked, skipped), repair_requested, and a watcher's
    ready / not_ready.
    """

    ts: EventTs
    cluster: Cluster
    target_kind: Annotated[TargetKind, Meta(description="Whether `target` is a node or a slice.")]
    target: Annotated[Name, Meta(description="The node or slice that changed.")]
    pool: Pool
    zone: Zone
    kind: Annotated[NodeEventKind, Meta(description=NODE_EVENT_KINDS_DOC)]
    actor: Annotated[
        ShortText, Meta(description="Who did it: an actuator's name, a person, the cloud.")
    ]
    action_id: Annotated[
        Id | None,
        Meta(
            description="The fleet.actions action_id this carries out (an actuator's echo); "
            "absent for a human or cloud change."
        ),
    ] = None
    reason: Annotated[Text, Meta(description="Free text: why, or how an action went.")] = ""

    def __post_init__(self) -> None:
        NAMES.check(self, "cluster", "target", "pool", "zone")


class Inventory(Event, frozen=True, kw_only=True, tag_field="schema", tag="inventory/1"):
    """One node or slice as the fleet's owner lists it (fleet.inventory, compacted, key =
    cluster/name; a tombstone when it leaves). The only source of pool, zone and cluster
    membership: budgets count these members, and telemetry that disagrees is not believed."""

    ts: EventTs
    cluster: Cluster
    kind: Annotated[TargetKind, Meta(description="Whether this member is a node or a slice.")]
    name: Annotated[Name, Meta(description="Node or slice name.")]
    pool: Pool
    zone: Zone
    accelerator: Annotated[ShortText, Meta(description="Accelerator model or TPU type.")]
    capacity: Annotated[
        int, Meta(ge=0, le=100_000, description="GPUs of a node, or chips of a slice.")
    ]
    leaf_switch: Annotated[
        Name | None, Meta(description="Network leaf switch, for common-cause grouping.")
    ] = None
    rail: Annotated[Name | None, Meta(description="Network rail, for common-cause grouping.")] = (
        None
    )
    labels: Annotated[
        dict[ShortText, ShortText], Meta(description="Free-form labels from the owner.")
    ] = {}
    source: Annotated[ShortText, Meta(description="Where the inventory came from.")] = "file"

    def __post_init__(self) -> None:
        NAMES.check(self, "cluster", "name", "pool", "zone", "leaf_switch", "rail")


class PolicyRelease(
    Event, frozen=True, kw_only=True, tag_field="schema", tag="policy_release/1"
):
    """A person releases a common-cause pause (fleet.events.policy, key = scope): removals for
    `check` in the scope go ahead again under the usual budgets, until the cause clears and a
    new one is seen. `fleetpulse policy release` writes it."""

    ts: EventTs
    check: Annotated[ShortText, Meta(description="The check whose pause is released.")]
    scope: Annotated[
        Literal["pool", "zone", "fleet"], Meta(description="Breadth of the released pause.")
    ]
    name: Annotated[
        ShortText, Meta(description='The scope\'s name: cluster/pool, the zone, or "fleet".')
    ]
    actor: Annotated[ShortText, Meta(description="Who released it.")]
    reason: Annotated[Text, Meta(description="Why it was released.")] = ""


class QuotaInfo(Event, frozen=True, kw_only=True):
    """A quota's figures."""

    metric: Annotated[ShortText, Meta(description="Provider's quota metric name.")]
    limit: Annotated[float, Meta(description="Quota limit.")]
    usage: Annotated[float, Meta(description="Quota in use.")]
    unit: Annotated[ShortText, Meta(description="Unit of limit and usage.")] = "count"


class MaintenanceWindow(Event, frozen=True, kw_only=True):
    """A scheduled maintenance window."""

    start: Annotated[TimestampMs, Meta(description="Window start, Unix epoch ms.")]
    end: Annotated[TimestampMs, Meta(description="Window end, Unix epoch ms.")]
    notice_s: Annotated[
        NonNegInt, Meta(description="Seconds of notice the provider gave.")
    ] = 0


class CapacityEvent(Event, frozen=True, kw_only=True, tag_field="schema", tag="capacity_event/1"):
    """Quota, stock-out, reservation, queued-resource, maintenance or preemption signal
    (fleet.events.capacity, key = zone). Fields follow reference/data-shapes.md §6.5."""

    event_id: Annotated[Id, Meta(description="Deterministic id of the event (dedupe key).")]
    ts: EventTs
    provider: Annotated[
        Literal["gcp", "aws", "azure", "onprem"], Meta(description="Cloud or on-prem.")
    ]
    source: Annotated[ShortText, Meta(description="The API or feed it came from.")]
    kind: Annotated[
        Literal[
        "QUOTA_USAGE",
        "QUOTA_EXCEEDED",
        "QUOTA_CHANGED",
        "STOCKOUT",
        "QUEUED_RESOURCE_STATE",
        "PREEMPTION",
        "MAINTENANCE_SCHEDULED",
        "MAINTENANCE_STARTED",
        "MAINTENANCE_DONE",
        "HOST_ERROR",
        "RESERVATION_CHANGED",
        ],
        Meta(description="What kind of capacity signal this is."),
    ]
    severity: Annotated[Severity, Meta(description="How much it matters.")]
    region: Annotated[Name, Meta(description="Cloud region.")]
    zone: Zone
    cluster: Annotated[Name | None, Meta(description="Cluster, when it concerns one.")] = None
    pool: Annotated[Name | None, Meta(description="Node pool, when it concerns one.")] = None
    target_kind: Annotated[
        TargetKind | None, Meta(description="Kind of `target`, when there is one.")
    ] = None
    target: Annotated[
        Name | None, Meta(description="The node or slice it concerns, if any.")
    ] = None
    accelerator_type: Annotated[
        ShortText | None, Meta(description="Accelerator type concerned, if any.")
    ] = None
    quota: Annotated[
        QuotaInfo | None, Meta(description="Quota figures for QUOTA_* kinds.")
    ] = None
    window: Annotated[
        MaintenanceWindow | None, Meta(description="Window for MAINTENANCE_* kinds.")
    ] = None
    state: Annotated[
        ShortText | None, Meta(description="New state (queued resource, reservation).")
    ] = None
    previous_state: Annotated[
        ShortText | None, Meta(description="State before this change.")
    ] = None
    error_code: Annotated[ShortText | None, Meta(description="Provider error code.")] = None
    message: Annotated[Text, Meta(description="Provider's message, free text.")] = ""


# --- derived ------------------------------------------------------------------------------

    def __post_init__(self) -> None:
        NAMES.check(self, "region", "zone", "cluster", "pool", "target")


class Target(Event, frozen=True, kw_only=True):
    """What an action applies to: a node, a whole TPU slice (repaired as one unit), or a network
    element (switch, link) that the network team repairs."""

    cluster: Cluster
    kind: Annotated[
        ActionTargetKind,
        Meta(
            description="node: one host; slice: a whole TPU slice, as one unit; switch: a "
            "network leaf switch, rail or OCS; link: one cable/optic between a NIC port and its "
            "switch (named <node>:<port>)."
        ),
    ]
    name: Annotated[Name, Meta(description="Node, slice, switch or link name.")]
    pool: Pool
    zone: Zone

    def __post_init__(self) -> None:
        NAMES.check(self, "cluster", "name", "pool", "zone")


def target_key(target: Target) -> str:
    """A target's key in the decisions' state: cluster/kind/name (node names repeat across
    clusters, and a node and a slice may share a name)."""
    return f"{target.cluster}/{target.kind}/{target.name}"


def host_kind(target: Target) -> TargetKind:
    """A node or slice target's kind as the input events name it (NodeEvent, CapacityEvent)."""
    if target.kind not in ("node", "slice"):
        raise ValueError(f"target kind: expected node or slice, got {target.kind!r}")
    return "slice" if target.kind == "slice" else "node"


class Entity(Event, frozen=True, kw_only=True):
    """What a finding is about: a device on a node/slice, a link, or the node/slice itself."""

    kind: Annotated[EntityKind, Meta(description="What sort of thing the finding is about.")]
    target: Annotated[Target, Meta(description="The node or slice the entity belongs to.")]
    device: Annotated[
        ShortText | None,
        Meta(description='GPU index, TPU chip id, or "chip:port" of an ICI link.'),
    ] = None


class Evidence(Event, frozen=True, kw_only=True):
    """The numbers behind a finding."""

    metric: Annotated[ShortText, Meta(description="Metric the verdict rests on.")]
    value: Annotated[float | None, Meta(description="Observed value.")]
    baseline: Annotated[float | None, Meta(description="Expected value (the device's baseline).")]
    score: Annotated[float | None, Meta(description="Anomaly score (robust z, CUSUM, ...).")]
    window_s: Annotated[NonNegInt, Meta(description="Window the value covers, seconds.")]


class Finding(Event, frozen=True, kw_only=True, tag_field="schema", tag="finding/2"):
    """A verdict on an entity, HealthEvent-style (fleet.findings, key = node/slice).

    `healthy=True` findings clear a check; a `check="heartbeat"` finding says the target
    reported and nothing is wrong, which gives the health machine its event-time clock.
    v2: the target may be a network element (switch, link) and the entity a NIC, fabric port,
    switch or link; `repair_link` / `repair_switch` recommendations.
    """

    finding_id: Annotated[Id, Meta(description="Deterministic id (dedupe key).")]
    ts: EventTs
    entity: Annotated[Entity, Meta(description="What the verdict is about.")]
    check: Annotated[ShortText, Meta(description="Detector check name, e.g. xid.79.")]
    severity: Annotated[Severity, Meta(description="How bad it is.")]
    healthy: Annotated[bool, Meta(description="true clears the check; false raises it.")]
    fatal: Annotated[bool, Meta(description="The device cannot recover without repair.")] = False
    recommended_action: Annotated[
        RecommendedAction, Meta(description="What the detector suggests doing.")
    ]
    evidence: Annotated[Evidence | None, Meta(description="The numbers behind it.")] = None
    message: Annotated[Text, Meta(description="Human-readable explanation.")] = ""


class Reason(Event, frozen=True, kw_only=True):
    """Why a proposal or action was made."""

    checks: Annotated[list[ShortText], Meta(description="Checks that led to it.")]
    finding_ids: Annotated[list[Id], Meta(description="Findings that led to it (bounded).")]
    summary: Annotated[Text, Meta(description="Human-readable summary.")]


class Proposal(Event, frozen=True, kw_only=True, tag_field="schema", tag="proposal/3"):
    """What the health machine wants done to a target (fleet.proposals, key = pool).

    v2 adds `device` (the GPU(s) a reset_gpu is for), carried on to the action. v3: the target
    kind may be switch or link (see Target)."""

    proposal_id: Annotated[Id, Meta(description="Deterministic id (dedupe key).")]
    ts: EventTs
    kind: Annotated[ActionKind, Meta(description="The action wanted (see action/3).")]
    target: Annotated[Target, Meta(description="The node or slice.")]
    reason: Annotated[Reason, Meta(description="Why.")]
    fatal: Annotated[bool, Meta(description="A fatal condition is among the reasons.")]
    episode: Annotated[Id, Meta(description="Trouble episode the proposal belongs to.")]
    state: Annotated[HealthStateName, Meta(description="Target's health state when proposed.")]
    device: Annotated[
        ShortText | None, Meta(description="For reset_gpu: GPU index(es), comma-separated.")
    ] = None


ACTION_KINDS_DOC = (
    "What to do to the target. cordon: mark unschedulable, running pods stay. uncordon: make "
    "schedulable again (FleetPulse only releases its own cordons). drain: evict pods "
    "(respecting PodDisruptionBudgets); the node stays cordoned. reset_gpu: reset the GPU(s) "
    "named in `device` (nvidia-smi -r -i <device>) on a drained node. reboot: reboot the host. "
    "repair: the provider's repair of the host (e.g. GKE repair, report host faulty). "
    "replace: delete the node so its pool brings up a new one. repair_slice: repair or "
    "recreate the whole TPU slice as one unit. repair_link: (target kind link) replace the "
    "cable or optic of one NIC port, for the network team; the node stays in service. "
    "repair_switch: (target kind switch) repair the leaf switch, rail or OCS named; no node is "
    "cordoned for it."
)


class Action(Event, frozen=True, kw_only=True, tag_field="schema", tag="action/3"):
    """The public contract for actuators (fleet.actions, key = cluster/target).

    An actuator carries out each action at most once (dedupe by `action_id`), not after
    `expires_at`, only pretends when `dry_run`, and echoes the outcome on fleet.events.node
    with the same `action_id` (docs/actuators.md). v2 adds `device`, the GPU(s) a reset_gpu
    is for. v3: network elements (target kind switch or link; repair_switch, repair_link),
    decided by fabric localisation, not by a node's health machine."""

    action_id: Annotated[
        Id,
        Meta(
            description="Deterministic id: the same decision always has the same id, so a "
            "redelivered action is recognised. Dedupe on it; echo it on fleet.events.node."
        ),
    ]
    ts: Annotated[TimestampMs, Meta(description="When it was decided (event time), epoch ms.")]
    kind: Annotated[ActionKind, Meta(description=ACTION_KINDS_DOC)]
    target: Annotated[Target, Meta(description="The node or slice to act on.")]
    reason: Annotated[Reason, Meta(description="Why: checks, findings, a summary for people.")]
    dry_run: Annotated[
        bool,
        Meta(
            description="true: do not touch the target and echo nothing on "
            "fleet.events.node; log what would be done. Shadow mode for new checks."
        ),
    ]
    proposal_id: Annotated[Id, Meta(description="The health machine's proposal it carries out.")]
    expires_at: Annotated[
        TimestampMs | None,
        Meta(
            description="Epoch ms after which the action must not be started (the decision is "
            "stale; a fresh one follows if it still holds). Absent: no deadline."
        ),
    ] = None
    device: Annotated[
        ShortText | None,
        Meta(
            description="For reset_gpu: the GPU index(es) on the node to reset, "
            "comma-separated as nvidia-smi -i takes them. Absent for other kinds."
        ),
    ] = None


class NodeState(Event, frozen=True, kw_only=True, tag_field="schema", tag="node_state/2"):
    """Current health state of a node or slice (fleet.node-state, compacted, key = target).

    v2: the Target type allows network elements (only nodes and slices have a health state)."""

    ts: EventTs
    target: Annotated[Target, Meta(description="The node or slice.")]
    state: Annotated[HealthStateName, Meta(description="Current health state.")]
    since: Annotated[TimestampMs, Meta(description="When it entered this state, Unix epoch ms.")]
    episode: Annotated[
        Id | None, Meta(description="Open trouble episode (cordon to release), if any.")
    ] = None
    cordoned_by_us: Annotated[
        bool, Meta(description="FleetPulse cordoned it (not a person).")
    ] = False
    human_hold: Annotated[
        bool, Meta(description="A person cordoned it: FleetPulse will not act on it.")
    ] = False
    repairs: Annotated[NonNegInt, Meta(description="Repairs done in this episode.")] = 0
    last_action: Annotated[
        ShortText | None, Meta(description="Kind of the last action taken.")
    ] = None
    open_checks: Annotated[
        list[ShortText], Meta(description="Checks still raised on it.")
    ] = []


WITHHELD_REASON_DOC = (
    "The rule that holds the proposal back (pipeline/decide/verdicts.py Hold): budget, "
    "fatal_ceiling, capacity, slow_start, rate_limit, busy, awaiting_cordon, correlating, "
    "zone_cap, fleet_cap, common_cause, not_in_inventory, inventory_mismatch, and for scheduled "
    "maintenance maintenance_budget, maintenance_zone_cap, maintenance_fleet_cap, "
    "maintenance_storm; or 'dropped: <why>' when the proposal is given up (human_hold, "
    "replayed, maintenance, not_our_cordon, episode_over, cleared, expired, superseded, "
    "reported, window_over, out_of_service)."
)


class WithheldRecord(Event, frozen=True, kw_only=True, tag_field="schema", tag="withheld/1"):
    """Why an action was not taken (fleet.withheld, key = cluster/target): one record when a
    proposal is first held back, one each time the rule holding it changes, and one when it
    is dropped. Nothing here acts; it answers "why was this node not cordoned"."""

    ts: Annotated[
        TimestampMs, Meta(description="The pool's clock when the rule applied, Unix epoch ms.")
    ]
    withheld_id: Annotated[
        Id, Meta(description="Deterministic id of (proposal, reason): the dedupe key.")
    ]
    proposal_id: Annotated[Id, Meta(description="The health machine's proposal held back.")]
    kind: Annotated[ActionKind, Meta(description="The action proposed (see action/3).")]
    target: Annotated[Target, Meta(description="The node or slice it was for.")]
    reason: Annotated[ShortText, Meta(description=WITHHELD_REASON_DOC)]
    detail: Annotated[
        Text, Meta(description="The rule's numbers in words, e.g. 'pool a3: 2 of 2 out'.")
    ] = ""
    checks: Annotated[list[ShortText], Meta(description="Checks behind the proposal.")] = []
    fatal: Annotated[bool, Meta(description="A fatal condition is among the reasons.")] = False


class Alert(Event, frozen=True, kw_only=True, tag_field="schema", tag="alert/1"):
    """Alertmanager-shaped alert (fleet.alerts, key = fingerprint); times are RFC 3339 as
    Alertmanager's API wants them, with `ts` in ms like every other topic."""

    ts: EventTs
    fingerprint: Annotated[
        str,
        Meta(
            pattern=r"^[0-9a-f]{16}$",
            description="Alertmanager's fingerprint of the labels (the record key).",
        ),
    ]
    status: Annotated[
        Literal["firing", "resolved"], Meta(description="resolved carries endsAt.")
    ]
    labels: Annotated[
        dict[ShortText, ShortText],
        Meta(
            description="Identity of the alert, for routing: alertname, severity, service, "
            "cluster, pool, zone, node or slice (target alerts), check."
        ),
    ]
    annotations: Annotated[
        dict[ShortText, Text],
        Meta(description="summary, description, runbook_url, action_id, finding_ids."),
    ]
    startsAt: Annotated[  # noqa: N815 - Alertmanager's field name
        ShortText, Meta(description="RFC 3339 UTC start.")
    ]
    endsAt: Annotated[  # noqa: N815
        ShortText | None, Meta(description="RFC 3339 UTC end; only on resolved alerts.")
    ] = None
    generatorURL: Annotated[  # noqa: N815
        ShortText, Meta(description="Where to look: the target's or pool's FleetPulse page.")
    ] = ""


class Utilization(Event, frozen=True, kw_only=True, tag_field="schema", tag="utilization/2"):
    """One device over one event-time window (fleet.utilization, key = node/slice).

    v2: `step_compute_s`, the job's per-rank step compute time on the device over the window
    (from gpu_sample/3). A utilization/1 value is still read, as a v2 without it."""

    window_start: Annotated[TimestampMs, Meta(description="Window start, Unix epoch ms.")]
    window_s: Annotated[int, Meta(ge=1, le=86_400, description="Window length, seconds.")]
    cluster: Cluster
    pool: Pool
    zone: Zone
    node: NodeName
    slice: Annotated[Name | None, Meta(description="TPU slice, for TPU chips.")] = None
    device: Annotated[ShortText, Meta(description="GPU index or TPU chip id.")]
    accelerator: Annotated[ShortText, Meta(description="Accelerator model or TPU type.")]
    job: JobName = None
    allocated: Annotated[bool, Meta(description="A job held the device in the window.")]
    util_mean: Annotated[Percent, Meta(description="Mean utilization, percent.")]
    util_max: Annotated[Percent, Meta(description="Max utilization, percent.")]
    mem_used_frac: Annotated[
        float, Meta(ge=0.0, le=1.0, description="Mean fraction of device memory used.")
    ]
    power_w_mean: Annotated[float | None, Meta(description="Mean power draw, watts.")] = None
    samples: Annotated[int, Meta(ge=1, description="Samples in the window.")]
    step_compute_s: Annotated[
        Annotated[float, Meta(ge=0, le=86_400)] | None,
        Meta(
            description="Mean over the window of the seconds the job's rank on this device "
            "spent computing its latest step (gpu_sample/3 step_compute_s); null when the job "
            "publishes none.",
        ),
    ] = None

    def __post_init__(self) -> None:
        NAMES.check(self, "cluster", "pool", "zone", "node", "slice", "job")


class DeadLetter(Event, frozen=True, kw_only=True, tag_field="schema", tag="dead_letter/2"):
    """A record that could not be processed (fleet.dlq): coordinates, reason, raw bytes.

    v2 adds `reason`, short and machine-readable: "tombstone", "too_large", "too_deep",
    "invalid" (pipeline.errors.DecodeError), "error" (a stage raised), the door's refusals
    (ahead, behind, late, inventory_mismatch), "refused" (an alert sink said no for good)."""

    ts: Annotated[TimestampMs, Meta(description="When it was dead-lettered, Unix epoch ms.")]
    topic: Annotated[ShortText, Meta(description="Topic the record came from.")]
    partition: Annotated[int, Meta(description="Its partition.")]
    offset: Annotated[int, Meta(description="Its offset.")]
    key: Annotated[ShortText | None, Meta(description="Its key, as text.")]
    error: Annotated[Text, Meta(description="What was wrong, naming the field.")]
    raw_b64: Annotated[str, Meta(description="The record's value bytes, base64.")]
    reason: Annotated[
        str, Meta(max_length=64, description="Machine-readable reason (see the description).")
    ] = ""

    @classmethod
    def from_record(
        cls, record: RecordLike, *, reason: str, error: str, ts_ms: int | None = None
    ) -> DeadLetter:
        """The one way to build a dead letter, for every consumer (the Kafka edge, the faust
        agents, ingest, the embedded runtime): the record's coordinates and raw bytes, the
        error a person reads and the short `reason` a dashboard counts.

        `ts_ms` defaults to the record's broker timestamp (milliseconds, as kafka-python gives
        it), so a replay of the same bad record gives the same letter; one below the schema's
        range (a record without a timestamp) becomes the smallest it allows. Fields are cut to
        what the schema (and the broker) allows, so building and sending one never fails for
        its size, and the error is redacted: no credential quoted in an error reaches fleet.dlq.
        """
        error = redact(error)  # an error may quote a URL with its credentials, or a token
        key = record.key
        text = key.decode("utf-8", errors="replace") if isinstance(key, bytes) else key
        raw = record.value or b""
        if len(raw) > DEAD_LETTER_MAX_RAW:
            error = f"[raw_b64 keeps the first {DEAD_LETTER_MAX_RAW} of {len(raw)} bytes] {error}"
            raw = raw[:DEAD_LETTER_MAX_RAW]
        ts = int(getattr(record, "timestamp", 0) or 0) if ts_ms is None else ts_ms
        return cls(
            ts=max(_MIN_TS, ts),
            topic=record.topic[:_MAX_SHORT],
            partition=record.partition,
            offset=record.offset,
            key=None if text is None else text[:_MAX_SHORT],
            error=error[:_MAX_TEXT],
            raw_b64=base64.b64encode(raw).decode("ascii"),
            reason=reason[:64],
        )


class RecordLike(Protocol):
    """What a dead letter reads of a record: a kafka-python ConsumerRecord, a faust Message,
    or a RawRecord for input that never reached a topic."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | str | None: ...
    @property
    def value(self) -> bytes | None: ...


class RawRecord(msgspec.Struct, frozen=True, kw_only=True):
    """Coordinates for input that never was a Kafka record (an ingest line, a recording):
    a made-up topic such as "source.xid", partition and offset -1 when there are none."""

    topic: str
    partition: int = -1
    offset: int = -1
    key: bytes | str | None = None
    value: bytes | None = None
    timestamp: int = 0


_MIN_TS = 1_000_000_000_000  # the smallest TimestampMs
_MAX_SHORT = 256  # ShortText
_MAX_TEXT = 4096  # Text
# Raw bytes a dead letter keeps, at most: base64 makes them a third larger, and the letter must
# still fit the broker's message.max.bytes (1 MiB by default) — a too_large record would not.
DEAD_LETTER_MAX_RAW = 512 * 1024


class FabricTick(Event, frozen=True, kw_only=True, tag_field="schema", tag="fabric_tick/1"):
    """A node's fabric scrape, as far as the fleet stage needs it (the worker's internal
    fleet-input topic, key = cluster): its time and node. That time turns port troubles no
    switch explains into link verdicts; the port counters stay with the telemetry stage, so
    the topic carries some 90 bytes for a scrape instead of its ~3 kB."""

    ts: EventTs
    cluster: Cluster
    node: NodeName

    def __post_init__(self) -> None:
        NAMES.check(self, "cluster", "node")


INPUT_TYPES: tuple[type[Event], ...] = (
    GpuSample,
    TpuSample,
    IciSample,
    FabricSample,
    XidEvent,
    NodeEvent,
    CapacityEvent,
    Inventory,
    PolicyRelease,
)
TOPIC_VALUES: dict[str, type[Event]] = {
    "gpu_sample": GpuSample,
    "tpu_sample": TpuSample,
    "ici_sample": IciSample,
    "fabric_sample": FabricSample,
    "peer_sample": PeerSample,
    "fabric_tick": FabricTick,
    "xid_event": XidEvent,
    "node_event": NodeEvent,
    "capacity_event": CapacityEvent,
    "inventory": Inventory,
    "policy_release": PolicyRelease,
    "finding": Finding,
    "proposal": Proposal,
    "action": Action,
    "node_state": NodeState,
    "alert": Alert,
    "withheld": WithheldRecord,
    "utilization": Utilization,
    "dead_letter": DeadLetter,
}


# --- capacity (issue 37) --------------------------------------------------------------------

ProvisioningModel = Literal["on-demand", "spot", "reserved", "flex-start"]
Count = Annotated[int, Meta(ge=0, le=10_000_000)]


class OutOfService(Event, frozen=True, kw_only=True):
    """Devices out of service, by why (each device counted once, under its first reason)."""

    cordoned: Annotated[Count, Meta(description="Cordoned (by FleetPulse or a person).")] = 0
    draining: Annotated[Count, Meta(description="Being drained.")] = 0
    repairing: Annotated[Count, Meta(description="Repair requested, not back yet.")] = 0
    maintenance: Annotated[Count, Meta(description="In a maintenance window now.")] = 0
    silent: Annotated[
        Count, Meta(description="Unknown: no utilization heard within the silence setting.")
    ] = 0


class QuotaOutlook(Event, frozen=True, kw_only=True):
    """A quota's figures and its forecast: a trend over the quota series."""

    metric: Annotated[ShortText, Meta(description="Provider's quota metric name.")]
    limit: Annotated[float, Meta(description="Quota limit.")]
    usage: Annotated[float, Meta(description="Quota in use, latest.")]
    headroom: Annotated[float, Meta(description="limit - usage.")]
    trend_per_h: Annotated[
        float, Meta(description="Fitted growth of usage, units per hour (0 when no trend).")
    ] = 0.0
    exhausts_at: Annotated[
        TimestampMs | None,
        Meta(description="When the trend reaches the limit, Unix epoch ms; absent: no trend."),
    ] = None
    confidence: Annotated[
        float,
        Meta(ge=0.0, le=1.0, description="How far to trust exhausts_at (0: no forecast)."),
    ] = 0.0
    points: Annotated[NonNegInt, Meta(description="Quota points the trend was fitted on.")] = 0


class Reservations(Event, frozen=True, kw_only=True):
    """Reserved capacity (Compute Engine and Cloud TPU reservations), in devices."""

    count: Annotated[NonNegInt, Meta(description="Reservations.")] = 0
    reserved: Annotated[Count, Meta(description="Devices reserved.")] = 0
    in_use: Annotated[Count, Meta(description="Reserved devices in use.")] = 0
    unused: Annotated[Count, Meta(description="Reserved devices not in use (paid for).")] = 0


class PriceUsed(Event, frozen=True, kw_only=True):
    """The price a cost figure used, and where it came from."""

    usd_per_hour: Annotated[
        float, Meta(ge=0.0, description="USD per device-hour (GPU or TPU chip).")
    ]
    basis: Annotated[
        Literal["negotiated", "on-demand", "spot", "committed-1y", "committed-3y"],
        Meta(description="Which price: the fleet's negotiated one or a catalog column."),
    ]
    source: Annotated[ShortText, Meta(description="The catalog (and its date) or setting.")]
    location: Annotated[
        ShortText, Meta(description="The zone or region the price is for ('*': any).")
    ] = "*"


class CapacitySnapshot(
    Event, frozen=True, kw_only=True, tag_field="schema", tag="capacity_snapshot/1"
):
    """Capacity of one accelerator type in one zone under one provisioning model
    (fleet.capacity, compacted, key = region/zone/accelerator_type/provisioning_model).
    Devices are GPUs or TPU chips; each is counted once: healthy (free or allocated),
    suspect (in service, under watch) or out of service."""

    ts: EventTs
    region: Annotated[Name, Meta(description="Cloud region.")]
    zone: Zone
    accelerator_type: Annotated[
        Name, Meta(description="Accelerator type (catalog name, e.g. nvidia-h100-80gb, tpu-v5p).")
    ]
    provisioning_model: Annotated[
        ProvisioningModel, Meta(description="How the devices are bought.")
    ]
    devices: Annotated[Count, Meta(description="Devices in the inventory.")]
    healthy: Annotated[Count, Meta(description="Healthy devices in service.")]
    healthy_free: Annotated[Count, Meta(description="Healthy devices no job holds.")]
    allocated: Annotated[Count, Meta(description="Devices a job holds.")]
    allocated_idle: Annotated[
        Count, Meta(description="Devices a job holds at under the idle utilization.")
    ]
    suspect: Annotated[
        Count, Meta(description="In service but under suspicion (suspect, degraded).")
    ] = 0
    out_of_service: Annotated[OutOfService, Meta(description="Out of service, by reason.")]
    maintenance_announced: Annotated[
        Count, Meta(description="Devices with a maintenance window announced, not begun.")
    ] = 0
    quota: Annotated[
        QuotaOutlook | None, Meta(description="The accelerator quota of the zone, if known.")
    ] = None
    reservations: Annotated[Reservations, Meta(description="Reservations of the type here.")]
    stockouts_1h: Annotated[Count, Meta(description="Stock-outs in the last hour.")] = 0
    queued_waits_1h: Annotated[
        Count, Meta(description="Queued resources waiting for capacity in the last hour.")
    ] = 0
    preemptions_1h: Annotated[Count, Meta(description="Preemptions in the last hour.")] = 0
    useful_pct: Annotated[
        float | None,
        Meta(description="Mean utilization of the devices heard in the last hour, percent."),
    ] = None
    usd_per_useful_hour: Annotated[
        float | None,
        Meta(description="Price / useful fraction: cost of one fully used device-hour."),
    ] = None
    price: Annotated[PriceUsed | None, Meta(description="The price the cost used.")] = None

    def __post_init__(self) -> None:
        NAMES.check(self, "region", "zone", "accelerator_type")


class AdviceOption(Event, frozen=True, kw_only=True):
    """One place to run: a zone and provisioning model, with why it ranks where it does."""

    rank: Annotated[int, Meta(ge=1, description="1 = best.")]
    region: Annotated[Name, Meta(description="Cloud region.")]
    zone: Zone
    accelerator_type: Annotated[Name, Meta(description="The type (the asked one or equivalent).")]
    provisioning_model: Annotated[ProvisioningModel, Meta(description="How it is bought.")]
    healthy_free: Annotated[Count, Meta(description="Healthy free devices now.")]
    fits: Annotated[bool, Meta(description="healthy_free covers the count asked.")]
    quota_headroom: Annotated[
        float | None, Meta(description="Quota headroom, devices; absent: unknown.")
    ] = None
    quota_exhausts_at: Annotated[
        TimestampMs | None, Meta(description="Forecast quota exhaustion, Unix epoch ms.")
    ] = None
    stockouts_1h: Annotated[Count, Meta(description="Stock-outs in the last hour.")] = 0
    price: Annotated[PriceUsed | None, Meta(description="Price per device-hour there.")] = None

    def __post_init__(self) -> None:
        NAMES.check(self, "region", "zone", "accelerator_type")


class CapacityAdvice(
    Event, frozen=True, kw_only=True, tag_field="schema", tag="capacity_advice/1"
):
    """Where to place `count` devices of a type (fleet.capacity.advice, key =
    accelerator_type/count): zones ranked by whether they fit, healthy free capacity, quota
    headroom, then price. For schedulers (a MultiKueue dispatcher, a SkyPilot-style
    optimizer): the first option that fits is the advice; none fitting says wait or widen."""

    ts: EventTs
    advice_id: Annotated[Id, Meta(description="Deterministic id of (type, count, options).")]
    accelerator_type: Annotated[Name, Meta(description="The type asked for.")]
    count: Annotated[int, Meta(ge=1, le=100_000, description="Devices wanted.")]
    options: Annotated[
        list[AdviceOption],
        Meta(max_length=20, description="Places ranked, best first (at most 20)."),
    ]

    def __post_init__(self) -> None:
        NAMES.check(self, "accelerator_type")


# The capacity outputs join the table of topic values here, beside their structs.
TOPIC_VALUES.update(capacity_snapshot=CapacitySnapshot, capacity_advice=CapacityAdvice)
