-- One row per NVIDIA XID record (fleet.events.xid), with its catalog meaning. A record stands
-- for `lines` kernel-log lines: the source coalesces a storm of repeats (xid_event/2 count).
-- A source that restarts reads the lines after its checkpoint again and may coalesce them into
-- other records than it sent before (a backlog read at once makes longer windows): a record
-- whose lines another record of the same GPU, Xid, process and text spans with more lines is
-- those lines sent again, and is left out, so no line counts twice.
CREATE OR REPLACE VIEW xid AS
WITH spans AS (
    SELECT *, coalesce("count", 1) AS _lines, greatest(ts, coalesce(last_ts, ts)) AS _end
    FROM raw_xid
)
SELECT x.* EXCLUDE (_lines, _end), x._lines AS lines, c.mnemonic, c.severity AS xid_severity,
       c.fatal AS xid_fatal, c.application AS xid_application
FROM spans AS x
LEFT JOIN raw_xid_catalog AS c USING (xid)
WHERE NOT EXISTS (
    SELECT 1 FROM spans AS y
    WHERE y.cluster = x.cluster AND y.node = x.node AND y.pci_bus_id = x.pci_bus_id
      AND y.xid = x.xid AND y.pid IS NOT DISTINCT FROM x.pid
      AND y.process IS NOT DISTINCT FROM x.process AND y.message = x.message
      AND y.ts <= x.ts AND y._end >= x._end AND y._lines > x._lines
);
