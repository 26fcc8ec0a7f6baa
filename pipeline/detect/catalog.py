"""The check catalog: every check FleetPulse's detectors run, declared once.

Detectors look their checks up here (`CHECKS[name]`); severity, action, fatality, entity kind
and persistence are read from the spec by the episode engine, never written at a call site.
`docs/checks.md` is generated from this list (`python -m pipeline.detect.check_docs`).
"""

from __future__ import annotations

from typing import NoReturn

import msgspec

from pipeline import model
from pipeline.config import DetectSettings
from pipeline.detect.spec import CheckSpec, Detector, Persistence
from pipeline.errors import ConfigError
from pipeline.model import EntityKind, RecommendedAction

# Check names: the detectors take them from here and never spell one themselves.
GPU_ECC_DBE = "gpu.ecc.dbe"
GPU_REMAP_FAILURE = "gpu.row_remap.failure"
GPU_REMAP_PENDING = "gpu.row_remap.pending"
GPU_RECOVERY_ACTION = "gpu.recovery_action"
GPU_PCIE_REPLAY = "gpu.pcie.replay_rate"
GPU_PCIE_DOWNGRADE = "gpu.pcie.link_downgrade"
GPU_PCIE_TRAFFIC = "gpu.pcie.traffic"
GPU_NVLINK = "gpu.nvlink.crc_rate"
GPU_ECC_SBE = "gpu.ecc.sbe_rate"
GPU_TEMP = "gpu.temp.peer"
GPU_CLOCK_THROTTLE = "gpu.clock.throttle"
GPU_CLOCK_SLOW = "gpu.clock.slow"
GPU_POWER = "gpu.power.peer"
GPU_MISSING = "gpu.missing"
NODE_STALE = "node.stale"
NODE_DOWN = "node.down"
XID_CODE = "xid.<code>"
XID_CODE_NONFATAL = "xid.<code>.nonfatal"
XID_RECOVERY = "xid.154"
XID_APP_REPEAT = "xid.app_repeat"
XID_APP_RECURRENCE = "xid.app_recurrence"
FABRIC_NIC_MISSING = "fabric.nic.missing"
FABRIC_PORT_DOWN = "fabric.port.down"
FABRIC_PORT_FLAP = "fabric.port.flap"
FABRIC_PORT_FLAP_PERSISTENT = "fabric.port.flap.persistent"
FABRIC_PORT_ERRORS = "fabric.port.errors"
FABRIC_SWITCH_DOWN = "fabric.switch.down"
JOB_STRAGGLER = "job.straggler"
JOB_STRAGGLER_PERSISTENT = "job.straggler.persistent"
JOB_SM_ACTIVE = "job.straggler.sm_active"
JOB_NVLINK = "job.straggler.nvlink"
JOB_PCIE = "job.straggler.pcie"
JOB_STEP = "job.straggler.step"
JOB_STEP_PERSISTENT = "job.straggler.step.persistent"
TPU_DUTY = "tpu.chip.duty_cycle"
TPU_UTIL = "tpu.chip.tensorcore_util"
TPU_CHIP_MISSING = "tpu.chip.missing"
TPU_HOST_STALE = "tpu.host.stale"
TPU_HOST_DOWN = "tpu.host.down"
TPU_SLICE_STALE = "tpu.slice.stale"
ICI_HOST_DOWN = "ici.host.down"
ICI_CHIP_DOWN = "ici.chip.down"
ICI_LINK_DOWN = "ici.link.down"
ICI_OCS = "ici.ocs.degraded"
ICI_LINK_DEGRADED = "ici.link.degraded"
# The fabric localiser's link verdict per port check (fabric_localise.py), and the device flap
# checks per device kind (device_flap.py): names made of parts, spelled here too.
FABRIC_LINK_DOWN = "fabric.link.down"
FABRIC_LINK_FLAPPING = "fabric.link.flapping"
FABRIC_LINK_ERRORS = "fabric.link.errors"
LINK_OF_PORT = {
    FABRIC_PORT_DOWN: FABRIC_LINK_DOWN,
    FABRIC_PORT_FLAP_PERSISTENT: FABRIC_LINK_FLAPPING,
    FABRIC_PORT_ERRORS: FABRIC_LINK_ERRORS,
}
GPU_FLAP, TPU_FLAP = "gpu", "tpu.chip"  # the flap checks' prefix per device kind
FLAP_PREFIXES = (GPU_FLAP, TPU_FLAP)
HEARTBEAT = model.HEARTBEAT  # a catalog check, its word shared through the model
CLOCK_SKEW = "clock_skew"

SAMPLES_GRAY = Persistence(open_after="gray_persist_samples")
SAMPLES_COUNTER = Persistence(open_after="counter_persist_samples")
FIRST_SAMPLE = Persistence(open_after=1)
TPU_TIMED = Persistence(
    open_after="tpu_persist_s", open_unit="seconds", clear_after="tpu_clear_s", clear_unit="seconds"
)
# Counted by the detector's own absence counter (it also says which peers are fresh).
MISSING = Persistence(
    open_after="missing_samples", clear_after=1,
    window="opens after `missing_samples` scrapes without it while the rest reports; clears "
    "when it reports again",
)  # fmt: skip
PEER = ("peer_min", "peer_mad_k", "warmup_samples", "half_life_samples", "anomaly_adapt")
# Settings that shape what every check of a detector sees: which GPUs are busy, the peer
# groups, how baselines learn, how events are deduplicated, grouped or windowed, and when a
# node counts as silent (the runtime's watermarks and the peers' freshness read that too).
# One value serves all of them, so these are set in [detect] only, never for one check.
SHARED_SETTINGS = frozenset({
    "busy_util_pct", "peer_min", "warmup_samples", "half_life_samples", "anomaly_adapt",
    "xid_dedupe_s", "xid_clear_s", "ici_down_health", "fabric_group_window_s",
    "fabric_flap_window_s", "device_flap_window_s", "node_stale_s", "stale_intervals",
    "node_down_s", "heartbeat_s",
})  # fmt: skip
STALE = ("node_stale_s", "stale_intervals")
FLAP_SETTINGS = ("device_flap_window_s", "device_flap_persist")
FLAP_WINDOW = Persistence(window="opens at the return; clears after `device_flap_window_s` "
                          "without a return")


def flap_checks(prefix: str) -> tuple[str, str]:
    """The first-episode and the persistent flap check of a device kind (FLAP_PREFIXES)."""
    return f"{prefix}.flap", f"{prefix}.flap.persistent"


def xid_check(code: int, nonfatal: bool = False) -> str:
    """The check of one XID code (`xid.<code>`), or of its line saying it was non-fatal."""
    return f"xid.{code}.nonfatal" if nonfatal else f"xid.{code}"


def _flap_checks(
    prefix: str, detector: Detector, entity: EntityKind, what: str, action: RecommendedAction
) -> tuple[CheckSpec, CheckSpec]:
    """A device leaving its host's scrape and coming back (device_flap.py)."""
    flap, persistent = flap_checks(prefix)
    return (
        CheckSpec(
            name=flap, detector=detector, entity=entity,
            signal=f"a known {what} back in its host's scrape", baseline="present",
            threshold="back after an absence of at most `device_flap_window_s`: the first "
            "up/down episode", settings=FLAP_SETTINGS[:1], persistence=FLAP_WINDOW,
            severity="warning", action="watch", evidence="seconds away",
        ),
        CheckSpec(
            name=persistent, detector=detector, entity=entity,
            signal=f"returns of one {what}", baseline="`device_flap_persist`",
            threshold="`device_flap_persist` returns within `device_flap_window_s`",
            settings=FLAP_SETTINGS, persistence=FLAP_WINDOW,
            severity="critical", action=action, evidence="returns, the limit",
        ),
    )


# Not a check's persistence but one of gpu.clock.throttle's conditions: a plain slowdown
# (gpu.clock.slow's signal, no hardware evidence) counts as throttling once it has lasted
# `slow_escalate_s`, and stops counting at the first scrape without it (gpu_gauges.py).
SLOW_LASTING = Persistence(open_after="slow_escalate_s", open_unit="seconds", clear_after=1)

# Not a check's persistence but one of gpu.power.peer's conditions: the jobs in which a GPU
# drew less power than its peers are forgotten once it has been busy at their level this long.
POWER_LEVEL = Persistence(open_after="clear_persist_samples", clear_after=1)
# Not a check's persistence but one of fabric.switch.down's conditions: a switch verdict whose
# troubles have been those of too few nodes for this long is cleared (fabric_localise.py).
SWITCH_SHORT = Persistence(open_after="fabric_group_window_s", open_unit="seconds",
                           clear_after=1)  # fmt: skip

XID_WINDOW = "one episode per burst (`xid_dedupe_s`); clears after `xid_clear_s` without a repeat"

GPU: tuple[CheckSpec, ...] = (
    CheckSpec(
        name=GPU_ECC_DBE, detector="gpu", entity="gpu",
        signal="new double-bit (uncorrectable) ECC errors", baseline="0",
        threshold="any new error", settings=("counter_quiet_s",),
        persistence=Persistence(window="opens at the first error; clears after `counter_quiet_s` "
                                "without a new one"),
        severity="critical", action="reset_gpu", fatal=True,
        evidence="DCGM_FI_DEV_ECC_DBE_VOL_TOTAL increase",
    ),
    CheckSpec(
        name=GPU_REMAP_FAILURE, detector="gpu", entity="gpu",
        signal="row remap failure flag", baseline="0", threshold="flag set: no spare rows left",
        settings=(), persistence=FIRST_SAMPLE,
        severity="critical", action="replace", fatal=True,
        evidence="DCGM_FI_DEV_ROW_REMAP_FAILURE",
    ),
    CheckSpec(
        name=GPU_REMAP_PENDING, detector="gpu", entity="gpu",
        signal="row remap pending flag, or a new uncorrectable remap", baseline="0",
        threshold="flag set (without the flag: a remap within `counter_quiet_s`)",
        settings=("counter_quiet_s",), persistence=FIRST_SAMPLE,
        severity="warning", action="reset_gpu",
        evidence="DCGM_FI_DEV_ROW_REMAP_PENDING, new remapped rows as score",
    ),
    CheckSpec(
        name=GPU_RECOVERY_ACTION, detector="gpu", entity="gpu",
        signal="the driver's recovery action (NVML field 1523)", baseline="0 (none)",
        threshold="any action asked for", settings=(), persistence=FIRST_SAMPLE,
        severity="critical", action="reboot", fatal=True,
        action_from="the recovery action: GPU reset -> reset_gpu, reboot -> reboot, "
        "drain -> drain",
        evidence="DCGM_FI_DEV_GPU_RECOVERY_ACTION",
    ),
    CheckSpec(
        name=GPU_PCIE_REPLAY, detector="gpu", entity="gpu",
        signal="PCIe replays summed over a window", baseline="`pcie_replays`",
        threshold="at least `pcie_replays` within `pcie_window_s`",
        settings=("pcie_replays", "pcie_window_s"),
        persistence=Persistence(window="opens when the window's sum reaches the limit; clears "
                                "when the window holds no replay"),
        severity="warning", action="cordon",
        evidence="replays in the window, the limit, their ratio as score",
    ),
    CheckSpec(
        name=GPU_PCIE_DOWNGRADE, detector="gpu", entity="gpu",
        signal="PCIe link width (and gen while busy)", baseline="the best seen on this GPU",
        threshold="below the best", settings=("busy_util_pct",), persistence=SAMPLES_COUNTER,
        severity="warning", action="cordon",
        evidence="link width, best width, link gen as score",
    ),
    CheckSpec(
        name=GPU_PCIE_TRAFFIC, detector="gpu", entity="gpu",
        signal="PCIe TX+RX bytes/s", baseline="same-job peers' median",
        threshold="at most `pcie_traffic_frac` of peers moving `pcie_traffic_min_bps`: the NIC "
        "or PCIe path", settings=("pcie_traffic_frac", "pcie_traffic_min_bps", "peer_min"),
        persistence=SAMPLES_COUNTER, severity="warning", action="cordon",
        evidence="bytes/s, peers' median, their ratio",
    ),
    CheckSpec(
        name=GPU_NVLINK, detector="gpu", entity="gpu",
        signal="scrapes with new NVLink CRC/replay/recovery errors", baseline="0",
        threshold="errors in `nvlink_error_scrapes` scrapes spread over `nvlink_span_s` within "
        "`nvlink_window_s`", settings=("nvlink_error_scrapes", "nvlink_span_s", "nvlink_window_s"),
        persistence=Persistence(window="opens when the window's scrapes qualify; clears when "
                                "the window holds none"),
        severity="warning", action="cordon",
        evidence="new errors, scrapes with errors in the window as score",
    ),
    CheckSpec(
        name=GPU_ECC_SBE, detector="gpu", entity="gpu",
        signal="single-bit ECC errors, decaying with a one-hour half-life",
        baseline="`sbe_watch_per_hour`", threshold="at least `sbe_watch_per_hour` (noise: watch, "
        "never a cordon)", settings=("sbe_watch_per_hour",),
        persistence=Persistence(window="opens at the limit; clears below half of it"),
        severity="info", action="watch", evidence="errors per hour, the limit",
    ),
    CheckSpec(
        name=GPU_TEMP, detector="gpu", entity="gpu",
        signal="temperature minus same-job peers' median", baseline="the GPU's usual offset",
        threshold="`temp_peer_delta_c` over its usual offset, `temp_alone_delta_c` over peers, or "
        "a CUSUM drift (`cusum_h`) of at least `temp_drift_min_c`",
        settings=("temp_peer_delta_c", "temp_alone_delta_c", "temp_drift_min_c", "cusum_k",
                  "cusum_h", *PEER),
        persistence=SAMPLES_GRAY, severity="warning", action="cordon",
        evidence="temperature, peers + usual offset, z-score",
    ),
    CheckSpec(
        name=GPU_CLOCK_THROTTLE, detector="gpu", entity="gpu",
        signal="SM clock while busy or, from `clock_active_util_pct`, not idle by its clock "
        "event reasons (an idle scrape between the same job's peaks is skipped); throttle "
        "reasons", baseline="busy peers, or its own same-job history",
        threshold="`clock_alone_frac` below peers (or `clock_drop_frac` below "
        "its usual gap), below its history with heat evidence (`violation_frac`), hardware "
        "slowdown reasons, or a plain slowdown lasting `slow_escalate_s`; announced again once "
        "the clock falls a further `clock_drop_frac` below the level it held",
        settings=("clock_drop_frac", "clock_alone_frac", "clock_own_frac", "slow_escalate_s",
                  "violation_frac", "busy_util_pct", "clock_active_util_pct", *PEER),
        persistence=SAMPLES_GRAY, severity="warning", action="cordon",
        evidence="SM clock, the reference clock, the relative gap",
    ),
    CheckSpec(
        name=GPU_CLOCK_SLOW, detector="gpu", entity="gpu",
        signal="SM clock while busy or, from `clock_active_util_pct`, not idle by its clock "
        "event reasons (an idle scrape between the same job's peaks is skipped)",
        baseline="its own same-job history",
        threshold="`clock_own_frac` below it with no hardware evidence (becomes "
        "gpu.clock.throttle after `slow_escalate_s`); announced again once the clock falls a "
        "further `clock_drop_frac` below the level it held",
        settings=("clock_own_frac", "clock_drop_frac", "busy_util_pct", "clock_active_util_pct",
                  "warmup_samples"),
        persistence=SAMPLES_GRAY, severity="warning", action="watch",
        evidence="SM clock, its usual clock, the relative drop",
    ),
    CheckSpec(
        name=GPU_POWER, detector="gpu", entity="gpu",
        signal="power draw while busy", baseline="same-job peers' median and its usual gap",
        threshold="`power_drop_frac` below its usual gap, with hardware-like evidence or across "
        "`straggler_min_jobs` jobs", settings=("power_drop_frac", "straggler_min_jobs", *PEER),
        persistence=SAMPLES_GRAY, severity="warning", action="cordon",
        evidence="watts, peers' median, the relative gap",
    ),
    CheckSpec(
        name=GPU_MISSING, detector="gpu", entity="gpu",
        signal="a known GPU in the node's scrape", baseline="the GPUs seen before",
        threshold="absent while the node reports", settings=("missing_samples",),
        persistence=MISSING,
        severity="critical", action="reboot", fatal=True,
        evidence="GPUs reporting, GPUs known",
    ),
    *_flap_checks(GPU_FLAP, "gpu", "gpu", "GPU", "reboot"),
    CheckSpec(
        name=NODE_STALE, detector="gpu", entity="node",
        signal="seconds since the node's last scrape", baseline="its scrape interval",
        threshold="silent `node_stale_s` (at least `stale_intervals` intervals)", settings=STALE,
        persistence=Persistence(window="opens once the silence crosses the limit (named by "
                                "when it did); clears at the next scrape"),
        severity="critical", action="reboot", when_announced=("info", "watch"),
        evidence="seconds silent, the interval",
    ),
    CheckSpec(
        name=NODE_DOWN, detector="gpu", entity="node",
        signal="seconds since the node's last scrape", baseline="its scrape interval",
        threshold="silent `node_down_s` (0: off); not for an announced absence",
        settings=("node_down_s", *STALE),
        persistence=Persistence(window="opens once the silence crosses the limit; clears at "
                                "the next scrape"),
        severity="critical", action="reboot", fatal=True,
        evidence="seconds silent, the interval",
    ),
)

XID: tuple[CheckSpec, ...] = (
    CheckSpec(
        name=XID_CODE, detector="xid", entity="gpu",
        signal="a kernel-log XID line", baseline="the XID catalog (pipeline/catalog/xid.csv)",
        threshold="a catalogued XID that asks for action", settings=("xid_dedupe_s", "xid_clear_s"),
        persistence=Persistence(window=XID_WINDOW),
        severity="warning", action="watch", action_from="the XID catalog (unknown codes: watch)",
        severity_from="the XID catalog (unknown codes: warning)", evidence="the XID code",
    ),
    CheckSpec(
        name=XID_CODE_NONFATAL, detector="xid", entity="gpu",
        signal="a fatal XID whose line says non-fatal", baseline="the XID catalog",
        threshold="the driver reports it corrected", settings=("xid_dedupe_s", "xid_clear_s"),
        persistence=Persistence(window=XID_WINDOW), severity="warning", action="watch",
        evidence="the XID code",
    ),
    CheckSpec(
        name=XID_RECOVERY, detector="xid", entity="gpu",
        signal="XID 154: the driver's new recovery action", baseline="0 (none)",
        threshold="any action asked for", settings=("xid_dedupe_s", "xid_clear_s"),
        persistence=Persistence(window="opens at the line; clears when the action goes back to "
                                "0 or after `xid_clear_s` without a repeat"),
        severity="critical", action="reboot", fatal=True,
        action_from="the recovery action in the line, as gpu.recovery_action",
        evidence="the recovery action code",
    ),
    CheckSpec(
        name=XID_APP_REPEAT, detector="xid", entity="gpu",
        signal="application XIDs (13, 31, 43, 45 ...) on one GPU", baseline="the jobs hitting it",
        threshold="`app_xid_watch_strikes` strikes by any jobs within `app_xid_window_s`, each "
        "on this GPU alone, by a job with two in three of its lone strikes here: the "
        "recurrence has begun, the GPU is not yet blamed",
        settings=("app_xid_watch_strikes", "xid_dedupe_s", "app_xid_window_s"),
        persistence=Persistence(window="opens at the repeat; clears when fewer strikes remain "
                                "in the window"),
        severity="warning", action="watch", evidence="strikes, the watch limit",
    ),
    CheckSpec(
        name=XID_APP_RECURRENCE, detector="xid", entity="gpu",
        signal="application XIDs (13, 31, 43, 45 ...) on one GPU", baseline="the jobs hitting it",
        threshold="`app_xid_min_jobs` distinct jobs, or `app_xid_min_strikes` strikes (hits "
        "more than `xid_dedupe_s` apart) by any jobs, within `app_xid_window_s`, each strike "
        "on this GPU alone, by a job with two in three of its lone strikes here",
        settings=("app_xid_min_jobs", "app_xid_min_strikes", "xid_dedupe_s", "app_xid_window_s"),
        persistence=Persistence(window="opens at the recurrence; clears when fewer jobs and "
                                "strikes remain in the window"),
        severity="warning", action="reset_gpu", evidence="strikes, the strike limit",
    ),
)

FABRIC_WINDOW = "fabric_group_window_s"
FABRIC: tuple[CheckSpec, ...] = (
    CheckSpec(
        name=FABRIC_NIC_MISSING, detector="fabric", entity="nic",
        signal="a known port in node_exporter's scrape", baseline="the ports seen before",
        threshold="absent while the node reports: the NIC fell off the bus",
        settings=("missing_samples",),
        persistence=MISSING,
        severity="critical", action="cordon", fatal=True, evidence="ports reporting, ports known",
    ),
    CheckSpec(
        name=FABRIC_PORT_DOWN, detector="fabric", entity="fabric_port",
        signal="IB port state, physical state, netdev up", baseline="ACTIVE / LinkUp / up",
        threshold="any of them down: its cable or switch (localised by the fabric stage)",
        settings=(), persistence=Persistence(clear_after=1),
        severity="critical", action="watch", evidence="IB state, ACTIVE",
    ),
    CheckSpec(
        name=FABRIC_PORT_FLAP, detector="fabric", entity="fabric_port",
        signal="link_downed / carrier changes while the port is up", baseline="0",
        threshold="any toggle: the first flapping episode", settings=("fabric_flap_window_s",),
        persistence=Persistence(window="opens at a toggle; clears after `fabric_flap_window_s` "
                                "without one"),
        severity="warning", action="watch", evidence="toggles",
    ),
    CheckSpec(
        name=FABRIC_PORT_FLAP_PERSISTENT, detector="fabric", entity="fabric_port",
        signal="scrapes with a toggle", baseline="`fabric_flap_persist`",
        threshold="toggles in `fabric_flap_persist` scrapes within `fabric_flap_window_s`",
        settings=("fabric_flap_persist", "fabric_flap_window_s"),
        persistence=Persistence(window="opens when the window holds enough toggling scrapes; "
                                "clears after `fabric_flap_window_s` without a toggle"),
        severity="warning", action="watch", evidence="toggling scrapes, the limit",
    ),
    CheckSpec(
        name=FABRIC_PORT_ERRORS, detector="fabric", entity="fabric_port",
        signal="symbol / receive / link-recovery / netdev errors per second, link up",
        baseline="`fabric_errors_per_s`", threshold="at least `fabric_errors_per_s`: silent gray "
        "loss on the cable or optic", settings=("fabric_errors_per_s", "fabric_error_samples"),
        persistence=Persistence(open_after="fabric_error_samples"),
        severity="warning", action="watch", evidence="errors per second, the limit",
    ),
    CheckSpec(
        name=FABRIC_SWITCH_DOWN, detector="fabric_localise", entity="switch",
        signal="port troubles (down, persistent flap, errors) of many nodes",
        baseline="the inventory's leaf switch and rail",
        threshold="`fabric_switch_min_nodes` nodes behind one leaf switch or rail within "
        "`fabric_group_window_s`", settings=("fabric_switch_min_nodes", FABRIC_WINDOW),
        persistence=Persistence(window="opens when the group forms; clears when every port "
                                "trouble behind it cleared, or when those left have been of "
                                "fewer than `fabric_switch_min_nodes` nodes for "
                                "`fabric_group_window_s` (they are judged again, as links)"),
        severity="critical", action="repair_switch", evidence="nodes affected",
    ),
    *(
        CheckSpec(
            name=name, detector="fabric_localise", entity="link",
            signal=f"one port's {trouble}", baseline="the other ports behind its switch",
            threshold=f"no switch explains it within `{FABRIC_WINDOW}`: its cable or optic",
            settings=(FABRIC_WINDOW,),
            persistence=Persistence(window=f"opens `{FABRIC_WINDOW}` after the port trouble; "
                                    "clears with it (a verdict per link and check)"),
            severity="warning", action="repair_link", evidence="ports affected",
        )
        for trouble, name in LINK_OF_PORT.items()
    ),
)

# Activity falls on the nodes that wait for a slow one too: the majority sets the level.
JOB_MEDIAN = (
    "the job's median node, itself counted (at least `job_activity_peers_min` peers: the nodes "
    "that wait fall too, so the majority sets the level)"
)
JOB_ACTIVITY = ("job_activity_drop_frac", "job_activity_peers_min", "busy_util_pct")

JOB_PEERS: tuple[CheckSpec, ...] = (
    CheckSpec(
        name=JOB_STRAGGLER, detector="job_peers", entity="node",
        signal="median SM clock of the node's busy GPUs on a multi-node job",
        baseline="the job's other nodes' median (at least `job_peers_min`)",
        threshold="`clock_drop_frac` below it", settings=("clock_drop_frac", "job_peers_min",
                                                           "busy_util_pct"),
        persistence=SAMPLES_GRAY, severity="warning", action="watch",
        evidence="node clock, peers' median, deficit",
    ),
    CheckSpec(
        name=JOB_STRAGGLER_PERSISTENT, detector="job_peers", entity="node",
        signal="median SM clock of the node's busy GPUs on a multi-node job",
        baseline="the job's other nodes' median", threshold="`clock_drop_frac` below it for "
        "`slow_escalate_s`: fail-slow hardware",
        settings=("clock_drop_frac", "job_peers_min", "slow_escalate_s"),
        persistence=Persistence(open_after="slow_escalate_s", open_unit="seconds"),
        severity="warning", action="cordon", evidence="node clock, peers' median, deficit",
    ),
    CheckSpec(
        name=JOB_SM_ACTIVE, detector="job_peers", entity="node",
        signal="DCGM_FI_PROF_SM_ACTIVE of the node's busy GPUs (their median) on a multi-node "
        "job",
        baseline=JOB_MEDIAN, threshold="`job_activity_drop_frac` below it",
        settings=JOB_ACTIVITY,
        persistence=SAMPLES_GRAY, severity="warning", action="watch",
        evidence="node SM activity, the job's median, deficit",
    ),
    CheckSpec(
        name=JOB_NVLINK, detector="job_peers", entity="node",
        signal="NVLink TX+RX bytes/s of the node's busy GPUs (their median) on a multi-node job",
        baseline=JOB_MEDIAN, threshold="`job_activity_drop_frac` below it",
        settings=JOB_ACTIVITY,
        persistence=SAMPLES_GRAY, severity="warning", action="watch",
        evidence="node NVLink bytes/s, the job's median, deficit",
    ),
    CheckSpec(
        name=JOB_PCIE, detector="job_peers", entity="node",
        signal="PCIe TX+RX bytes/s of the node's busy GPUs (their median) on a multi-node job",
        baseline=JOB_MEDIAN, threshold="`job_activity_drop_frac` below it",
        settings=JOB_ACTIVITY,
        persistence=SAMPLES_GRAY, severity="warning", action="watch",
        evidence="node PCIe bytes/s, the job's median, deficit",
    ),
    CheckSpec(
        name=JOB_STEP, detector="job_peers", entity="node",
        signal="median step compute time of the node's ranks (step_compute_s, where the job "
        "publishes it) on a multi-node job",
        baseline="the job's other nodes' median (at least `job_peers_min`)",
        threshold="`job_step_rise_frac` above it", settings=("job_step_rise_frac",
                                                              "job_peers_min"),
        persistence=SAMPLES_GRAY, severity="warning", action="watch",
        evidence="node step compute s, peers' median, relative rise",
    ),
    CheckSpec(
        name=JOB_STEP_PERSISTENT, detector="job_peers", entity="node",
        signal="median step compute time of the node's ranks and their SM clock",
        baseline="the job's other nodes' medians",
        threshold="`job_step_rise_frac` above it (once watched, half of it) with the clock "
        "`job_step_clock_frac` below theirs, for `slow_escalate_s`: fail-slow hardware",
        settings=("job_step_rise_frac", "job_step_clock_frac", "slow_escalate_s"),
        persistence=Persistence(open_after="slow_escalate_s", open_unit="seconds"),
        severity="warning", action="cordon",
        evidence="node step compute s, peers' median, relative rise",
    ),
)

TPU: tuple[CheckSpec, ...] = (
    CheckSpec(
        name=TPU_DUTY, detector="tpu", entity="tpu_chip",
        signal="chip duty cycle", baseline="same-job chips on the slice's other hosts",
        threshold="`tpu_duty_drop_pct` points below peers working at `tpu_busy_pct`",
        settings=("tpu_duty_drop_pct", "tpu_busy_pct", "peer_min"), persistence=TPU_TIMED,
        severity="critical", action="repair_slice", evidence="duty cycle, peers' median",
    ),
    CheckSpec(
        name=TPU_UTIL, detector="tpu", entity="tpu_chip",
        signal="chip TensorCore utilisation", baseline="same-job peers' median",
        threshold="`tpu_util_drop_frac` below it (fail-slow)",
        settings=("tpu_util_drop_frac", "tpu_busy_pct", "peer_min"), persistence=TPU_TIMED,
        severity="warning", action="watch", evidence="utilisation, peers' median",
    ),
    CheckSpec(
        name=TPU_CHIP_MISSING, detector="tpu", entity="tpu_chip",
        signal="a known chip in its host's scrape", baseline="the chips seen before",
        threshold="absent while the host reports", settings=("missing_samples",),
        persistence=MISSING,
        severity="critical", action="repair_slice", evidence="chips reporting, chips known",
    ),
    *_flap_checks(TPU_FLAP, "tpu", "tpu_chip", "chip", "repair_slice"),
    CheckSpec(
        name=TPU_HOST_STALE, detector="tpu", entity="node",
        signal="seconds since a host's last scrape", baseline="the slice's other hosts",
        threshold="silent `node_stale_s` while another host reported", settings=STALE,
        persistence=Persistence(window="opens once the silence crosses the limit; clears at "
                                "the host's next scrape"),
        severity="critical", action="repair_slice", when_announced=("info", "watch"),
        evidence="seconds silent, the interval",
    ),
    CheckSpec(
        name=TPU_HOST_DOWN, detector="tpu", entity="node",
        signal="seconds since a host's last scrape", baseline="the slice's other hosts",
        threshold="silent `node_down_s` (0: off); not for an announced absence",
        settings=("node_down_s", *STALE),
        persistence=Persistence(window="opens once the silence crosses the limit; clears at "
                                "the host's next scrape"),
        severity="critical", action="repair_slice", fatal=True,
        evidence="seconds silent, the interval",
    ),
    CheckSpec(
        name=TPU_SLICE_STALE, detector="tpu", entity="slice",
        signal="seconds since any host of the slice reported", baseline="0",
        threshold="every host silent: the slice is down or maintained as a whole", settings=STALE,
        persistence=Persistence(window="opens once the silence crosses the limit; clears at "
                                "any host's next scrape"),
        severity="warning", action="watch", evidence="seconds silent",
    ),
)

ICI_TIMED = "ici_link_persist_s"
ICI: tuple[CheckSpec, ...] = (
    CheckSpec(
        name=ICI_HOST_DOWN, detector="ici", entity="node",
        signal="ICI links into one host's chips, as its neighbours report them",
        baseline="the host's own reports", threshold="all down (at least 2) while the host "
        "reports none of them down: the machine failed", settings=("ici_down_health",),
        persistence=Persistence(open_after=ICI_TIMED, open_unit="seconds",
                                clear_after="tpu_clear_s", clear_unit="seconds"),
        severity="critical", action="repair_slice", evidence="links down",
    ),
    CheckSpec(
        name=ICI_CHIP_DOWN, detector="ici", entity="tpu_chip",
        signal="every ICI link of one chip, from either end", baseline="its links",
        threshold="all down: the chip, not the cables", settings=("ici_down_health",),
        persistence=Persistence(open_after=0, open_unit="seconds", clear_after="tpu_clear_s",
                                clear_unit="seconds"),
        severity="critical", action="repair_slice", evidence="links down",
    ),
    CheckSpec(
        name=ICI_LINK_DOWN, detector="ici", entity="ici_link",
        signal="ici_link_health at both ends", baseline="`ici_down_health`",
        threshold="at or above `ici_down_health` at both ends (for `ici_link_persist_s`, so an "
        "OCS pattern forms first), or at one end for `ici_one_sided_s`",
        settings=("ici_down_health", ICI_TIMED, "ici_one_sided_s"),
        persistence=Persistence(open_after=ICI_TIMED, open_unit="seconds",
                                clear_after="tpu_clear_s", clear_unit="seconds"),
        severity="critical", action="repair_slice", evidence="link health",
    ),
    CheckSpec(
        name=ICI_OCS, detector="ici", entity="slice",
        signal="ICI links down in one torus dimension, each leaving its 4x4x4 cube",
        baseline="`ici_ocs_min_links`",
        threshold="at least `ici_ocs_min_links` at once: an optical circuit switch",
        settings=("ici_ocs_min_links",), persistence=TPU_TIMED,
        severity="warning", action="watch", evidence="links down",
    ),
    CheckSpec(
        name=ICI_LINK_DEGRADED, detector="ici", entity="ici_link",
        signal="link health 1-9, error rate, flit rate share of the host's traffic",
        baseline="the link's usual share", threshold="health between 1 and `ici_down_health`, "
        "`ici_errors_per_s`, or `ici_flit_drop_frac` below its usual share: resiliency at work",
        settings=("ici_errors_per_s", "ici_flit_drop_frac", "peer_min", "warmup_samples"),
        persistence=TPU_TIMED, severity="warning", action="watch",
        evidence="why (health, errors, flit share), link health",
    ),
)

# Findings about the telemetry itself rather than a device: the health machine's clock, and a
# host whose event time is off (the telemetry stage's door, stages/clock.py, measures it).
TELEMETRY: tuple[CheckSpec, ...] = (
    CheckSpec(
        name=HEARTBEAT, detector="gpu, tpu", entity="node",
        signal="a scrape of the node (a slice: of any of its hosts)", baseline="-",
        threshold="never bad: the health machine's event-time clock", settings=("heartbeat_s",),
        persistence=Persistence(window="never opens: one healthy finding per target at most "
                                "once per `heartbeat_s` of event time while it reports"),
        severity="info", action="none", evidence="none; the message counts the open checks",
    ),
    CheckSpec(
        name=CLOCK_SKEW, detector="clock", entity="node",
        signal="a host's event time against the partition's clock (a slice: its hosts')",
        baseline="the partition's clock",
        threshold="off by more than `[clock] skew_finding_s`: its records are judged in a "
        "time base of their own", settings=(),
        persistence=Persistence(window="opens when the host's time goes off; clears when it "
                                "agrees again"),
        severity="warning", action="watch", evidence="seconds off (+ ahead, - behind)",
    ),
)

CATALOG: tuple[CheckSpec, ...] = (*GPU, *XID, *FABRIC, *JOB_PEERS, *TPU, *ICI, *TELEMETRY)
CHECKS: dict[str, CheckSpec] = {spec.name: spec for spec in CATALOG}


def spec_of(check: str) -> CheckSpec:
    """The spec of a check by its finding name (`xid.79` -> the `xid.<code>` spec)."""
    spec = CHECKS.get(check)
    if spec is not None:
        return spec
    if check.startswith("xid."):
        family = "xid.<code>.nonfatal" if check.endswith(".nonfatal") else "xid.<code>"
        return CHECKS[family]
    raise KeyError(f"unknown check {check!r}: expected one of {sorted(CHECKS)}")


def validate_tunings(settings: DetectSettings) -> None:
    """Refuse `[detect.checks]` entries the catalog does not allow: each names a check, tunes
    persistence only where the engine counts it, and overrides only settings the check names,
    with values they accept. Called where settings are loaded to run the detectors (the CLI),
    so a bad entry stops the program at its start; raises ConfigError naming the entry."""
    unknown = sorted(set(settings.checks) - set(CHECKS))
    if unknown:
        _refuse(f"checks: no check named {', '.join(unknown)}; docs/checks.md lists them")
    for name, tuning in settings.checks.items():
        persistence = tuning.open_after is not None or tuning.clear_after is not None
        if persistence and not CHECKS[name].engine_counted:
            counted = sorted(n for n, s in CHECKS.items() if s.engine_counted)
            _refuse(f"checks: {name} has no tunable persistence; expected one of {counted}")
        _check_overrides(settings, name, set(tuning.settings))


def _check_overrides(settings: DetectSettings, name: str, overrides: set[str]) -> None:
    own = [n for n in CHECKS[name].settings if n not in SHARED_SETTINGS]
    shared = sorted(overrides & SHARED_SETTINGS)
    if shared:
        _refuse(
            f"checks.{name}.settings: {', '.join(shared)} shared by every check of its "
            f"detector: set it in [detect]; {name} takes {', '.join(own) or 'none'}"
        )
    foreign = sorted(overrides - set(own))
    if foreign:
        _refuse(
            f"checks.{name}.settings: {', '.join(foreign)} not used by {name}; expected "
            f"one of {', '.join(own) or '(none)'}"
        )
    try:
        settings.tuned(name)
    except msgspec.ValidationError as exc:
        _refuse(f"checks.{name}.settings: {str(exc).replace('`$.', '`').replace('$.', '')}")


def _refuse(problem: str) -> NoReturn:
    # worded as the loader words a field it refuses, with the section it came from
    raise ConfigError(f"invalid configuration: {problem} - at `detect`") from None
