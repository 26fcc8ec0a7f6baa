-- question: How did healthy, free and out-of-service capacity change over time? Per time bucket,
-- region, zone and accelerator model: devices reporting in the bucket, split into out of service
-- (their node or slice cordoned, draining or repairing at the bucket's end), allocated to a job,
-- and free. A device counts once per bucket.
WITH devices AS (
    SELECT time_bucket($bucket, window_start) AS bucket, zone, accelerator, cluster,
           coalesce(slice, node) AS unit, node, device,
           bool_or(allocated) AS allocated
    FROM utilization
    WHERE window_start >= $since AND window_start < $until
      AND ($pool IS NULL OR pool = $pool)
    GROUP BY ALL
), states AS (
    SELECT target_cluster AS cluster, target_name AS unit, state, ts,
           coalesce(until, TIMESTAMP '9999-12-31') AS until
    FROM node_state
    WHERE ts < $until
), classified AS (
    SELECT d.bucket, d.zone, d.accelerator,
           CASE WHEN s.state IN ('cordoned', 'draining', 'repairing') THEN 'out_of_service'
                WHEN d.allocated THEN 'allocated'
                ELSE 'free' END AS status
    FROM devices AS d
    LEFT JOIN states AS s
      ON s.cluster = d.cluster AND s.unit = d.unit
     AND s.ts < d.bucket + $bucket AND s.until >= d.bucket + $bucket
)
SELECT bucket,
       regexp_replace(zone, '-[a-z]$', '') AS region,
       zone,
       accelerator,
       count(*) AS devices,
       count(*) FILTER (WHERE status = 'out_of_service') AS out_of_service,
       count(*) FILTER (WHERE status = 'allocated') AS allocated,
       count(*) FILTER (WHERE status = 'free') AS free
FROM classified
GROUP BY ALL
ORDER BY bucket, zone, accelerator;
