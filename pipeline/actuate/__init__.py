"""What every actuator of fleet.actions shares, whatever it acts on (Kubernetes, Slurm).

- `defences`: the record's credibility (expires_at, age, key) and the removal cap, pure.
- `base`: one action in, one outcome out: other clusters, network elements, dry run,
  expiry, the outcome counted and echoed as a node_event; the runtime's work is `_on_target`.
- `kafka`: fleet.actions through the shared edge into per-target lanes, echoes acknowledged
  before the commit (`ActuatorSink`, `run_actuator`, `Producer`, `Out`).
"""
