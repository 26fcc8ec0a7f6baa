-- question: Which nodes and slices fail again and again, and how soon? Per node or slice with a
-- failure in the period (a health episode that reached degraded or worse): its model, the number
-- of failures, first and last, and the mean and shortest time between consecutive failures.
WITH failures AS (
    SELECT target_kind, target_name, target_pool, episode, min(ts) AS started
    FROM node_state
    WHERE episode IS NOT NULL
      AND state IN ('degraded', 'cordoned', 'draining', 'repairing')
      AND ts >= $since AND ts < $until
      AND ($pool IS NULL OR target_pool = $pool)
    GROUP BY ALL
), gaps AS (
    SELECT *,
           started - lag(started) OVER (PARTITION BY target_kind, target_name ORDER BY started) AS gap
    FROM failures
), models AS (
    SELECT coalesce(slice, node) AS target_name, any_value(accelerator) AS accelerator
    FROM utilization
    WHERE window_start >= $since AND window_start < $until
      AND ($pool IS NULL OR pool = $pool)
    GROUP BY 1
)
SELECT target_kind,
       target_name,
       any_value(accelerator) AS accelerator,
       any_value(target_pool) AS pool,
       count(*) AS failures,
       min(started) AS first_failure,
       max(started) AS last_failure,
       round(avg(epoch(gap)) / 3600, 3) AS mean_hours_between,
       round(min(epoch(gap)) / 3600, 3) AS min_hours_between
FROM gaps
LEFT JOIN models USING (target_name)
GROUP BY target_kind, target_name
ORDER BY failures DESC, mean_hours_between NULLS LAST, target_name;
