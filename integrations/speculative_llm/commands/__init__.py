"""Sub-commands of the ``speculative-llm`` CLI; each has ``add_arguments`` and ``run``.

``local_engine`` is no sub-command: it holds the arguments of the in-process engine that
``generate``, ``bench`` and ``playground`` share.
"""
