"""Backtests: detectors over labelled history, threshold sweeps, scoring against ground truth."""
