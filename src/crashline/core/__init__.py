"""What every stage shares, the lowest folder: it imports no other. Where each output lives under the results
folder (``paths``: ``Layout``, ``SearchFolder``), the record kinds and their versions (``records``: ``write``,
``load``), the tables' columns (``columns``), atomic writes (``atomic``), the server settings and configuration ids
(``settings``, ``serverflags``), the host (``host``, ``cpufeatures``), a job's lease on its GPUs (``locks``), folders
that are the user's own (``owned``), progress lines (``progress``), a job that ends with its workflow
(``supervision``), what changed in a job's inputs (``changes``), statistics, units and thresholds, and the base of
crashline's errors (``errors``). It runs no rule and writes no file of its own; every stage above writes through it.
"""
