"""Backends in a worker process: an engine's native crash does not take its caller down.

``WorkerBackend`` builds a backend of the registry in a worker process (a fresh Python
running ``child.main``) and forwards requests to it. A worker
killed by a signal (a segfault in llama.cpp's kernels) becomes ``EngineCrashedError``
for the request in flight, and the next request starts a fresh worker. The playground
runs its local engines this way.
"""

from speculative_llm.backends.worker.backend import WorkerBackend

__all__ = ["WorkerBackend"]
