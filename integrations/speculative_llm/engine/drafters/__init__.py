"""What proposes the tokens a verify pass checks: one module per drafter.

* ``base``: the ``Drafter`` protocol, its ``Draft``, ``DrafterBase`` and ``DrafterHost``.
* ``ngram``: prompt lookup (``method="ngram"``).
* ``suffix``: suffix decoding over the prompt and earlier outputs (``method="suffix"``).
* ``draft_model``: a smaller model of the target's vocabulary (``method="draft_model"``).
* ``host``: ``BackendDrafterHost``, what a ``LocalBackend`` keeps for its drafters.
* ``vocabulary``: whether a draft model's vocabulary is the target's, read from files.

Each drafter is registered by name in ``speculative_llm.drafter_registry``, which imports
its module when a request first asks for it.
"""

__all__: list[str] = []
