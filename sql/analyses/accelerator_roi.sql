-- question: Which accelerator type gives the most for the money? Per accelerator type (the
-- catalog's, from the model names in utilization) and pool: device-hours, useful hours
-- (device-hours x mean utilization), the list price per device-hour, and what a useful hour
-- costs, per device and per peak dense bf16 PFLOP (the catalog's TFLOPS, sourced): the cost of
-- the compute actually used, comparable across GPU and TPU types. Where jobs publish their step
-- time (utilization's step_compute_s, from job_step_compute_seconds), per job step: step_s, the
-- mean seconds a rank computes a step, and usd_per_1000_job_steps, the device-seconds one step
-- of a job computes on (its ranks' step times summed over its devices of that type and pool, per
-- window, averaged over the job windows) at the list price, for 1000 steps; collective waits
-- are not in the step time, so this is the cost of the steps' compute. NULL where no job
-- publishes step time.
-- Prices: the `prices` view (catalog medians, [lake.prices] first); cheapest per useful
-- PFLOP-hour first.
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
), job_steps AS (
    SELECT accelerator_type(accelerator) AS accelerator_type,
           pool,
           job,
           window_start,
           sum(step_compute_s) AS device_step_s,
           count(*) AS ranks
    FROM utilization
    WHERE window_start >= $since AND window_start < $until
      AND ($pool IS NULL OR pool = $pool)
      AND step_compute_s IS NOT NULL AND job IS NOT NULL
    GROUP BY ALL
), steps AS (
    SELECT accelerator_type, pool,
           sum(device_step_s) / sum(ranks) AS step_s,
           avg(device_step_s) AS device_step_s
    FROM job_steps
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
             / nullif(u.useful_hours * t.bf16_tflops, 0), 3) AS usd_per_useful_pflop_hour,
       round(s.step_s, 4) AS step_s,
       round(1000 * s.device_step_s * list_price(u.model) / 3600, 4) AS usd_per_1000_job_steps
FROM usage AS u
LEFT JOIN accelerator_types AS t ON t.type = u.accelerator_type
LEFT JOIN steps AS s ON s.accelerator_type = u.accelerator_type AND s.pool = u.pool
ORDER BY usd_per_useful_pflop_hour NULLS LAST, u.accelerator_type, u.pool;
