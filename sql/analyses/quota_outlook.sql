-- question: When does each quota run out at its current trend? Per zone and quota metric, over
-- the period: the latest usage and limit, the usage trend (least-squares slope, per hour), how
-- much of the usage's variation the trend explains (r2), and, when usage is rising, the hours
-- left before it meets the limit. No trend, no forecast (a flat quota never runs out). This is
-- the plain trend; `fleetpulse capacity` also drops what came before the last jump in usage.
WITH points AS (
    SELECT zone, quota_metric, ts, quota_usage, quota_limit
    FROM capacity
    WHERE kind IN ('QUOTA_USAGE', 'QUOTA_EXCEEDED', 'QUOTA_CHANGED')
      AND quota_metric IS NOT NULL
      AND ts >= $since AND ts < $until
), fitted AS (
    SELECT zone, quota_metric,
           arg_max(quota_usage, ts) AS usage,
           arg_max(quota_limit, ts) AS quota_limit,
           count(*) AS points,
           regr_slope(quota_usage, epoch(ts)) * 3600 AS trend_per_h,
           regr_r2(quota_usage, epoch(ts)) AS r2,
           max(ts) AS as_of
    FROM points
    GROUP BY ALL
)
SELECT regexp_replace(zone, '-[a-z]$', '') AS region,
       zone,
       quota_metric,
       quota_limit,
       usage,
       quota_limit - usage AS headroom,
       points,
       round(trend_per_h, 3) AS trend_per_h,
       round(r2, 3) AS r2,
       CASE WHEN trend_per_h > 0 AND points >= 6
            THEN round(greatest(quota_limit - usage, 0) / trend_per_h, 2) END AS hours_left,
       as_of
FROM fitted
ORDER BY hours_left NULLS LAST, headroom, zone, quota_metric;
