-- question: How much quota is left in each zone? Per zone (and quota metric, where one is
-- reported) the latest limit and usage before the end of the period and the headroom (absolute
-- and %); in the period: quota-exceeded errors, stock-outs, preemptions; maintenance to come.
WITH zones AS (
    SELECT DISTINCT region, zone FROM capacity WHERE ts < $until
), latest AS (
    SELECT zone, quota_metric,
           arg_max(quota_limit, ts) AS quota_limit,
           arg_max(quota_usage, ts) AS quota_usage,
           arg_max(quota_unit, ts) AS unit,
           max(ts) AS as_of
    FROM capacity
    WHERE quota_metric IS NOT NULL AND ts < $until
      AND kind <> 'RESERVATION_CHANGED'  -- a reservation's figures ride in quota_* too
    GROUP BY ALL
), period AS (
    SELECT zone,
           count(*) FILTER (WHERE kind = 'QUOTA_EXCEEDED') AS quota_exceeded,
           count(*) FILTER (WHERE kind = 'STOCKOUT') AS stockouts,
           count(*) FILTER (WHERE kind = 'PREEMPTION') AS preemptions
    FROM capacity
    WHERE ts >= $since AND ts < $until
    GROUP BY zone
), coming AS (
    SELECT zone, count(*) AS maintenance_scheduled, min(window_start) AS next_maintenance
    FROM capacity
    WHERE kind = 'MAINTENANCE_SCHEDULED' AND ts < $until AND window_start >= $until
    GROUP BY zone
)
SELECT region,
       zone,
       quota_metric,
       quota_limit,
       quota_usage,
       quota_limit - quota_usage AS headroom,
       round(100 * (quota_limit - quota_usage) / nullif(quota_limit, 0), 2) AS headroom_pct,
       unit,
       as_of,
       coalesce(quota_exceeded, 0) AS quota_exceeded,
       coalesce(stockouts, 0) AS stockouts,
       coalesce(preemptions, 0) AS preemptions,
       coalesce(maintenance_scheduled, 0) AS maintenance_scheduled,
       next_maintenance
FROM zones
LEFT JOIN latest USING (zone)
LEFT JOIN period USING (zone)
LEFT JOIN coming USING (zone)
ORDER BY headroom_pct NULLS LAST, zone, quota_metric;
