"""DuckDB views over the lake and canned analyses, one query per file; shipped as package data."""
