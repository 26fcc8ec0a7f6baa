"""`fleetpulse …`: the command line. Settings are read here, once, and passed down.

Each subcommand lives in its own module exposing `register(subparsers)`, which adds a parser
whose `handler(args, settings) -> int` does the work; this file only wires them together.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

from pipeline import __version__
from pipeline.cli_parser import FleetPulseParser
from pipeline.config import load_settings
from pipeline.detect.catalog import validate_tunings
from pipeline.errors import FleetPulseError

# Modules that register subcommands, in the order `--help` lists them.
COMMAND_MODULES: tuple[str, ...] = (
    "pipeline.commands.demo",
    "pipeline.commands.topics",
    "pipeline.commands.simulate",
    "pipeline.commands.worker",
    "pipeline.commands.sink",
    "pipeline.commands.lake",
    "pipeline.commands.sql",
    "pipeline.commands.capacity",
    "pipeline.commands.report",
    "pipeline.commands.ingest",
    "pipeline.commands.alerts",
    "pipeline.commands.serve",
    "pipeline.commands.backtest",
    "pipeline.commands.replay",
    "pipeline.commands.inventory",
    "pipeline.commands.policy",
    "pipeline.commands.kube",
    "pipeline.commands.slurm",  # adds `slurm` under kube's `actuate` and `watch`
    "pipeline.commands.node",
)


def build_parser() -> argparse.ArgumentParser:
    # FleetPulseParser: no abbreviations, defaults in help; subparsers inherit the class.
    parser = FleetPulseParser(
        prog="fleetpulse",
        description="Telemetry pipeline for NVIDIA GPU and Google Cloud TPU fleets: detect "
        "unhealthy accelerators, decide cordon/drain/repair under a safety policy, and keep "
        "a queryable record of fleet utilization.",
        epilog="Configuration: fleetpulse.toml (or --config / FLEETPULSE_CONFIG), overridden by "
        "FLEETPULSE_<SECTION>__<KEY> environment variables, e.g. FLEETPULSE_KAFKA__BOOTSTRAP.",
    )
    parser.add_argument("--version", action="version", version=f"fleetpulse {__version__}")
    parser.add_argument("--config", type=Path, help="TOML config file (default: ./fleetpulse.toml)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = load_settings(args.config)
        validate_tunings(settings.detect)  # the catalog's rules for [detect.checks]
        code: int = args.handler(args, settings)
        return code
    except FleetPulseError as exc:
        print(f"fleetpulse: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fleetpulse: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
