"""Where the time goes: pyinstrument over the hot path, on simulated telemetry.

    python -m bench.profile            # writes bench/results/profile.json and profile*.txt
    python -m bench.profile --quick
    python -m bench.profile --worker   # also profile `fleetpulse worker` on Kafka

embedded: the embedded runtime fed the throughput benchmark's fleet as encoded records
(decode, detect, aggregate, health, policy: the worker's logic without Kafka).
worker (optional, needs the broker): `fleetpulse worker` run under pyinstrument while it drains
the same records from private topics, to see what faust, aiokafka and the state tables add.

Figures, as shares of the busy time (profiled time less the event loop waiting for I/O): the
time inside each pipeline stage (inclusive; "other" is everything outside them: the framework,
the client library, I/O), and the functions with the most time of their own (exclusive).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench import broker
from bench.common import RESULTS, load_average, result_name, write_result
from bench.throughput import fleet
from pipeline.runtime.embedded import EmbeddedRuntime
from pipeline.sim.engine import Simulation

INTERVAL_S = 0.001
# Stage -> the functions whose inclusive time is that stage (first match on a call path wins).
STAGES = {
    "decode": ("decode", "decode_value"),
    "detect_gpu": ("detect_gpu",),
    "detect_tpu": ("detect_tpu",),
    "detect_ici": ("detect_ici",),
    "detect_xid": ("detect_xid",),
    "detect_fabric": ("detect_fabric",),
    # the fleet stage's detectors (peer_sample runs in the telemetry stage, for them)
    "job_peers": ("detect_job_peers", "peer_sample"),
    "fabric_localise": ("localise",),
    "staleness": ("on_time",),
    "aggregate": ("aggregate", "flush_windows"),
    "health": ("on_health",),
    "policy": ("on_policy",),
    "state_tables": ("load", "store", "encode_state", "decode_state"),
}
TOP = 15
# (path fragment, component) in order: the first that a frame's file contains names it
COMPONENTS = (
    ("/pipeline/", "pipeline: codec, detect, aggregate, health, policy"),
    ("/streams/", "streams: agents, state tables, acks"),
    ("/faust/", "faust + mode"), ("/mode/", "faust + mode"),
    ("/aiokafka/", "aiokafka"), ("/kafka/", "aiokafka"),
    ("/asyncio/", "asyncio"),
    ("/bench/", "bench harness"),
)
IDLE = frozenset({"epoll.poll", "select.select", "select", "poll"})  # waiting for I/O
# the rolling statistics every detector keeps (inclusive time, wherever they are called from):
# the README weighs vectorising them against this share
ROLLING_STATS = "pipeline/detect/stats.py"


def _frames(frame: Any) -> Iterator[Any]:
    yield frame
    for child in frame.children:
        yield from _frames(child)


def split(root: Any) -> dict[str, Any]:
    """Inclusive time per stage and exclusive time per function over a pyinstrument tree,
    as shares of the busy time (the event loop waiting in epoll is idle, not cost)."""
    total = root.time
    stage_of = {fn: stage for stage, fns in STAGES.items() for fn in fns}
    stages: Counter[str] = Counter()

    def walk(frame: Any, inside: bool) -> None:
        stage = stage_of.get(frame.function) if not inside else None
        if stage is not None:
            stages[stage] += frame.time
        for child in frame.children:
            walk(child, inside or stage is not None)

    walk(root, False)
    own: Counter[str] = Counter()
    for frame in _frames(root):
        if frame.is_synthetic:
            continue
        children = sum(c.time for c in frame.children if not c.is_synthetic)
        own[f"{frame.function} ({frame.file_path_short}:{frame.line_no})"] += frame.time - children
    idle = sum(t for name, t in own.items() if name.split(" ")[0] in IDLE)
    busy = max(total - idle, 1e-9)
    shares = {k: round(v / busy, 3) for k, v in stages.most_common()}
    shares["other"] = round(max(0.0, 1 - sum(stages.values()) / busy), 3)
    return {
        "profiled_s": round(total, 3),
        "idle_s": round(idle, 3),
        "component_share_of_busy": by_component(root),
        "stage_share_of_busy": shares,
        "rolling_stats_share_of_busy": round(inside_file(root, ROLLING_STATS) / busy, 3),
        "top_self": [{"function": name, "self_s": round(t, 3), "share_of_busy": round(t / busy, 3)}
                     for name, t in own.most_common(TOP + 2) if name.split(" ")[0] not in IDLE
                     ][:TOP],
    }


def inside_file(root: Any, fragment: str) -> float:
    """Inclusive time in frames whose file contains `fragment`, counting only the outermost
    such frame on each call path (a statistic calling another is not counted twice)."""
    def walk(frame: Any) -> float:
        if fragment in (frame.file_path or ""):
            return float(frame.time)
        return sum(walk(child) for child in frame.children)

    return walk(root)


def component(path: str) -> str | None:
    """Whose code a frame is, by file; None for built-ins (they count for their caller)."""
    if path.startswith("<"):
        return None
    for prefix, name in COMPONENTS:
        if prefix in path:
            return name
    return "other (stdlib, prometheus-client, ...)"


def by_component(root: Any) -> dict[str, float]:
    """Self time per component as shares of the busy time (I/O waits left out)."""
    own: Counter[str] = Counter()

    def walk(frame: Any, inherited: str) -> None:
        here = component(frame.file_path or "<>") or inherited
        if not frame.is_synthetic:
            children = sum(c.time for c in frame.children if not c.is_synthetic)
            name = "idle" if frame.function in IDLE else here
            own[name] += frame.time - children
        for child in frame.children:
            walk(child, here)

    walk(root, "other (stdlib, prometheus-client, ...)")
    busy = max(sum(v for k, v in own.items() if k != "idle"), 1e-9)
    return {k: round(v / busy, 3) for k, v in own.most_common() if k != "idle"}


def profile_embedded(quick: bool) -> tuple[dict[str, Any], str]:
    from pyinstrument import Profiler

    settings = broker.bench_settings("profile")
    batch = broker.records(settings, Simulation(fleet(quick)).events())
    prefix = settings.kafka.topic_prefix + "."
    work = [(r.topic.removeprefix(prefix), r.value, r.key, r.content_type) for r in batch]
    runtime = EmbeddedRuntime(settings)
    profiler = Profiler(interval=INTERVAL_S)
    profiler.start()
    for offset, (suffix, value, key, content_type) in enumerate(work):
        runtime.feed_raw(suffix, value, offset, key, content_type)
    runtime.finish()
    profiler.stop()
    text = profiler.output_text(unicode=False, color=False, show_all=False)
    root = profiler.last_session.root_frame() if profiler.last_session else None
    figures = split(root) if root is not None else {}
    return {"records": len(batch), **figures}, text


def profile_worker(quick: bool) -> tuple[dict[str, Any], str]:
    """The Kafka worker under pyinstrument while it drains the throughput fleet, its telemetry
    in producer batches (`kafka.telemetry_batch`, the default)."""
    settings = broker.bench_settings("profile")
    unreachable = broker.reachable(settings)
    if unreachable is not None:
        return {"skipped": unreachable}, ""
    batch = broker.records(settings, Simulation(fleet(quick)).events())
    with broker.private_topics(settings), tempfile.TemporaryDirectory() as tmp:
        broker.produce(settings, batch, batched=True)  # as FleetPulse's producers write it
        ends = broker.end_offsets(settings, sorted({record.topic for record in batch}))
        session = Path(tmp) / "worker.pyisession"
        worker = broker.Worker(settings, Path(tmp), command=[
            sys.executable, "-m", "pyinstrument", "--interval", str(INTERVAL_S * 5),
            "-r", "pyisession", "-o", str(session), "-m", "pipeline.cli", "worker",
            "--loglevel", "warning"]).start()
        try:
            wall, _ = broker.drain(worker, ends, timeout=900)
        finally:
            worker.stop()
            time.sleep(1)
        if not session.exists():
            return {"error": "pyinstrument wrote no session", "log": worker.tail()}, ""
        from pyinstrument.session import Session

        loaded = Session.load(str(session))
        root = loaded.root_frame()
        text = subprocess.run(
            [sys.executable, "-m", "pyinstrument", "--load", str(session), "-r", "text"],
            capture_output=True, text=True, check=False).stdout
    figures = split(root) if root is not None else {}
    return {"records": len(batch), "drain_wall_s": round(wall, 2), **figures}, text


def run(quick: bool, worker: bool = False) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    figures["embedded"], text = profile_embedded(quick)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{result_name('profile-embedded', quick)}.txt").write_text(text)
    if worker:
        figures["worker"], text = profile_worker(quick)
        if text:
            (RESULTS / f"{result_name('profile-worker', quick)}.txt").write_text(text)
    settings = {"quick": quick, "interval_s": INTERVAL_S, "profiler": "pyinstrument",
                "load_average": load_average()}
    path = write_result(result_name("profile", quick), figures, settings)
    return {"figures": figures, "settings": settings, "path": str(path)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a shorter fleet run")
    parser.add_argument("--worker", action="store_true", help="also profile the Kafka worker")
    args = parser.parse_args()
    result = run(args.quick, args.worker)
    print(json.dumps(result["figures"], indent=1))
    print(f"results in {result['path']}")


if __name__ == "__main__":
    main()
