-- question: Where and when do XID errors cluster? Per node and time bucket: XID events, how many
-- of them the catalog calls fatal, and the distinct codes seen.
SELECT node,
       time_bucket($bucket, ts) AS bucket,
       sum(lines) AS events,
       count(*) FILTER (WHERE xid_fatal) AS fatal_events,
       string_agg(DISTINCT xid::VARCHAR, ',' ORDER BY xid::VARCHAR) AS codes
FROM xid
WHERE ts >= $since AND ts < $until
  AND ($pool IS NULL OR pool = $pool)
GROUP BY ALL
ORDER BY node, bucket;
