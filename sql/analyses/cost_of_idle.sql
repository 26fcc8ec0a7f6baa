-- question: What does idle capacity cost? Per pool and accelerator model, at on-demand list
-- prices (prices view): device-hours with mean utilization below the idle threshold, split
-- into allocated-but-idle and unallocated, and their cost in USD next to the total cost.
WITH usage AS (
    SELECT pool,
           accelerator,
           sum(hours) AS device_hours,
           coalesce(sum(hours) FILTER (WHERE util_mean < $idle_pct), 0) AS idle_hours,
           coalesce(sum(hours) FILTER (WHERE util_mean < $idle_pct AND allocated), 0)
               AS idle_allocated_hours
    FROM utilization
    WHERE window_start >= $since AND window_start < $until
      AND ($pool IS NULL OR pool = $pool)
    GROUP BY ALL
), priced AS (
    SELECT *, list_price(accelerator) AS usd_per_hour FROM usage
)
SELECT pool,
       accelerator,
       usd_per_hour,
       round(device_hours, 3) AS device_hours,
       round(idle_hours, 3) AS idle_hours,
       round(idle_allocated_hours, 3) AS idle_allocated_hours,
       round(idle_hours * usd_per_hour, 2) AS idle_cost_usd,
       round(idle_allocated_hours * usd_per_hour, 2) AS idle_allocated_cost_usd,
       round(device_hours * usd_per_hour, 2) AS total_cost_usd
FROM priced
ORDER BY idle_cost_usd DESC NULLS LAST, pool, accelerator;
