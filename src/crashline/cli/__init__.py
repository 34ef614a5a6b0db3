"""The front doors: no rule of its own. ``main`` is the parser of ``python -m crashline`` (every rule runs one of
its verbs through ``scripts/job.py``) and the one way an error is printed; ``verbs`` is what each verb does (read
its inputs, call the stage, write or print); ``tune`` and ``recheck`` write a config and run the workflow in a
folder of their own; ``suggest`` prints the prediction for this machine's card; ``exits`` holds the exit statuses.
"""
