-- One row per action (fleet.actions): what was decided for a node or slice and why.
CREATE OR REPLACE VIEW actions AS
SELECT * FROM raw_actions;
