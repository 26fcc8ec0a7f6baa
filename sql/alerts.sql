-- One row per alert notification (fleet.alerts), firing or resolved.
CREATE OR REPLACE VIEW alerts AS
SELECT * FROM raw_alerts;
