"""FleetPulse: telemetry pipeline for NVIDIA GPU and Google Cloud TPU fleets.

Everything but the faust wiring lives here; nothing in this package imports faust.
"""

# The one version: pyproject.toml reads it, and the chart's appVersion and the Containerfile's
# version label must agree with it (tests/unit/test_version.py). CHANGELOG.md says what changed.
__version__ = "0.1.0"
