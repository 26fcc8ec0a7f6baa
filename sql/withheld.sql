-- One row per withheld/1 record (fleet.withheld): a proposal held back by a rule (budget,
-- caps, common cause, capacity, inventory, busy, awaiting our cordon, maintenance), the rule
-- changing, or the proposal dropped ('dropped: <why>').
CREATE OR REPLACE VIEW withheld AS
SELECT * FROM raw_withheld;
