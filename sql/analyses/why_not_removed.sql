-- question: Why was this node or slice not cordoned (or drained, repaired)? Every rule that
-- held back a proposal for --param target=NAME (a name or cluster/name) before the end of the
-- period, in order: the action proposed, the rule and its numbers, the checks behind it, and
-- whether an action for the proposal went out later (acted_at, dry run or not). Without a
-- target, every target's.
WITH acted AS (
    SELECT proposal_id, min(ts) AS acted_at, bool_and(dry_run) AS acted_dry_run
    FROM actions
    GROUP BY proposal_id
)
SELECT w.ts,
       w.target_cluster,
       w.target_name,
       w.kind,
       w.reason,
       w.detail,
       array_to_string(w.checks, ',') AS checks,
       w.fatal,
       a.acted_at,
       a.acted_dry_run,
       w.proposal_id,
       w.withheld_id
FROM withheld AS w
LEFT JOIN acted AS a USING (proposal_id)
WHERE w.ts < $until
  AND ($target IS NULL OR $target IN (w.target_name, w.target_cluster || '/' || w.target_name))
ORDER BY w.ts, w.proposal_id, w.reason;
