"""The pipeline's topology, declared once: the table of stages that both runtimes interpret.

Each row is a stage module's `STAGE` (base.py: its input topics, key, state table, `on_item`,
`on_items`, `on_time`, `on_eof`, outputs). The embedded runtime (pipeline/runtime/embedded.py)
is one partition holding the whole fleet and routes outputs to the consuming stage in process;
the faust app (streams/agents.py) runs an agent per row and sends outputs to topics. A test of
a stage through one driver is a test of both.

    stage      inputs (key)                                   state      outputs
    telemetry  telemetry.gpu/tpu/ici/fabric, events.xid (node  telemetry  findings, utilization,
               or slice), inventory, announce-input (target)              policy-input,
                                                                         fleet-input,
                                                                         capacity-input, dlq
    fleet      fleet-input (cluster): fabric ticks, their     fleet      findings, actions
    (cluster)  port findings, placement; peer samples of                 (switch/link verdicts,
               nodes in jobs                                             job stragglers)
    health     findings, events.node, actions (target)        health     proposals, node-state,
                                                                         policy-input, zone-input,
                                                                         announce-input,
                                                                         capacity-input
    zone       events.capacity, zone-input (zone)             zones      policy-input,
                                                                         announce-input,
                                                                         capacity-input
    policy     policy-input (pool), events.policy (guard)     policy     actions, alerts,
                                                                         withheld
    capacity   capacity-input (fleet): inventory, tombstones, capacity   capacity,
               utilization, node states, capacity events                 capacity.advice,
                                                                         alerts

Adding a stage: a module here with its key, state and `on_item` (and `STAGE`), its table and
any internal topic in pipeline/wire/internal.py, and its row below.
"""

from __future__ import annotations

from pipeline.stages import capacity, cluster, health, policy, telemetry, zone
from pipeline.stages.base import Stage


def reader_of(stages: tuple[Stage, ...]) -> dict[str, Stage]:
    """The reader of each topic among `stages` (a subset of the table: a backtest runs the
    telemetry stage alone)."""
    return {topic: stage for stage in stages for topic in stage.inputs}


STAGES: tuple[Stage, ...] = (
    telemetry.STAGE,
    cluster.STAGE,
    health.STAGE,
    zone.STAGE,
    policy.STAGE,
    capacity.STAGE,
)
# Which stage reads a topic: every topic has at most one reader inside the pipeline.
READER: dict[str, Stage] = reader_of(STAGES)
