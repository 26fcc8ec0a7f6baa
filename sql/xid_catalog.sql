-- The XID catalog (pipeline/catalog/xid.csv): what each code means and what it calls for.
CREATE OR REPLACE VIEW xid_catalog AS
SELECT * FROM raw_xid_catalog;
