-- question: How did fleet health change over time? Per time bucket and health state: how
-- many times a node or slice entered that state, and how many distinct targets did.
SELECT time_bucket($bucket, ts) AS bucket,
       state,
       count(*) AS transitions,
       count(DISTINCT target_kind || ':' || target_name) AS targets
FROM node_state
WHERE ts >= $since AND ts < $until
  AND ($pool IS NULL OR target_pool = $pool)
GROUP BY ALL
ORDER BY bucket, state;
