-- question: How available were the TPU slices? Per slice: the share of the time it was known in
-- the period (from its first utilization row or state change) that it was in service (not
-- cordoned, draining or repairing, per fleet.node-state), hours out of service, failures
-- (episodes that reached degraded or worse), chips reporting and its state at the end.
WITH seen AS (
    SELECT slice, any_value(pool) AS pool, any_value(zone) AS zone,
           any_value(accelerator) AS accelerator, count(DISTINCT device) AS chips,
           min(window_start) AS first_row
    FROM utilization
    WHERE slice IS NOT NULL
      AND window_start >= $since AND window_start < $until
    GROUP BY slice
), changes AS (
    SELECT target_name AS slice, target_pool, target_zone, ts, state, episode,
           lead(ts) OVER (PARTITION BY target_name ORDER BY ts) AS next_ts
    FROM node_state
    WHERE target_kind = 'slice' AND ts < $until
), spans AS (
    SELECT slice, state,
           greatest(ts, $since) AS span_start,
           least(coalesce(next_ts, $until), $until) AS span_end
    FROM changes
), states AS (
    SELECT slice,
           any_value(target_pool) AS pool,
           any_value(target_zone) AS zone,
           arg_max(state, ts) AS state_now,
           min(ts) AS first_change,
           count(DISTINCT episode) FILTER (
               WHERE state IN ('degraded', 'cordoned', 'draining', 'repairing') AND ts >= $since
           ) AS failures
    FROM changes
    GROUP BY slice
), outage AS (
    SELECT slice, sum(epoch(span_end - span_start)) AS out_s
    FROM spans
    WHERE span_end > span_start AND state IN ('cordoned', 'draining', 'repairing')
    GROUP BY slice
)
SELECT slice,
       coalesce(seen.pool, states.pool) AS pool,
       coalesce(seen.zone, states.zone) AS zone,
       accelerator,
       coalesce(chips, 0) AS chips,
       -- least/greatest skip NULLs: a slice may have rows, state changes, or both
       round(100 * (1 - coalesce(out_s, 0)
                        / epoch($until - greatest($since, least(first_row, first_change)))), 2)
           AS available_pct,
       round(coalesce(out_s, 0) / 3600, 3) AS hours_out_of_service,
       coalesce(failures, 0) AS failures,
       coalesce(state_now, 'healthy') AS state_now
FROM seen
FULL JOIN states USING (slice)
LEFT JOIN outage USING (slice)
WHERE $pool IS NULL OR coalesce(seen.pool, states.pool) = $pool
ORDER BY available_pct, slice;
