"""Sub-commands of the ``speculative-llm`` CLI; each module has ``add_parser`` and ``run``."""
