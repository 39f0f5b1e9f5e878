"""Child processes with their log copied to a file, and the lifecycle of a managed server.

A managed server is started, polled until its health endpoint answers, and stopped
with SIGTERM then SIGKILL (its whole process group): on ``stop()``, at the end of a
``with`` block (exceptions and Ctrl-C included), when the object is garbage-collected
and at interpreter exit. The commands turn SIGTERM into the same orderly stop
(``speculative_llm.shutdown``), and on Linux the kernel stops the server when this
process dies, however it dies (``speculative_llm.children``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shlex
import signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Self

import httpx

from speculative_llm import children
from speculative_llm.children import signal_name, spawn
from speculative_llm.errors import (
    BackendTimeoutError,
    BackendUnavailableError,
    ConfigError,
    EngineCrashedError,
)

__all__ = ["ManagedServer", "format_command", "free_port"]

_BIND_FAILED = re.compile(r"couldn't bind|address already in use|failed to bind", re.IGNORECASE)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


def format_command(command: Sequence[str]) -> str:
    """A command as one line a POSIX shell runs unchanged (arguments quoted)."""
    return shlex.join(str(part) for part in command)


def run_for_output(
    command: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a short command (a ``--help``) to its end and capture its output as text.

    Standard input is closed and undecodable bytes are replaced; the exit status is
    left to the caller.

    Raises:
        OSError: The command could not be run.
        subprocess.TimeoutExpired: It ran past ``timeout`` seconds.
    """
    # Through children.run: the command is guarded like a server (killed with us).
    return children.run(
        list(command),
        capture_output=True,
        text=True,
        errors="replace",
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env=env,
    )


def client_host(host: str) -> str:
    # A server listening on every interface is reached through the loopback address.
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)


def url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    # The server leads its own process group (start_new_session): signalling the group
    # also reaches its workers (vLLM's engine core), which would otherwise survive it.
    try:
        os.killpg(process.pid, signum)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signum)


def _terminate(process: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM to the server's process group, SIGKILL after ``grace_s``. Idempotent."""
    if process.poll() is None:
        _signal_group(process, signal.SIGTERM)
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            _signal_group(process, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
    # Workers left behind by a server that died on its own.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


class _ManagedProcess:
    """A child process whose output is copied line by line to a log file.

    The copy keeps the last lines in memory (for error messages) and may echo them to
    a stream. A finalizer stops the process when this object is collected or the
    interpreter exits; ``stop()`` runs it explicitly.
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        log_path: Path,
        env: Mapping[str, str] | None,
        echo: IO[str] | None,
        name: str,
        grace_s: float = 10.0,
    ) -> None:
        self.command = list(command)
        self.log_path = log_path
        self.name = name
        self.tail: deque[str] = deque(maxlen=400)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        child_env = dict(os.environ)
        if env:
            child_env.update(env)
        try:
            self.process = spawn(
                self.command,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=child_env,
                start_new_session=True,  # Ctrl-C reaches us, and we stop it in order
            )
        except OSError as error:
            raise BackendUnavailableError(
                f"Could not start {name} ({error}): {format_command(self.command)}"
            ) from error
        log_file = self.log_path.open("a", encoding="utf-8")
        self._reader = threading.Thread(
            target=_copy_output,
            args=(self.process, log_file, self.tail, echo),
            name=f"{name}-log",
            daemon=True,
        )
        self._reader.start()
        self._finalizer = weakref.finalize(self, _terminate, self.process, grace_s)

    @property
    def pid(self) -> int:
        return self.process.pid

    def poll(self) -> int | None:
        return self.process.poll()

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(list(self.tail)[-lines:])

    def log_lines(self) -> list[str]:
        return list(self.tail)

    def stop(self) -> None:
        self._finalizer()
        self._reader.join(timeout=5)


def _copy_output(
    process: subprocess.Popen[bytes],
    log_file: IO[str],
    tail: deque[str],
    echo: IO[str] | None,
) -> None:
    assert process.stdout is not None
    try:
        for raw in iter(process.stdout.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            tail.append(line)
            log_file.write(line + "\n")
            log_file.flush()
            if echo is not None:
                with contextlib.suppress(Exception):
                    echo.write(line + "\n")
                    echo.flush()
    except (OSError, ValueError):
        pass  # the pipe broke while stopping
    finally:
        log_file.close()
        with contextlib.suppress(OSError):
            process.stdout.close()


def _default_log_path(prefix: str) -> Path:
    handle, name = tempfile.mkstemp(prefix=f"{prefix}-", suffix=".log")
    os.close(handle)
    return Path(name)


def _wait_healthy(
    managed: _ManagedProcess,
    url: str,
    *,
    timeout_s: float,
    describe_exit: Callable[[int], Exception],
) -> None:
    """Poll ``url`` until it answers 200; raise early when the process dies."""
    deadline = time.monotonic() + timeout_s
    delay = 0.05
    with httpx.Client(timeout=httpx.Timeout(5.0, connect=1.0), trust_env=False) as client:
        while True:
            code = managed.poll()
            if code is not None:
                managed.stop()
                raise describe_exit(code)
            with contextlib.suppress(httpx.HTTPError):
                if client.get(url).status_code == 200:
                    return
            if time.monotonic() > deadline:
                managed.stop()
                raise BackendTimeoutError(
                    f"{managed.name} did not become healthy at {url} within {timeout_s:.0f} s. "
                    f"Raise startup_timeout if the model is large. Log: {managed.log_path}\n"
                    f"Last log lines:\n{managed.log_tail()}",
                    url=url,
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)


class ManagedServer:
    """Lifecycle of a managed server: start, wait for health, stop; a context manager.

    Subclasses give the command line (``_command``) and may check the running server
    (``_after_healthy``) or explain a failed start (``_exit_error``).
    """

    _name = "server"

    def __init__(
        self,
        *,
        host: str,
        port: int | None,
        log_path: str | os.PathLike[str] | None,
        startup_timeout: float,
        echo: IO[str] | None,
        env: Mapping[str, str] | None,
    ) -> None:
        if startup_timeout <= 0:
            raise ConfigError(
                f"startup_timeout must be > 0 seconds, got {startup_timeout}.",
                field="startup_timeout",
            )
        self.host = host
        self._requested_port = port
        self.port = port if port is not None else 0
        self.log_path = Path(log_path) if log_path is not None else None
        self.startup_timeout = startup_timeout
        self._echo = echo
        self._env = dict(env) if env else None
        self._managed: _ManagedProcess | None = None

    # -- to implement ----------------------------------------------------------------

    def _command(self, port: int) -> list[str]:
        raise NotImplementedError

    def _health_path(self) -> str:
        return "/health"

    def _child_env(self) -> dict[str, str] | None:
        return self._env

    def _after_healthy(self) -> None:
        """Checks once the server answers (speculation really enabled...)."""

    def _exit_error(self, managed: _ManagedProcess, code: int) -> Exception:
        return BackendUnavailableError(
            f"{self._name} exited with code {code} while starting. Log: {managed.log_path}\n"
            f"Last log lines:\n{managed.log_tail()}",
            url=self.base_url,
        )

    # -- lifecycle -------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """``http://host:port`` of the server (loopback when it listens everywhere)."""
        return f"http://{url_host(client_host(self.host))}:{self.port}"

    def _crash_hint(self) -> str:
        """What to try when the server died (subclasses know their engine)."""
        return "Start it again; if it keeps dying, its log says where."

    def crash_error(
        self, *, partial_text: str = "", wait_s: float = 1.0
    ) -> EngineCrashedError | None:
        """The error for a failed request when this server's process has died, else None.

        A request cut by a dying server fails before the process is reaped, so this
        waits up to ``wait_s`` for it to end. A server that is still running gives None
        (the request failed for another reason).
        """
        managed = self._managed
        if managed is None:
            return None
        try:
            code = managed.process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            return None
        tail = f"Log: {managed.log_path}\nLast log lines:\n{managed.log_tail(5)}"
        if code < 0:
            number = -code
            return EngineCrashedError(
                f"{self._name} died by {signal_name(number)} (signal {number}) while serving "
                f"{self.base_url}: a crash in its native code, not a bad request. "
                f"{self._crash_hint()} {tail}",
                signal_number=number,
                url=self.base_url,
                partial_text=partial_text,
            )
        return EngineCrashedError(
            f"{self._name} exited with status {code} while serving {self.base_url}. "
            f"{self._crash_hint()} {tail}",
            exit_code=code,
            url=self.base_url,
            partial_text=partial_text,
        )

    @property
    def running(self) -> bool:
        """Whether the server process is alive."""
        return self._managed is not None and self._managed.poll() is None

    @property
    def pid(self) -> int | None:
        """Process id of the server, None before ``start()``."""
        return None if self._managed is None else self._managed.pid

    @property
    def command(self) -> list[str]:
        """The command line the server runs with (or would run with)."""
        if self._managed is not None:
            return list(self._managed.command)
        return self._command(self.port or 8080)

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the server's log."""
        return "" if self._managed is None else self._managed.log_tail(lines)

    def start(self) -> Self:
        """Start the server and wait until it is healthy.

        Raises:
            BackendUnavailableError: The process exited while starting (log tail shown).
            BackendTimeoutError: It was not healthy within ``startup_timeout``.
        """
        if self.running:
            return self
        attempts = 3 if self._requested_port is None else 1
        for attempt in range(attempts):
            self.port = self._requested_port or free_port(client_host(self.host))
            if self.log_path is None:
                self.log_path = _default_log_path(self._name)
            managed = _ManagedProcess(
                self._command(self.port),
                log_path=self.log_path,
                env=self._child_env(),
                echo=self._echo,
                name=self._name,
            )
            self._managed = managed
            try:
                _wait_healthy(
                    managed,
                    self.base_url + self._health_path(),
                    timeout_s=self.startup_timeout,
                    describe_exit=functools.partial(self._exit_error, managed),
                )
            except Exception as error:
                port_taken = any(_BIND_FAILED.search(line) for line in managed.log_lines())
                if (
                    isinstance(error, BackendUnavailableError)
                    and port_taken
                    and attempt + 1 < attempts
                ):
                    continue  # another process took the free port first: pick another
                self._managed = None
                raise
            except BaseException:  # Ctrl-C while waiting: leave nothing running
                managed.stop()
                self._managed = None
                raise
            break
        try:
            self._after_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the server: SIGTERM, then SIGKILL after a grace period. Idempotent."""
        if self._managed is not None:
            self._managed.stop()

    close = stop

    def wait(self, timeout: float | None = None) -> int | None:
        """Block until the server process exits (or ``timeout``); returns its exit code."""
        if self._managed is None:
            return None
        try:
            return self._managed.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def _repr_fields(self) -> list[str]:
        """``name=value`` texts saying what this server serves, for ``repr``."""
        return []

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        fields = [*self._repr_fields(), f"url={self.base_url!r}", state]
        return f"{type(self).__name__}({', '.join(fields)})"

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
