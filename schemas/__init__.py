"""JSON Schemas (2020-12), one per topic value, with samples; shipped as package data."""
