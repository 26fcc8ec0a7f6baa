"""Subcommands of `fleetpulse`, one module each (see pipeline/cli.py)."""
