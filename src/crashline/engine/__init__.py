"""llama-server and what runs beside it. Rule ``provision_server``: finds or builds the server
(``provision.provide``), proves it runs (``servercheck``) and writes ``results/server/provenance.json``. The rest is
what the server jobs run with: the process (``server.ServerProcess``, its memory
cgroup ``hostmem``), the requests (``workloads``), telemetry (``telemetry.Sampler``), the VRAM ballast
(``ballast``), the log (``logparse``), the bottleneck (``bottleneck``), the planner's arithmetic (``planner``), the
run's ETA (``eta``: the plan the workflow writes to ``results/logs/run-plan.json``) and ``crashline suggest``'s
prediction (``suggest``, its checked inputs ``suggest_inputs``).
"""
