"""One process holds the in-memory state every worker must share; the others reach it
through proxies.

With ``workers: N`` on the embedded store, counters that used to live in the one
gateway process (auth throttling, provider key capacity, SigV4 replays, session pins,
breakers, the PII vault, token-count windows) must be one object, or each worker would
count on its own and N workers would allow N times the limit. The supervisor hosts the
real objects (``StateHost``); each worker holds a ``StateClient`` and one ``HostedProxy``
per object, which implements the object's Protocol by forwarding each call.

The channel is a ``socketpair`` the supervisor creates and the worker inherits at
spawn: no filesystem path and no TCP port, so no other process can connect to it. Calls
carry ids and are multiplexed on the one connection; the host runs each call to
completion before reading the next, so every hosted method stays as atomic as it was in
one process (they never suspend). Frames are a 4-byte length and a pickle: pickle is
acceptable only because both ends are our own processes on a private inherited socket;
even so, unpickling resolves only dataclasses of this package (defence in depth).

Errors keep their meaning: a hosted ``StoreUnavailable`` or ``VaultUnavailable`` is
raised again in the worker; anything else, or a host that cannot be reached, becomes
the proxy's own "unavailable" error, so callers fail closed as the spec says. Nothing
in a call (a vault value, a client address) is ever logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import itertools
import logging
import os
import pickle
import socket
import struct
from collections.abc import Callable, Mapping
from typing import Any

from portcullis.adapters.store import StoreUnavailable

log = logging.getLogger("portcullis.state")

_LENGTH = struct.Struct("!I")
MAX_FRAME = 16 * 1024 * 1024  # a frame this large is a fault, not a call: refuse before allocating

READY = "ready"  # control messages a worker sends its supervisor (call id 0)
FAILED = "failed"

# Hosted exceptions raised again as themselves in the worker (by name: no class is unpickled).
_MAPPED_ERRORS: dict[str, type[Exception]] = {"StoreUnavailable": StoreUnavailable}


def register_error(error: type[Exception]) -> None:
    """Let a hosted object's own failure (e.g. ``VaultUnavailable``) cross the channel as itself."""
    _MAPPED_ERRORS[error.__name__] = error


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        found = super().find_class(module, name)
        if module.startswith("portcullis.") and isinstance(found, type) and dataclasses.is_dataclass(found):
            return found
        if (module, name) in {("builtins", "frozenset"), ("builtins", "set")}:
            return found
        raise pickle.UnpicklingError(f"{module}.{name} may not cross the state channel")


def encode(message: Any) -> bytes:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(body)) + body


def decode(body: bytes) -> Any:
    return _Unpickler(io.BytesIO(body)).load()


async def read_frame(reader: asyncio.StreamReader) -> Any:
    """The next message, or None at end of stream."""
    try:
        header = await reader.readexactly(_LENGTH.size)
        (length,) = _LENGTH.unpack(header)
        if length > MAX_FRAME:
            raise ConnectionError(f"state channel frame of {length} bytes refused")
        return decode(await reader.readexactly(length))
    except asyncio.IncompleteReadError:
        return None


def send_blocking(sock: socket.socket, message: Any) -> None:
    """A message from code that has no event loop (a worker reporting why it failed to start)."""
    sock.setblocking(True)
    sock.sendall(encode(message))


# --- the host (in the supervisor) ---------------------------------------------------------


class Announcer:
    """Events the host sends every worker unasked (call id 0), so a worker can judge
    something locally instead of asking on every request; a worker that connects later
    first hears what each snapshot source says is still true."""

    def __init__(self) -> None:
        self._writers: set[asyncio.StreamWriter] = set()
        self._snapshots: list[Callable[[], list[tuple[Any, ...]]]] = []

    def snapshot(self, source: Callable[[], list[tuple[Any, ...]]]) -> None:
        self._snapshots.append(source)

    def announce(self, *event: Any) -> None:
        frame = encode((0, *event))
        for writer in self._writers:
            if not writer.is_closing():
                writer.write(frame)

    def joined(self, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        for source in self._snapshots:
            for event in source():
                writer.write(encode((0, *event)))

    def left(self, writer: asyncio.StreamWriter) -> None:
        self._writers.discard(writer)


class StateHost:
    """The real objects and, per object, the methods a worker may call."""

    def __init__(self, objects: Mapping[str, object], allowed: Mapping[str, frozenset[str]], announcer: Announcer | None = None) -> None:
        missing = set(objects) - set(allowed)
        if missing:
            raise ValueError(f"hosted objects without an allow-list: {sorted(missing)}")
        self._objects = dict(objects)
        self._allowed = dict(allowed)
        self._announcer = announcer or Announcer()

    def host(self, name: str, hosted: object, methods: frozenset[str]) -> None:
        """One more object, and the methods a worker may call on it."""
        self._objects[name] = hosted
        self._allowed[name] = methods

    async def serve(self, sock: socket.socket, on_control: Callable[[tuple[Any, ...]], None]) -> None:
        """Answer one worker's calls until its end closes. Control messages (call id 0:
        ready, failed) go to ``on_control``."""
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        self._announcer.joined(writer)
        try:
            while (message := await read_frame(reader)) is not None:
                call_id = message[0]
                if call_id == 0:
                    on_control(tuple(message[1:]))
                    continue
                writer.write(encode(await self.call(call_id, *message[1:])))
                if writer.transport.get_write_buffer_size() > 1 << 20:
                    await writer.drain()
        except (ConnectionError, pickle.UnpicklingError, ValueError, TypeError) as error:
            log.error("state channel to a worker closed: %s", type(error).__name__)
        finally:
            self._announcer.left(writer)
            writer.close()

    async def call(self, call_id: int, name: str, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        if method not in self._allowed.get(name, frozenset()):
            return (call_id, False, "NotAllowed", f"{name}.{method} is not a hosted method")
        try:
            return (call_id, True, await getattr(self._objects[name], method)(*args, **kwargs))
        except Exception as error:  # the worker raises it (mapped); the host keeps serving
            return (call_id, False, type(error).__name__, str(error) if type(error).__name__ in _MAPPED_ERRORS else "")


# --- the client (in each worker) ----------------------------------------------------------


class StateClient:
    """One worker's connection to the host: calls multiplexed by id, one reader task."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._lost: list[Callable[[], None]] = []
        self._listeners: list[Callable[[tuple[Any, ...]], None]] = []
        self._report = socket.socket(fileno=os.dup(sock.fileno()))  # for a report after the loop is gone

    @classmethod
    def from_fd(cls, fd: int) -> StateClient:
        return cls(socket.socket(fileno=fd))

    @property
    def connected(self) -> bool:
        return self._writer is not None and not self._writer.is_closing()

    async def connect(self) -> None:
        reader, self._writer = await asyncio.open_unix_connection(sock=self._sock)
        self._reader_task = asyncio.ensure_future(self._read(reader))

    def on_lost(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` if the host goes away (the supervisor died)."""
        self._lost.append(callback)

    def on_event(self, listener: Callable[[tuple[Any, ...]], None]) -> None:
        """Call ``listener`` with each event the host announces."""
        self._listeners.append(listener)

    def notify(self, *control: Any) -> None:
        if self.connected:
            assert self._writer is not None
            self._writer.write(encode((0, *control)))

    def report_failure(self, text: str, status: int) -> None:
        """Why start-up failed, sent when no event loop runs any more."""
        with contextlib.suppress(OSError):  # the supervisor is gone: nobody to tell
            send_blocking(self._report, (0, FAILED, text, status))

    async def call(self, name: str, method: str, args: tuple[Any, ...], kwargs: dict[str, Any], unavailable: type[Exception]) -> Any:
        if not self.connected:
            raise unavailable("the shared state host is unavailable")
        assert self._writer is not None
        call_id = next(self._ids)
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[call_id] = answer
        try:
            self._writer.write(encode((call_id, name, method, args, kwargs)))
            ok, *result = await answer
        finally:
            self._pending.pop(call_id, None)
        if ok:
            return result[0]
        kind, text = result
        mapped = _MAPPED_ERRORS.get(kind)
        if mapped is not None:
            raise mapped(text)
        raise unavailable(f"the shared state host refused {name}.{method}: {kind}")

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while (message := await read_frame(reader)) is not None:
                if message[0] == 0:
                    for listener in self._listeners:
                        listener(tuple(message[1:]))
                    continue
                answer = self._pending.get(message[0])
                if answer is not None and not answer.done():
                    answer.set_result(message[1:])
        except (ConnectionError, pickle.UnpicklingError) as error:
            log.error("state channel closed: %s", type(error).__name__)
        finally:
            if self._writer is not None:
                self._writer.close()
            lost = ConnectionError("the shared state host went away")
            for answer in self._pending.values():
                if not answer.done():
                    answer.set_exception(lost)
            for callback in self._lost:
                callback()

    async def close(self) -> None:
        self._lost.clear()  # closing on purpose is not losing the host
        if self._writer is not None:
            self._writer.close()
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader_task
        self._report.close()


class HostedProxy:
    """Stands for a hosted object: each allowed method forwards its call; ``close`` is
    local (the object belongs to the host). Any other attribute does not exist."""

    def __init__(self, client: StateClient, name: str, methods: frozenset[str], unavailable: type[Exception] = StoreUnavailable) -> None:
        self._client = client
        self._name = name
        self._methods = methods
        self._unavailable = unavailable

    def __getattr__(self, method: str) -> Any:
        if method.startswith("_") or method not in self._methods:
            raise AttributeError(f"{self._name}.{method} is not a hosted method")

        async def forward(*args: Any, **kwargs: Any) -> Any:
            try:
                return await self._client.call(self._name, method, args, kwargs, self._unavailable)
            except ConnectionError:
                raise self._unavailable("the shared state host is unavailable") from None

        return forward

    async def close(self) -> None:
        return None
