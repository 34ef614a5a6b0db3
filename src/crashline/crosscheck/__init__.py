"""The cross-check: llama-bench, llama.cpp's own benchmark, measured beside crashline's answer. Rule
``validity`` (and ``crashline validity``) runs after ``tables/`` has chosen each model's recommended configuration:
it reads the configs, measurements and needle tables, the server's provenance.json and each model's fetch.json, runs
llama-bench at the same settings and depths, and writes ``results/validity/llama-bench.json``: crashline's prefill
and decode against llama-bench's, with the ratios flagged beyond ``validity.TOLERANCE`` (``validity.job``). The
report reads it (``report.rows.validity_rows``).
"""
