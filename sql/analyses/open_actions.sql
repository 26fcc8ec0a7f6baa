-- question: Which actions are still open? For each node or slice, its latest action (other than
-- uncordon) before the end of the period, if the target has not been healthy since: what was
-- done, when, why, whether it was a dry run, and the state the target is in now.
WITH latest_action AS (
    SELECT *
    FROM actions
    WHERE kind <> 'uncordon' AND ts < $until
      AND ($pool IS NULL OR target_pool = $pool)
    QUALIFY row_number() OVER (PARTITION BY target_kind, target_name ORDER BY ts DESC, kind) = 1
), current_state AS (
    SELECT target_kind, target_name, arg_max(state, ts) AS state_now, max(ts) AS state_since
    FROM node_state
    WHERE ts < $until
    GROUP BY ALL
)
SELECT a.ts,
       a.kind,
       a.target_kind,
       a.target_name,
       a.target_pool,
       a.target_zone,
       a.dry_run,
       coalesce(s.state_now, 'unknown') AS state_now,
       round(epoch($until - a.ts) / 3600, 2) AS hours_open,
       array_to_string(a.reason_checks, ',') AS checks,
       a.reason_summary,
       a.action_id
FROM latest_action AS a
LEFT JOIN current_state AS s USING (target_kind, target_name)
WHERE s.state_now IS DISTINCT FROM 'healthy' OR s.state_since < a.ts
ORDER BY a.ts, a.target_name;
