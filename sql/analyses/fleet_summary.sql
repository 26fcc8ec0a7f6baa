-- question: What happened in the fleet over the period, in one row? Devices and device-hours
-- reported, mean utilization, allocated share, idle allocated hours, unhealthy findings,
-- actions (and how many were dry runs), XID events and alerts fired (in the pool, if one is
-- given: by the alert's pool label, or the pool of the node or slice it names).
SELECT
    (SELECT count(*) FROM (SELECT DISTINCT node, device FROM utilization
      WHERE window_start >= $since AND window_start < $until
        AND ($pool IS NULL OR pool = $pool))) AS devices,
    round(sum(hours), 2) AS device_hours,
    round(sum(util_mean * hours) / nullif(sum(hours), 0), 2) AS util_mean_pct,
    round(100 * sum(hours) FILTER (WHERE allocated) / nullif(sum(hours), 0), 2) AS allocated_pct,
    round(coalesce(sum(hours) FILTER (WHERE allocated AND util_mean < $idle_pct), 0), 2)
        AS idle_allocated_hours,
    (SELECT count(*) FROM findings
      WHERE NOT healthy AND "check" <> 'heartbeat' AND ts >= $since AND ts < $until
        AND ($pool IS NULL OR target_pool = $pool)) AS findings,
    (SELECT count(*) FROM actions WHERE ts >= $since AND ts < $until
        AND ($pool IS NULL OR target_pool = $pool)) AS actions,
    (SELECT count(*) FILTER (WHERE dry_run) FROM actions WHERE ts >= $since AND ts < $until
        AND ($pool IS NULL OR target_pool = $pool)) AS dry_run_actions,
    (SELECT coalesce(sum(lines), 0) FROM xid WHERE ts >= $since AND ts < $until
        AND ($pool IS NULL OR pool = $pool)) AS xid_events,
    -- an alert's pool: its pool label, else the pool of the node or slice it names
    (SELECT count(*) FROM alerts
      WHERE status = 'firing' AND ts >= $since AND ts < $until
        AND ($pool IS NULL OR coalesce(labels['pool'], (
            SELECT any_value(target_pool) FROM node_state
            WHERE target_name = coalesce(alerts.labels['target'], alerts.labels['node'],
                                         alerts.labels['slice']))) = $pool)) AS alerts_fired
FROM utilization
WHERE window_start >= $since AND window_start < $until
  AND ($pool IS NULL OR pool = $pool);
