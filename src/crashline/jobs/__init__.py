"""The server jobs: rules ``measure``, ``search``, ``needle`` and ``search_needle``. Each reads the model's
fetch.json and manifest.json, the server's provenance.json and its spec (``spec``: one per job, built from the
config, passed by the workflow as params; its typed parts: ``contract``; its ``run``: the job), and starts
llama-server through one lifecycle (``serve.ServerJob``). ``measure`` writes ``results/records/M/ID/measure.json``,
``server.log`` and ``telemetry.parquet`` (what it sends: ``serving``, ``conversations``, ``soak``); ``search`` writes
``results/search/M/GID/search.json`` and its probes' records (its decisions: ``search_rules``); ``needle`` writes
``needle.json`` beside a configuration's record (its trials: ``trials``, its prompts: ``haystack``) and
``search_needle`` a search's ``recall.json``.
"""
