"""The configuration: reads the config file (``config/config.yaml`` or the ``--configfile``), the claims files
and the package's schemas, and checks them whole before anything runs; writes nothing (``rules/common.smk`` writes
the validated config to ``results/.crashline/config.json`` for the jobs). Callers take every config name from
``plan`` (``load``, ``validate``, ``expand``, ``plan_lines``); the checks are ``validate``, the configurations,
searches and objective ``expand``, the files and schemas ``file``, and ``claims``, ``needle``, ``source`` and
``shape`` the parts of a config that need their own words. Loading a config imports no table, HTTP or GGUF library.
"""
