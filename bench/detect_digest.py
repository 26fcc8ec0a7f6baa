"""Every output of the embedded pipeline for a few faulty simulated fleets, as JSON lines.

A refactor of the detectors that must not change behaviour is checked by running this at two
commits and comparing the files (findings, actions, node states: ids and all):

    PYTHONPATH=<tree A> python -m bench.detect_digest /tmp/a.jsonl
    PYTHONPATH=<tree B> python -m bench.detect_digest /tmp/b.jsonl
    cmp /tmp/a.jsonl /tmp/b.jsonl

Each line is {"case", "topic", "n", "record"}; the order is the pipeline's output order.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path

import msgspec

from pipeline.config import Settings, SimSettings, load_settings
from pipeline.runtime.embedded import collect
from pipeline.sim import Simulation, parse_forced

# One forced fault of each detectable kind on a 12-node fleet with two slices ...
FORCED = (
    "G1@300", "G2/fatal@300", "G3@300", "G4@300", "G5@300", "G8@300", "N1@300", "N2@300",
    "F1/cable@300", "F1/tor@300", "F2@300", "F3@300", "S1@300", "S3@300", "J3@300", "T1@300",
    "T2@300", "G10/sbe@300", "H5@300",
)  # fmt: skip
# ... the rarer checks: NVLink bursts, application XIDs, TPU chips, OCS (a 3D
# slice of 4x4x4 cubes) ...
FORCED_MORE = ("G2/burst@300", "G10/xid31@200", "T4@300", "S2@300", "G9@300", "G10/remap@300")
FORCED_3D = ("T3@300",)
# ... and random faults at a high intensity (seeds of bench/detection.py).
RANDOM_SEEDS = (1, 2, 3, 4)


def cases(base: Settings) -> Iterator[tuple[str, Settings, Simulation]]:
    for spec in (*FORCED, *FORCED_MORE, *FORCED_3D):
        sim = msgspec.structs.replace(
            base.sim, gpu_nodes=12, clusters=1, tpu_slices=2, duration_s=40 * 60,
            random_faults=False, diurnal=True, seed=3,
        )  # fmt: skip
        if spec in FORCED_3D:
            sim = msgspec.structs.replace(sim, tpu_slices=1, tpu_slice_types=("v5p-128:4x4x4",))
        yield spec, msgspec.structs.replace(base, sim=sim), Simulation(sim, [parse_forced(spec)])
    for seed in RANDOM_SEEDS:
        sim = SimSettings(
            seed=seed, duration_s=2 * 3600, intensity=1000.0, gpu_nodes=24, tpu_slices=2,
            gpu_interval_s=30, tpu_interval_s=30, ici_interval_s=30,
        )  # fmt: skip
        yield f"random-seed{seed}", msgspec.structs.replace(base, sim=sim), Simulation(sim)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="JSON lines file to write")
    parser.add_argument("--only", action="append", help="run only this case (repeatable)")
    args = parser.parse_args(argv)
    base = load_settings(environ={})
    with args.out.open("wb") as out:
        for name, settings, sim in cases(base):
            if args.only and name not in args.only:
                continue
            outputs = collect(settings, sim.events())
            for topic in sorted(outputs):
                for n, record in enumerate(outputs[topic]):
                    line = {"case": name, "topic": topic, "n": n, "record": record}
                    out.write(msgspec.json.encode(line) + b"\n")
            counts = {t: len(v) for t, v in sorted(outputs.items())}
            print(name, counts, file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
