"""The models: rules ``fetch_model``, ``inspect_model`` and ``warmup``. Fetches each model into the cache and
verifies it (``sources.fetch``; one module per origin: ``download``, ``hub``, ``packages``, ``synthetic``, and what
they share, ``verify``), writing ``results/models/M/fetch.json``; reads its GGUF header into ``manifest.json``
(``manifest.inspect_gguf``); reads it into the page cache and records the residency in ``warmup.json``
(``pagecache.warm``).
"""
