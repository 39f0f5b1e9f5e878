"""``python -m speculative_llm`` runs the CLI."""

import sys

from speculative_llm.cli import main

sys.exit(main())
