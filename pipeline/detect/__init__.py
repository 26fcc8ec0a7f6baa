"""Pure detectors: rolling statistics, peer comparison, XID rules, ICI and fabric localisation.

Each detector is `detect_*(state | None, record, settings) -> (state, findings)` with one
msgspec state per key (node for GPU, fabric samples and XIDs, slice for TPU and ICI samples),
mutated and returned. No I/O, no clock: time is the records' event time, and the runtime calls the
`check_stale_*` / `expire_xid` functions with the event time it has seen advance (a node that
stops reporting sends nothing, so its silence is noticed through other records).

Every check is declared once in catalog.py (its name, signal, threshold, persistence, severity,
action, evidence; docs/checks.md is generated from it; detectors take check names from there and
never spell one) and is an episode: one unhealthy finding when it opens and one `healthy=True`
finding with the same check when it clears; ids are stable_id(target, device, check, episode
start), so replays and bursts give the same id. The rules of every detector family return
judgements (per check and device: bad, good, or nothing to judge) and one emitter (emit.py)
turns them into episodes: it counts a check's persistence with the episode engine
(episodes.py) or, for a windowed check, opens and clears at the verdict, and takes severity
and action from the catalog. Each reporting target also gets a `heartbeat` finding at most
once per `heartbeat_s` of event time: the health machine's clock (a catalog check too, as is
the telemetry stage's `clock_skew`, built by skew.py).
Optionally, `note_event(state, NodeEvent | CapacityEvent)` tells a GPU/TPU state that its target
was deleted, drained by a person or is in scheduled maintenance: its silence is then reported
as `watch`, not as a failure. `note_repair(xid_state, ts)` tells the XID state its node
was repaired: application-XID strikes before it no longer count.
Duplicate and out-of-order records (ts not after the last one of the same node / host /
episode) are dropped and counted in `state.dropped`.
"""

from pipeline.detect.announce import note_event
from pipeline.detect.fabric import FabricNodeState, detect_fabric
from pipeline.detect.gpu import GpuDevice, GpuNodeState, check_stale_gpu, detect_gpu
from pipeline.detect.ici import IciSliceState, LinkEnd, detect_ici
from pipeline.detect.series import SeriesFlag, SeriesParams, SeriesState, series_step
from pipeline.detect.tpu import TpuChip, TpuHost, TpuSliceState, check_stale_tpu, detect_tpu
from pipeline.detect.xid import XidState, detect_xid, expire_xid, note_repair

__all__ = [
    "FabricNodeState",
    "GpuDevice",
    "GpuNodeState",
    "IciSliceState",
    "LinkEnd",
    "SeriesFlag",
    "SeriesParams",
    "SeriesState",
    "TpuChip",
    "TpuHost",
    "TpuSliceState",
    "XidState",
    "check_stale_gpu",
    "check_stale_tpu",
    "detect_fabric",
    "detect_gpu",
    "detect_ici",
    "detect_tpu",
    "detect_xid",
    "expire_xid",
    "note_event",
    "note_repair",
    "series_step",
]
