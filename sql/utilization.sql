-- One row per device per utilization window (fleet.utilization). hours: the window's length in
-- hours, so sum(hours) is device-hours; window_end: when the window closed in event time.
CREATE OR REPLACE VIEW utilization AS
SELECT *,
       window_start + to_seconds(window_s) AS window_end,
       window_s::DOUBLE / 3600 AS hours
FROM raw_utilization;
