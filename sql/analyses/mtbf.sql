-- question: How often do the nodes and slices of each pool, zone or accelerator model fail? Per
-- --param by (pool, zone or accelerator): the accelerator models in it, nodes (GPU) or slices
-- (TPU) seen, their observed hours, failures (health episodes that reached degraded or worse,
-- from fleet.node-state) and mean time between failures in node- or slice-hours.
-- param by: pool, zone, accelerator
-- alias mtbf_by_pool: by=pool
-- alias mtbf_by_model: by=accelerator
WITH units AS (
    -- a GPU node or a TPU slice is the unit that fails and is repaired
    SELECT coalesce(slice, node) AS unit,
           any_value(pool) AS pool,
           any_value(zone) AS zone,
           any_value(accelerator) AS accelerator,
           sum(hours) / count(DISTINCT device) AS unit_hours
    FROM utilization
    WHERE window_start >= $since AND window_start < $until
      AND ($pool IS NULL OR pool = $pool)
    GROUP BY 1
), failures AS (
    SELECT target_name AS unit, count(DISTINCT episode) AS failures
    FROM node_state
    WHERE episode IS NOT NULL
      AND state IN ('degraded', 'cordoned', 'draining', 'repairing')
      AND ts >= $since AND ts < $until
    GROUP BY 1
), per_group AS (
    SELECT COLUMNS(lambda c: c = $by),  -- the dimension's own column, under its own name
           string_agg(DISTINCT accelerator, ', ' ORDER BY accelerator) AS accelerators,
           count(*) AS units,
           round(sum(unit_hours), 2) AS unit_hours,
           coalesce(sum(failures), 0) AS failures,
           round(sum(unit_hours) / nullif(sum(failures), 0), 2) AS mtbf_hours
    FROM units
    LEFT JOIN failures USING (unit)
    GROUP BY ALL
)
-- per accelerator model, the list of models is the model itself: left out
SELECT COLUMNS(lambda c: c <> 'accelerators' OR $by <> 'accelerator')
FROM per_group
ORDER BY mtbf_hours NULLS LAST, 1;
