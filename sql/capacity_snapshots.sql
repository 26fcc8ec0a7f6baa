-- One row per capacity snapshot (fleet.capacity, capacity_snapshot/1): per region, zone,
-- accelerator type and provisioning model, as the capacity stage published it (every key again
-- each capacity.snapshot_interval_s, and on change). out_of_service: the sum of its reasons.
CREATE OR REPLACE VIEW capacity_snapshots AS
SELECT *,
       out_of_service_cordoned + out_of_service_draining + out_of_service_repairing
           + out_of_service_maintenance + out_of_service_silent AS out_of_service
FROM raw_capacity_snapshots;
