"""FleetPulse benchmarks: `make bench` (python -m bench). Speeds are ratios to a baseline
measured in the same run, medians of several repetitions; nothing here is a test."""
