-- question: How busy is each pool, zone or accelerator model over time? Per time bucket and
-- --param by (pool, zone or accelerator): device-hours reported, mean and peak utilization (%),
-- share of device time allocated to a job, and mean memory use (%).
-- param by: pool, zone, accelerator
-- alias utilization_by_pool: by=pool
-- alias utilization_by_zone: by=zone
-- alias utilization_by_model: by=accelerator
SELECT time_bucket($bucket, window_start) AS bucket,
       COLUMNS(lambda c: c = $by),  -- the dimension's own column, under its own name
       round(sum(hours), 3) AS device_hours,
       round(sum(util_mean * hours) / sum(hours), 2) AS util_mean_pct,
       round(max(util_max), 2) AS util_peak_pct,
       round(100 * coalesce(sum(hours) FILTER (WHERE allocated), 0) / sum(hours), 2) AS allocated_pct,
       round(100 * sum(mem_used_frac * hours) / sum(hours), 2) AS mem_used_pct
FROM utilization
WHERE window_start >= $since AND window_start < $until
  AND ($pool IS NULL OR pool = $pool)
GROUP BY ALL
ORDER BY 1, 2;
