-- question: Which XID errors occur, how often and how widely? Per XID code: its catalog name and
-- severity, events, nodes and GPUs hit, first and last seen, and events per 1000 GPU-hours
-- reported in the same period.
WITH gpu_hours AS (
    SELECT sum(hours) AS hours
    FROM utilization
    WHERE slice IS NULL
      AND window_start >= $since AND window_start < $until
      AND ($pool IS NULL OR pool = $pool)
)
SELECT xid,
       any_value(mnemonic) AS mnemonic,
       any_value(xid_severity) AS severity,
       sum(lines) AS events,
       count(DISTINCT node) AS nodes,
       count(DISTINCT node || '/' || pci_bus_id) AS gpus,
       min(ts) AS first_seen,
       max(ts) AS last_seen,
       round(1000 * sum(lines) / nullif(any_value(gpu_hours.hours), 0), 3) AS per_1k_gpu_hours
FROM xid, gpu_hours
WHERE ts >= $since AND ts < $until
  AND ($pool IS NULL OR pool = $pool)
GROUP BY xid
ORDER BY events DESC, xid;
