-- question: How did healthy, free and out-of-service capacity change over time? Per time bucket,
-- region, zone and accelerator: devices, out of service, allocated and healthy free. From the
-- capacity stage's snapshots (fleet.capacity; source = 'snapshots': each key's last snapshot in
-- the bucket, provisioning models summed, accelerator = the catalog type) when the lake holds
-- any in the period and no pool is asked (snapshots have no pool). Otherwise from utilization
-- (source = 'utilization': devices reporting in the bucket, split into out of service (their
-- node or slice cordoned, draining or repairing at the bucket's end), allocated to a job, and
-- free; accelerator = the model name; a device counts once per bucket).
WITH snapshots AS (
    SELECT time_bucket($bucket, ts) AS bucket, region, zone, accelerator_type AS accelerator,
           provisioning_model,
           arg_max(devices, ts) AS devices,
           arg_max(out_of_service, ts) AS out_of_service,
           arg_max(allocated, ts) AS allocated,
           arg_max(healthy_free, ts) AS free
    FROM capacity_snapshots
    WHERE ts >= $since AND ts < $until AND $pool IS NULL
    GROUP BY ALL
), devices AS (
    SELECT time_bucket($bucket, window_start) AS bucket, zone, accelerator, cluster,
           coalesce(slice, node) AS unit, node, device,
           bool_or(allocated) AS allocated
    FROM utilization
    WHERE window_start >= $since AND window_start < $until
      AND ($pool IS NULL OR pool = $pool)
      AND NOT EXISTS (SELECT 1 FROM snapshots)
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
       region,
       zone,
       accelerator,
       sum(devices)::BIGINT AS devices,
       sum(out_of_service)::BIGINT AS out_of_service,
       sum(allocated)::BIGINT AS allocated,
       sum(free)::BIGINT AS free,
       'snapshots' AS source
FROM snapshots
GROUP BY bucket, region, zone, accelerator
UNION ALL
SELECT bucket,
       regexp_replace(zone, '-[a-z]$', '') AS region,
       zone,
       accelerator,
       count(*) AS devices,
       count(*) FILTER (WHERE status = 'out_of_service') AS out_of_service,
       count(*) FILTER (WHERE status = 'allocated') AS allocated,
       count(*) FILTER (WHERE status = 'free') AS free,
       'utilization' AS source
FROM classified
GROUP BY bucket, zone, accelerator
ORDER BY bucket, zone, accelerator;
