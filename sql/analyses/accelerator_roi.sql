-- question: Which accelerator type gives the most for the money? Per accelerator type (the
-- catalog's, from the model names in utilization) and pool: device-hours, useful hours
-- (device-hours x mean utilization), the list price per device-hour, and what a useful hour
-- costs, per device and per peak dense bf16 PFLOP (the catalog's TFLOPS, sourced): the cost of
-- the compute actually used, comparable across GPU and TPU types. Prices: the `prices` view
-- (catalog medians, [lake.prices] first); cheapest per useful PFLOP-hour first.
WITH usage AS (
    SELECT accelerator_type(accelerator) AS accelerator_type,
           pool,
           sum(hours) AS device_hours,
           sum(hours * util_mean / 100) AS useful_hours,
           any_value(accelerator) AS model
    FROM utilization
    WHERE window_start >= $since AND window_start < $until
      AND ($pool IS NULL OR pool = $pool)
    GROUP BY ALL
)
SELECT u.accelerator_type,
       t.family,
       u.pool,
       round(u.device_hours, 3) AS device_hours,
       round(u.useful_hours, 3) AS useful_hours,
       round(100 * u.useful_hours / nullif(u.device_hours, 0), 2) AS useful_pct,
       list_price(u.model) AS usd_per_hour,
       t.bf16_tflops,
       round(u.device_hours * list_price(u.model) / nullif(u.useful_hours, 0), 2)
           AS usd_per_useful_hour,
       round(1000 * u.device_hours * list_price(u.model)
             / nullif(u.useful_hours * t.bf16_tflops, 0), 3) AS usd_per_useful_pflop_hour
FROM usage AS u
LEFT JOIN accelerator_types AS t ON t.type = u.accelerator_type
ORDER BY usd_per_useful_pflop_hour NULLS LAST, u.accelerator_type, u.pool;
