-- question: Which TPU ICI links went bad? Per slice and link (chip:port, or the chip or host an
-- ICI finding named): the ICI checks that fired, unhealthy findings, the worst severity, and
-- when it was first and last seen in the period.
SELECT target_name AS slice,
       any_value(target_pool) AS pool,
       any_value(target_zone) AS zone,
       coalesce(device, '') AS link,
       string_agg(DISTINCT "check", ',' ORDER BY "check") AS checks,
       count(*) AS findings,
       arg_max(severity, CASE severity WHEN 'critical' THEN 3 WHEN 'warning' THEN 2 ELSE 1 END)
           AS worst_severity,
       min(ts) AS first_seen,
       max(ts) AS last_seen
FROM findings
WHERE NOT healthy
  AND (entity_kind = 'ici_link' OR "check" = 'ici' OR "check" LIKE 'ici.%')
  AND ts >= $since AND ts < $until
  AND ($pool IS NULL OR target_pool = $pool)
GROUP BY target_name, coalesce(device, '')
ORDER BY findings DESC, slice, link;
