"""Fault injection for tests: make a child process die by a signal at a named site.

A native crash (llama.cpp's AMX kernels, say) cannot be caught in-process, so code
that may crash runs in a child process and the parent must survive it. Tests prove
that without a crashing CPU: they name sites in ``SPECULATIVE_LLM_CRASH_AT``
(comma-separated) for a child's environment, and the child kills itself with SIGSEGV
when it reaches one. Sites are only placed on code paths that run in child processes.

``verify_delay_s`` slows the engine's verify passes down, as a busy machine would, so
that a test can check that drafting survives a slow run.
"""

from __future__ import annotations

import os
import signal

__all__ = ["CRASH_ENV", "VERIFY_DELAY_ENV", "crash_point", "verify_delay_s"]

CRASH_ENV = "SPECULATIVE_LLM_CRASH_AT"
"""Environment variable naming the sites where a child process dies (tests only)."""


def crash_point(site: str) -> None:
    """Die by SIGSEGV here when ``SPECULATIVE_LLM_CRASH_AT`` names ``site``."""
    sites = os.environ.get(CRASH_ENV)
    if sites and site in (name.strip() for name in sites.split(",")):
        os.kill(os.getpid(), signal.SIGSEGV)


VERIFY_DELAY_ENV = "SPECULATIVE_LLM_SLOW_VERIFY_S"
"""Environment variable: seconds added to every verify pass that checks a draft (tests only)."""


def verify_delay_s() -> float:
    """Seconds to add to a verify pass: ``SPECULATIVE_LLM_SLOW_VERIFY_S``, else 0.

    Read at each pass, so a test can slow one run down (as a busy CPU would) and let
    the next run go at full speed, in the same process.
    """
    value = os.environ.get(VERIFY_DELAY_ENV)
    if not value:
        return 0.0
    try:
        return max(float(value), 0.0)
    except ValueError:
        return 0.0
