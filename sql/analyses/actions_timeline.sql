-- question: What did FleetPulse decide, when, and why? Every action in the period in time
-- order: kind, target, whether it was a dry run, the checks behind it and its summary.
SELECT ts,
       kind,
       target_kind,
       target_name,
       target_pool,
       target_zone,
       dry_run,
       array_to_string(reason_checks, ',') AS checks,
       reason_summary,
       action_id
FROM actions
WHERE ts >= $since AND ts < $until
  AND ($pool IS NULL OR target_pool = $pool)
ORDER BY ts, target_name, kind;
