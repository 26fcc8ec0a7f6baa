-- Accelerator types as FleetPulse compares them, from pipeline/catalog/accelerators.csv: the
-- canonical type, how a source's name for it is recognised (match, a regex; the first row in
-- priority order wins), its family (types that stand in for each other) and peak dense bf16
-- TFLOPS per device, with the source of that figure.
CREATE OR REPLACE VIEW accelerator_types AS
SELECT * FROM raw_accelerator_types;

-- accelerator_type('NVIDIA H100 80GB HBM3') → 'nvidia-h100-80gb' (underscores read as dashes).
CREATE OR REPLACE MACRO accelerator_type(model_name) AS (
    SELECT type FROM accelerator_types
    WHERE regexp_matches(replace(model_name, '_', '-'), match, 'i')
    ORDER BY priority LIMIT 1
);
