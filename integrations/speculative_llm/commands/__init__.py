"""Sub-commands of the ``speculative-llm`` CLI; each has ``add_arguments`` and ``run``."""
