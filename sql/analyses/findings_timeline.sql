-- question: What went wrong, when? Per time bucket, check and severity: unhealthy findings
-- (heartbeats and all-clear findings left out) and how many nodes or slices they were about.
SELECT time_bucket($bucket, ts) AS bucket,
       "check",
       severity,
       count(*) AS findings,
       count(DISTINCT target_kind || ':' || target_name) AS targets
FROM findings
WHERE NOT healthy AND "check" <> 'heartbeat'
  AND ts >= $since AND ts < $until
  AND ($pool IS NULL OR target_pool = $pool)
GROUP BY ALL
ORDER BY bucket, findings DESC, "check", severity;
