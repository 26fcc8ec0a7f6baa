"""FleetPulse: telemetry pipeline for NVIDIA GPU and Google Cloud TPU fleets.

Everything but the faust wiring lives here; nothing in this package imports faust.
"""

__version__ = "0.1.0"
