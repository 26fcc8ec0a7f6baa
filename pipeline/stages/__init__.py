"""The stages both runtimes drive: the topology table and each stage's key, state and handlers."""
