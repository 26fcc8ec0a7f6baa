-- question: What capacity did the capacity stage publish last? Per region, zone, accelerator
-- type and provisioning model: its latest fleet.capacity snapshot in the period (healthy, free,
-- allocated, idle, out of service, quota headroom and forecast, reservations, stock-outs and
-- preemptions in the hour before it, the cost of a useful device-hour with the price it used).
-- Empty when the lake holds no snapshots (`fleetpulse capacity` then folds the other tables).
SELECT region,
       zone,
       accelerator_type,
       provisioning_model,
       devices,
       healthy,
       healthy_free,
       allocated,
       allocated_idle,
       suspect,
       out_of_service,
       quota_headroom,
       quota_limit,
       quota_exhausts_at,
       quota_confidence,
       reservations_in_use,
       reservations_reserved,
       stockouts_1h,
       preemptions_1h,
       usd_per_useful_hour,
       price_basis,
       price_location,
       ts AS as_of
FROM capacity_snapshots
WHERE ts >= $since AND ts < $until
QUALIFY row_number() OVER (
    PARTITION BY region, zone, accelerator_type, provisioning_model ORDER BY ts DESC) = 1
ORDER BY region, zone, accelerator_type, provisioning_model;
