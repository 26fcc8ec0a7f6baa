-- One row per NVIDIA XID kernel-log event (fleet.events.xid), with its catalog meaning.
CREATE OR REPLACE VIEW xid AS
SELECT x.*, c.mnemonic, c.severity AS xid_severity, c.fatal AS xid_fatal,
       c.application AS xid_application
FROM raw_xid AS x
LEFT JOIN raw_xid_catalog AS c USING (xid);
