-- One row per finding (fleet.findings): a detector's verdict on a GPU, TPU chip, ICI link,
-- node or slice. Heartbeats (check = 'heartbeat') only say a target reported.
CREATE OR REPLACE VIEW findings AS
SELECT * FROM raw_findings;
