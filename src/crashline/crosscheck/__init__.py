"""The cross-check stage: llama-bench, llama.cpp's own benchmark, measured beside crashline's answer.

It runs after ``tables/`` has chosen each model's recommended configuration (``validity.job``, the workflow's
``validity`` rule and ``crashline validity``), runs llama-bench at the same settings and depths, and writes
``validity/llama-bench.json``: crashline's prefill and decode against llama-bench's, with the ratios flagged beyond
``validity.TOLERANCE``. The report reads it (``report/rows.validity_rows``).
"""
