"""Fault injection for tests: make a child process die by a signal at a named site.

A native crash (llama.cpp's AMX kernels, say) cannot be caught in-process, so code
that may crash runs in a child process and the parent must survive it. Tests prove
that without a crashing CPU: they name sites in ``SPECULATIVE_LLM_CRASH_AT``
(comma-separated) for a child's environment, and the child kills itself with SIGSEGV
when it reaches one. Sites are only placed on code paths that run in child processes.
"""

from __future__ import annotations

import os
import signal

__all__ = ["CRASH_ENV", "crash_point"]

CRASH_ENV = "SPECULATIVE_LLM_CRASH_AT"
"""Environment variable naming the sites where a child process dies (tests only)."""


def crash_point(site: str) -> None:
    """Die by SIGSEGV here when ``SPECULATIVE_LLM_CRASH_AT`` names ``site``."""
    sites = os.environ.get(CRASH_ENV)
    if sites and site in (name.strip() for name in sites.split(",")):
        os.kill(os.getpid(), signal.SIGSEGV)
