"""One engine worker process and its two pipes, from start to reaping.

The worker is a fresh Python running ``speculative_llm.backends.worker.child`` with this
process's ``sys.path``, started through ``children.spawn``: from the package's
long-lived spawner thread, with the parent-death signal set, so it stops when this
process dies, however that happens. It is not a ``multiprocessing`` child: the spawn
start method would re-import the caller's ``__main__`` in the worker (a script that
builds the playground at module level would start a second app there), and fork is out
of the question in a process with threads. The pipes carry ``multiprocessing.connection``
messages (pickles).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler

from speculative_llm.backends.worker.protocol import Reply, Request, Shutdown
from speculative_llm.children import spawn
from speculative_llm.errors import ConfigError

__all__ = ["INTERRUPT_SIGNAL", "EngineGone", "EngineProcess"]

logger = logging.getLogger(__name__)

# The worker imports what this process imports: its sys.path, exactly (as multiprocessing's
# spawn does), whether the package is installed, on PYTHONPATH or added at run time.
_BOOTSTRAP = (
    "import json, sys; sys.path[:] = json.loads(sys.argv.pop(1)); "
    "from speculative_llm.backends.worker.child import main; sys.exit(main(sys.argv[1:]))"
)


INTERRUPT_SIGNAL = signal.SIGUSR1
"""What the parent sends the worker to cancel its generation in flight (see ``child``).

A signal, not a message: while the worker computes a step, its parent's next request
waits for the step's reply, and the pipes carry one exchange at a time."""


class EngineGone(Exception):
    """The worker closed its end of a pipe: it died (or exited)."""


class EngineProcess:
    """A running worker: ask it one request at a time, stop it, learn how it died.

    Not thread-safe: its owner serialises the exchanges.
    """

    def __init__(
        self, process: subprocess.Popen[bytes], requests: Connection, replies: Connection
    ) -> None:
        self._process = process
        self._requests = requests
        self._replies = replies

    @classmethod
    def start(cls) -> EngineProcess:
        """Start a worker (with this process's environment and path, as they are now)."""
        child_reads, parent_writes = os.pipe()
        parent_reads, child_writes = os.pipe()
        command = [
            sys.executable,
            "-c",
            _BOOTSTRAP,
            json.dumps(sys.path),
            "--requests-fd",
            str(child_reads),
            "--replies-fd",
            str(child_writes),
        ]
        try:
            process = spawn(command, pass_fds=(child_reads, child_writes), stdin=subprocess.DEVNULL)
        except BaseException:
            for fd in (child_reads, parent_writes, parent_reads, child_writes):
                os.close(fd)
            raise
        # Only the worker may hold its ends: its death must close them (EOF here).
        os.close(child_reads)
        os.close(child_writes)
        logger.info("engine worker started (pid %d)", process.pid)
        return cls(
            process,
            Connection(parent_writes, readable=False),
            Connection(parent_reads, writable=False),
        )

    @property
    def pid(self) -> int:
        """The worker's process id."""
        return self._process.pid

    def exited(self) -> bool:
        """Whether the worker has ended (died while idle, say)."""
        return self._process.poll() is not None

    def ask(self, request: Request) -> Reply:
        """Send ``request`` and wait for its reply.

        Raises:
            ConfigError: ``request`` does not pickle (nothing was sent).
            EngineGone: The worker died before answering.
        """
        try:
            payload = ForkingPickler.dumps(request)
        except Exception as error:
            raise ConfigError(
                f"The request cannot be sent to the engine worker ({error}): its fields must "
                "be plain values (strings, numbers, lists, dicts).",
                field="request",
            ) from error
        try:
            self._requests.send_bytes(payload)
            reply: Reply = self._replies.recv()
        except (EOFError, OSError) as error:
            raise EngineGone(str(error)) from error
        return reply

    def interrupt(self) -> None:
        """Cancel the worker's generation in flight, if any, without waiting (a signal).

        Its pass in flight stops early, and the request it serves raises
        ``GenerationCancelledError``; a worker between requests ignores it. Safe to call
        from any thread, and after the worker ended.
        """
        with contextlib.suppress(OSError):
            self._process.send_signal(INTERRUPT_SIGNAL)

    def reap(self, timeout_s: float) -> int:
        """Wait for the worker to end and return its exit status (-N: killed by signal N).

        A worker that closed its pipes but keeps running is killed after ``timeout_s``.
        """
        try:
            self._process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            logger.warning("engine worker %d stopped answering: killing it", self.pid)
            self._process.kill()
            self._process.wait()
        self._close_pipes()
        return self._process.returncode

    def stop(self, timeout_s: float) -> None:
        """Ask the worker to close its engine and exit; kill it after ``timeout_s``."""
        with contextlib.suppress(OSError):
            self._requests.send(Shutdown())
        self._close_pipes()  # also its EOF: a worker busy elsewhere exits at its next read
        status = self.reap(timeout_s)
        logger.info("engine worker %d ended (status %d)", self.pid, status)

    def kill(self) -> None:
        """Kill the worker now (its state is unknown: an exchange was interrupted)."""
        with contextlib.suppress(OSError):
            self._process.kill()
        self.reap(timeout_s=5.0)

    def _close_pipes(self) -> None:
        for connection in (self._requests, self._replies):
            with contextlib.suppress(OSError):
                connection.close()
