"""The report: rule ``report`` reads the tables, ``results/validity/llama-bench.json``, the server's
provenance.json, the claims files and the models' manifests, and writes ``results/report.md``, ``report.html``,
``recommendation.json``, ``summary.md`` and ``figures/`` (``build.render``). What each part says is worked out in
``build`` and its helpers (``rows``, ``suspects``, ``searches``, ``cost``, ``failed``), laid out once as plain data
(``doc``; ``sections``, ``model_sections``, ``serving_sections``, ``needle``, ``correction``), drawn (``figures``,
``memory_figures``, ``drawing``) and printed as Markdown (``markdown``) and HTML (``html``). ``compare`` is the
page of ``crashline compare``; ``not_made`` says why ``snakemake --report`` cannot pack a run.
"""
