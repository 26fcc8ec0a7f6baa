-- question: How much allocated capacity sits idle? Per pool and accelerator model: device-hours
-- allocated to a job, those with mean utilization below the idle threshold (lake.idle_util_pct),
-- the idle share, and how many jobs held idle devices.
WITH per_job AS (
    SELECT pool,
           accelerator,
           job,
           sum(hours) AS allocated_hours,
           coalesce(sum(hours) FILTER (WHERE util_mean < $idle_pct), 0) AS idle_hours
    FROM utilization
    WHERE allocated
      AND window_start >= $since AND window_start < $until
      AND ($pool IS NULL OR pool = $pool)
    GROUP BY ALL
)
SELECT pool,
       accelerator,
       round(sum(allocated_hours), 3) AS allocated_hours,
       round(sum(idle_hours), 3) AS idle_allocated_hours,
       round(100 * sum(idle_hours) / sum(allocated_hours), 2) AS idle_pct_of_allocated,
       count(*) FILTER (WHERE idle_hours > 0) AS jobs_with_idle_devices
FROM per_job
GROUP BY ALL
ORDER BY idle_allocated_hours DESC, pool, accelerator;
