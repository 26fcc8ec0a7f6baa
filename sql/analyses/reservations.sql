-- question: What is reserved, and how much of it is used? Per reservation (Compute Engine or
-- Cloud TPU), its latest figures before the end of the period: devices reserved, in use and
-- unused (paid for, idle), and how often its use changed in the period. A reservation whose
-- latest state is DELETED is gone and left out.
WITH latest AS (
    SELECT quota_metric AS reservation,
           arg_max(zone, ts) AS zone,
           arg_max(region, ts) AS region,
           arg_max(accelerator_type, ts) AS accelerator_type,
           arg_max(quota_limit, ts) AS reserved,
           arg_max(quota_usage, ts) AS in_use,
           arg_max(state, ts) AS state,
           max(ts) AS as_of,
           count(*) FILTER (WHERE ts >= $since) AS changes
    FROM capacity
    WHERE kind = 'RESERVATION_CHANGED' AND quota_metric IS NOT NULL AND ts < $until
    GROUP BY quota_metric
)
SELECT region,
       zone,
       accelerator_type,
       regexp_extract(reservation, '[^/]+$') AS reservation,
       reserved,
       in_use,
       reserved - in_use AS unused,
       round(100 * in_use / nullif(reserved, 0), 1) AS in_use_pct,
       state,
       changes,
       as_of
FROM latest
WHERE state IS DISTINCT FROM 'DELETED'
ORDER BY unused DESC, zone, reservation;
