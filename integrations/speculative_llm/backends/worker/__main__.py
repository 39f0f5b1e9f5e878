"""``python -m speculative_llm.backends.worker``: the engine worker process."""

import sys

from speculative_llm.backends.worker.child import main

sys.exit(main())
