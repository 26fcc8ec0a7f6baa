-- question: Which nodes and slices cause the most trouble? The worst 20 in the period, ranked by
-- actions taken on them, then fatal XIDs, critical findings, all unhealthy findings and XIDs.
WITH f AS (
    SELECT target_kind, target_name, any_value(target_pool) AS pool,
           any_value(target_zone) AS zone, count(*) AS findings,
           count(*) FILTER (WHERE severity = 'critical') AS critical_findings,
           string_agg(DISTINCT "check", ',' ORDER BY "check") AS checks
    FROM findings
    WHERE NOT healthy AND "check" <> 'heartbeat'
      AND ts >= $since AND ts < $until
    GROUP BY target_kind, target_name
), x AS (
    SELECT 'node' AS target_kind, node AS target_name, any_value(pool) AS pool,
           any_value(zone) AS zone, sum(lines) AS xids,
           coalesce(sum(lines) FILTER (WHERE xid_fatal), 0) AS fatal_xids
    FROM xid
    WHERE ts >= $since AND ts < $until
    GROUP BY node
), a AS (
    SELECT target_kind, target_name, any_value(target_pool) AS pool,
           any_value(target_zone) AS zone, count(*) AS actions,
           string_agg(DISTINCT kind, ',' ORDER BY kind) AS action_kinds
    FROM actions
    WHERE ts >= $since AND ts < $until
    GROUP BY target_kind, target_name
)
SELECT target_kind,
       target_name,
       coalesce(a.pool, f.pool, x.pool) AS pool,
       coalesce(a.zone, f.zone, x.zone) AS zone,
       coalesce(actions, 0) AS actions,
       coalesce(fatal_xids, 0) AS fatal_xids,
       coalesce(critical_findings, 0) AS critical_findings,
       coalesce(findings, 0) AS findings,
       coalesce(xids, 0) AS xids,
       action_kinds,
       checks
FROM f
FULL JOIN x USING (target_kind, target_name)
FULL JOIN a USING (target_kind, target_name)
WHERE $pool IS NULL OR coalesce(a.pool, f.pool, x.pool) = $pool
ORDER BY actions DESC, fatal_xids DESC, critical_findings DESC, findings DESC, xids DESC,
         target_name
LIMIT 20;
