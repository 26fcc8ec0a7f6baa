-- One row per capacity event (fleet.events.capacity): quota usage and changes, stock-outs,
-- queued-resource states, maintenance, preemptions. headroom: quota limit minus usage.
CREATE OR REPLACE VIEW capacity AS
SELECT *, quota_limit - quota_usage AS headroom
FROM raw_capacity;
