-- question: How did fleet health change over time? Per time bucket and health state: how many
-- times a node or slice entered that state from a different one, and how many distinct targets
-- did. A target's first appearance counts as a change from healthy: a node first seen healthy
-- is no change (else every node's arrival would dwarf the real changes); one first seen
-- degraded is.
WITH changes AS (
    SELECT ts, target_kind, target_name, target_pool, state,
           lag(state) OVER (PARTITION BY target_kind, target_name ORDER BY ts) AS previous
    FROM node_state
    WHERE ts < $until
)
SELECT time_bucket($bucket, ts) AS bucket,
       state,
       count(*) AS transitions,
       count(DISTINCT target_kind || ':' || target_name) AS targets
FROM changes
WHERE state <> coalesce(previous, 'healthy')
  AND ts >= $since
  AND ($pool IS NULL OR target_pool = $pool)
GROUP BY ALL
ORDER BY bucket, state;
