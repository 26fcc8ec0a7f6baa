"""Closing the loop on Kubernetes: the reference actuator (fleet.actions → nodes, echoed on
fleet.events.node) and the node watcher (nodes → fleet.events.node and fleet.inventory).

- `nodes`: what a Node object says (pool, zone, accelerator, our marks), pure.
- `client`: the official `kubernetes` client, configured from [kubernetes].
- `actuator`: cordon / drain / uncordon / repair requests, one action at a time.
- `watcher`: list + watch, with re-list on 410 Gone.
"""
