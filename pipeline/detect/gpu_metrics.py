"""dcgm-exporter metric names the GPU detector reads, and how it reads them."""

from __future__ import annotations

from pipeline.model import RecommendedAction

TEMP = "DCGM_FI_DEV_GPU_TEMP"
SM_CLOCK = "DCGM_FI_DEV_SM_CLOCK"
POWER = "DCGM_FI_DEV_POWER_USAGE"
UTIL = "DCGM_FI_DEV_GPU_UTIL"
GR_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"  # ratio 0..1; the util that works under MIG
SBE = "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"
DBE = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
ROWS_UNCORRECTABLE = "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"
REMAP_FAILURE = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
REMAP_PENDING = "DCGM_FI_DEV_ROW_REMAP_PENDING"
PCIE_REPLAY = "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"
PCIE_GEN = "DCGM_FI_DEV_PCIE_LINK_GEN"
PCIE_WIDTH = "DCGM_FI_DEV_PCIE_LINK_WIDTH"
THERMAL_VIOLATION = "DCGM_FI_DEV_THERMAL_VIOLATION"  # ns spent thermally throttled
THROTTLE_REASONS = "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"
RECOVERY_ACTION = "DCGM_FI_DEV_GPU_RECOVERY_ACTION"  # what the driver says the GPU needs
PCIE_TX = "DCGM_FI_PROF_PCIE_TX_BYTES"  # bytes/s
PCIE_RX = "DCGM_FI_PROF_PCIE_RX_BYTES"
NVLINK_ERRORS = (
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
)
# Fields the counter rules read, in this order: one tuple per GPU per scrape, compared with
# the last one in a single operation (most scrapes change none of them).
RAW_FIELDS = (
    DBE,
    ROWS_UNCORRECTABLE,
    PCIE_REPLAY,
    *NVLINK_ERRORS,
    SBE,
    THERMAL_VIOLATION,  # counters
    REMAP_FAILURE,
    REMAP_PENDING,
    THROTTLE_REASONS,
    PCIE_GEN,
    PCIE_WIDTH,
    RECOVERY_ACTION,  # gauges and flags
)
I_DBE, I_ROWS, I_PCIE, I_NVLINK, I_SBE, I_THERMAL = 0, 1, 2, 3, 7, 8
N_COUNTERS = 9
I_FAILURE, I_PENDING, I_REASONS, I_GEN, I_WIDTH, I_RECOVERY = 9, 10, 11, 12, 13, 14
NO_RAW: tuple[float | None, ...] = (None,) * len(RAW_FIELDS)

# Throttle reasons: HW_SLOWDOWN 0x8, HW_THERMAL 0x40 and HW_POWER_BRAKE 0x80 are hardware
# trouble on their own; SW_THERMAL 0x20 (the GPU at its thermal target) is evidence that a slow
# clock is heat, not workload; power cap 0x4 and idle 0x1 are normal operation.
HARDWARE_SLOWDOWN_MASK = 0x8 | 0x40 | 0x80
IDLE_REASON = 0x1
THERMAL_EVIDENCE_MASK = HARDWARE_SLOWDOWN_MASK | 0x20
# NVML recovery actions (XID 154 payload, field 1523) and what FleetPulse recommends for each.
RECOVERY_ACTIONS: dict[int, tuple[str, RecommendedAction]] = {
    1: ("GPU_RESET", "reset_gpu"),
    2: ("NODE_REBOOT", "reboot"),
    3: ("DRAIN_P2P", "drain"),
    4: ("DRAIN_AND_RESET", "reset_gpu"),
    5: ("RECOVER_IMEX_DOMAIN", "reboot"),
    6: ("BUS_RESET", "reset_gpu"),
    7: ("SYSTEM_REBOOT", "reboot"),
}


def recovery(code: int) -> tuple[str, RecommendedAction]:
    """Name and recommended action of an NVML recovery action (unknown codes: reboot)."""
    return RECOVERY_ACTIONS.get(code, (f"ACTION_{code}", "reboot"))


def raw_fields(metrics: dict[str, float]) -> tuple[float | None, ...]:
    """The RAW_FIELDS of one reading (None where absent). Readings are finite by contract
    (GpuReading rejects NaN/inf), so no NaN check is needed here."""
    get = metrics.get
    return (
        get(DBE),
        get(ROWS_UNCORRECTABLE),
        get(PCIE_REPLAY),
        get(NVLINK_ERRORS[0]),
        get(NVLINK_ERRORS[1]),
        get(NVLINK_ERRORS[2]),
        get(NVLINK_ERRORS[3]),
        get(SBE),
        get(THERMAL_VIOLATION),
        get(REMAP_FAILURE),
        get(REMAP_PENDING),
        get(THROTTLE_REASONS),
        get(PCIE_GEN),
        get(PCIE_WIDTH),
        get(RECOVERY_ACTION),
    )


def gauge(metrics: dict[str, float], name: str) -> float | None:
    """A finite gauge value, or None when absent (dcgm-exporter skips blank fields)."""
    value = metrics.get(name)
    if value is None or value != value or value in (float("inf"), float("-inf")):
        return None
    return value


def utilisation(metrics: dict[str, float]) -> float | None:
    """Percent busy: GPU_UTIL, else the profiling engine-active ratio (MIG reports 0 util)."""
    util = gauge(metrics, UTIL)
    if util is not None:
        return util
    active = gauge(metrics, GR_ACTIVE)
    return None if active is None else active * 100.0
