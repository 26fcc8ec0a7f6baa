-- question: What does a useful accelerator-hour cost? Per pool and accelerator model: total
-- cost at list price, useful hours (device-hours weighted by mean utilization), and cost per
-- useful hour, which is the list price divided by the utilization actually achieved.
WITH usage AS (
    SELECT pool,
           accelerator,
           sum(hours) AS device_hours,
           sum(hours * util_mean / 100) AS useful_hours
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
       round(useful_hours, 3) AS useful_hours,
       round(100 * useful_hours / device_hours, 2) AS useful_pct,
       round(device_hours * usd_per_hour, 2) AS total_cost_usd,
       round(device_hours * usd_per_hour / nullif(useful_hours, 0), 2) AS usd_per_useful_hour
FROM priced
ORDER BY usd_per_useful_hour DESC NULLS FIRST, pool, accelerator;
