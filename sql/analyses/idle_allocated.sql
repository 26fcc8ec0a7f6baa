-- question: How much allocated capacity sits idle? Per pool and accelerator model: device-hours
-- allocated to a job, those with mean utilization below the idle threshold (lake.idle_util_pct),
-- the idle share, and how many jobs held idle devices.
SELECT pool,
       accelerator,
       round(sum(hours), 3) AS allocated_hours,
       round(coalesce(sum(hours) FILTER (WHERE util_mean < $idle_pct), 0), 3) AS idle_allocated_hours,
       round(100 * coalesce(sum(hours) FILTER (WHERE util_mean < $idle_pct), 0) / sum(hours), 2)
           AS idle_pct_of_allocated,
       count(DISTINCT job) FILTER (WHERE util_mean < $idle_pct) AS jobs_with_idle_devices
FROM utilization
WHERE allocated
  AND window_start >= $since AND window_start < $until
  AND ($pool IS NULL OR pool = $pool)
GROUP BY ALL
ORDER BY idle_allocated_hours DESC, pool, accelerator;
