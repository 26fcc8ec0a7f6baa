-- One row per change of a node's or slice's health state (fleet.node-state). until: when the
-- next change of the same target happened (NULL while it is the current state).
CREATE OR REPLACE VIEW node_state AS
SELECT *,
       lead(ts) OVER (PARTITION BY target_cluster, target_kind, target_name ORDER BY ts) AS until
FROM raw_node_state;
