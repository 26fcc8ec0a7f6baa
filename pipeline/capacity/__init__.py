"""Capacity as a first-class output (issue 37): the pure core.

state     the fold: inventory, node states, capacity events, utilization → one fleet-wide state
snapshot  the state → capacity_snapshot/1 per region/zone/accelerator type/provisioning model
forecast  when a quota runs out: a trend over its series, with a confidence; none when flat
repair    time back in service: found → cordoned → drained → repair requested → back
crunch    FleetPulseCapacityCrunch: a type short in a region, and where the spare capacity is
advice    capacity_advice/1: zones ranked for a type and count, for schedulers
prices    which price a cost figure used (negotiated, or a catalog column and location)
view      what a driver calls: on_item, on_tombstone, on_time, publish

No I/O, no clock: time arrives with the data.
"""
