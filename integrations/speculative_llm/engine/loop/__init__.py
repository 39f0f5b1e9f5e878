"""The decoding loop and what it consults; no I/O.

* ``engine``: prefill, draft, verify, crop: a generator of ``StepResult`` per target pass.
* ``sampling``: the exact acceptance rule (greedy, and speculative sampling's min(1, p/q)).
* ``session``: one request's speculation (drafter, draft-length policy, statistics).
* ``steps``: what one target pass did (``StepResult``).
* ``request_stats``: one request's running counts and its ``SpecStats``.
* ``draft_length``: how long a draft to ask for and how much of it to verify.
* ``draft_cost``: what a verify row and a draft cost, and the acceptance learned per position.
* ``pass_costs``: a model's pass costs, measured once per model and machine.
* ``chunks``: a prepared request run as chunks (text cut at stop strings, statistics).
"""

__all__: list[str] = []
