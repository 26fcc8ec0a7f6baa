-- On-demand list price per accelerator-hour (per GPU, per TPU chip), from
-- pipeline/catalog/prices.csv with [lake.prices] config overrides first. The first row (lowest
-- priority) whose model_match regex is found in an accelerator name prices it.
CREATE OR REPLACE VIEW prices AS
SELECT * FROM raw_prices;

-- list_price('NVIDIA H100 80GB HBM3') → the USD per hour of the first matching price row.
CREATE OR REPLACE MACRO list_price(model_name) AS (
    SELECT usd_per_hour FROM prices
    WHERE regexp_matches(model_name, model_match, 'i')
    ORDER BY priority LIMIT 1
);
