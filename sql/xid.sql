-- One row per NVIDIA XID record (fleet.events.xid), with its catalog meaning. A record stands
-- for `lines` kernel-log lines: the source coalesces a storm of repeats (xid_event/2 count).
CREATE OR REPLACE VIEW xid AS
SELECT x.*, coalesce(x."count", 1) AS lines, c.mnemonic, c.severity AS xid_severity, c.fatal AS xid_fatal,
       c.application AS xid_application
FROM raw_xid AS x
LEFT JOIN raw_xid_catalog AS c USING (xid);
