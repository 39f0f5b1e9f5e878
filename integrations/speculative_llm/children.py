"""Every child process the package starts, and the guard that stops it when we die.

On Linux each child gets SIGTERM from the kernel when this process dies, however it
dies (SIGKILL included), so nothing is left running without its parent: a managed
llama-server would otherwise keep a model loaded and a port open, with no API key.
The parent-death signal (``PR_SET_PDEATHSIG``) fires when the *thread* that started
the child ends, not the process; so children are started from one thread that lives as
long as the process (``_Spawner``), whichever thread asks for them. Elsewhere ``spawn``
is ``subprocess.Popen``.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

__all__ = ["run", "signal_name", "spawn"]

_PR_SET_PDEATHSIG = 1


def _set_parent_death_signal(parent_pid: int) -> None:  # pragma: no cover - in the child
    # Linux: the kernel sends SIGTERM to the child when the thread that started it ends.
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent_pid:  # the parent died before the guard was set
        os._exit(1)


_PopenRequest = tuple[Sequence[str], dict[str, Any], "Future[subprocess.Popen[Any]]"]


class _Spawner:
    """Starts child processes from one thread that lives as long as this process.

    A child's parent-death signal fires when the thread that forked it ends; a server
    started from a short-lived thread (a web app's worker, a thread pool) would lose
    its guard, or get SIGTERM as soon as that thread finished. Elsewhere than Linux,
    ``popen`` is ``subprocess.Popen``.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: queue.SimpleQueue[_PopenRequest] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._pid = 0

    def popen(self, command: Sequence[str], **options: Any) -> subprocess.Popen[Any]:
        """``subprocess.Popen(command, **options)``, run by the spawner thread."""
        if not sys.platform.startswith("linux"):
            return subprocess.Popen(command, **options)
        result: Future[subprocess.Popen[Any]] = Future()
        self._ensure_thread().put((command, options, result))
        return result.result()

    def _ensure_thread(self) -> queue.SimpleQueue[_PopenRequest]:
        with self._lock:
            # A forked child of this process has no spawner thread: it starts its own.
            if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
                self._requests = queue.SimpleQueue()
                self._pid = os.getpid()
                self._thread = threading.Thread(
                    target=self._serve, args=(self._requests,), name="child-spawner", daemon=True
                )
                self._thread.start()
            return self._requests

    @staticmethod
    def _serve(requests: queue.SimpleQueue[_PopenRequest]) -> None:
        guard = functools.partial(_set_parent_death_signal, os.getpid())
        while True:
            command, options, result = requests.get()
            try:
                process = subprocess.Popen(command, preexec_fn=guard, **options)
            except BaseException as error:
                result.set_exception(error)
            else:
                result.set_result(process)


_spawner = _Spawner()


def spawn(command: Sequence[str], **options: Any) -> subprocess.Popen[Any]:
    """Start a child process that this process's death stops (on Linux).

    Takes ``subprocess.Popen``'s options (``preexec_fn`` excepted). Every process the
    package starts goes through here.
    """
    return _spawner.popen(command, **options)


def run(
    command: Sequence[str],
    *,
    timeout: float | None = None,
    capture_output: bool = False,
    **options: Any,
) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run`` through ``spawn``: the child is guarded, and killed on any error.

    Raises:
        subprocess.TimeoutExpired: The child ran past ``timeout`` (it was killed).
    """
    if capture_output:
        options.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    with spawn(command, **options) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except BaseException:  # a timeout, Ctrl-C, SIGTERM: leave nothing running
            process.kill()
            raise
    return subprocess.CompletedProcess(list(command), process.returncode, stdout, stderr)


def signal_name(number: int) -> str:
    """``SIGSEGV`` for 11, or ``signal 99`` for a number Python does not name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
