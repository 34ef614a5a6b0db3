"""Records into tables, and the answer. Rule ``aggregate`` reads every measure.json and search.json and writes
``results/tables/configs``, ``measurements``, ``searches`` and ``conversations`` (``aggregate.write``; each as
Parquet, CSV and JSON: ``files``); rule ``needle_table`` reads every needle.json and recall.json and writes
``results/tables/needle`` (``needle.write_table``). The recommendation is ``recommend.decide`` (ties: ``ties``;
what a row differs in: ``difference``); ``boundary``, ``claims``, ``recheck``, ``compare`` and ``reply`` are the
further readings of the tables that the report, ``crashline compare`` and ``crashline tune`` print.
"""
