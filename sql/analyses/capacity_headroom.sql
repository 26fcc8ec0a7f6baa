-- question: How much accelerator capacity is free in each zone now? Per zone and accelerator
-- model, over the last hour before the end of the period: devices reporting, split into out of
-- service (their node or slice cordoned, draining or repairing), allocated to a job, and free.
WITH recent AS (
    SELECT zone, accelerator, coalesce(slice, node) AS unit, node, device,
           bool_or(allocated) AS allocated
    FROM utilization
    WHERE window_start >= $until - INTERVAL 1 HOUR AND window_start < $until
      AND ($pool IS NULL OR pool = $pool)
    GROUP BY ALL
), current_state AS (
    SELECT target_name AS unit, arg_max(state, ts) AS state
    FROM node_state
    WHERE ts < $until
    GROUP BY 1
), classified AS (
    SELECT zone, accelerator,
           CASE WHEN coalesce(state, 'healthy') IN ('cordoned', 'draining', 'repairing')
                THEN 'out_of_service'
                WHEN allocated THEN 'allocated'
                ELSE 'free' END AS status
    FROM recent
    LEFT JOIN current_state USING (unit)
)
SELECT zone,
       accelerator,
       count(*) AS devices,
       count(*) FILTER (WHERE status = 'out_of_service') AS out_of_service,
       count(*) FILTER (WHERE status = 'allocated') AS allocated,
       count(*) FILTER (WHERE status = 'free') AS free,
       round(100 * count(*) FILTER (WHERE status = 'free') / count(*), 2) AS free_pct
FROM classified
GROUP BY ALL
ORDER BY zone, accelerator;
