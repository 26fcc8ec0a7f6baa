"""The lake: Parquet writer, tables, compaction, checks, the Kafka sink and DuckDB queries."""
