"""A forward proxy on loopback for the credential-parity suite: HTTP CONNECT tunnels, every target recorded.

Why not a proxy from PyPI (proxy.py, mitmproxy): the suite needs a record of each CONNECT target per client
run and a host map (a made-up API server name that only the proxy resolves, to 127.0.0.1, so a client that
skips the proxy cannot reach the server at all); both need plugins there, and asyncio streams do it in a page.
Anything but CONNECT is recorded and refused (405).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading


class LoopThread:
    """An asyncio server on a thread of its own (the test proxies): ``_start_loop`` returns once ``_serve`` has
    set ``_ready``; ``_serve`` runs until ``stop`` sets ``_stop``."""

    _ready: threading.Event
    _stop: asyncio.Event
    _loop: asyncio.AbstractEventLoop
    _thread: threading.Thread

    def _start_loop(self, name: str) -> None:
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError(f"{name} did not start")

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._loop.run_until_complete(self._main())

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        await self._serve()

    async def _serve(self) -> None:
        raise NotImplementedError


class ForwardProxy(LoopThread):
    def __init__(self, hosts: dict[str, str] | None = None) -> None:
        self.hosts = dict(hosts or {})  # name -> address the proxy connects to
        self.targets: list[str] = []  # "CONNECT host:port" or "<METHOD> <target>", in arrival order
        self.port = 0
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def take(self) -> list[str]:
        """The targets recorded since the last call."""
        with self._lock:
            out, self.targets = self.targets, []
        return out

    def start(self) -> ForwardProxy:
        self._start_loop("forward-proxy")
        return self

    async def _serve(self) -> None:
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = (await reader.readline()).decode("latin-1").split()
            while (await reader.readline()).strip():  # the request's headers
                pass
            if len(request) < 2:
                return
            method, target = request[0], request[1]
            with self._lock:
                self.targets.append(f"{method} {target}")
            if method != "CONNECT":
                writer.write(
                    b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                )
                return
            host, _, port = target.rpartition(":")
            host = host.strip("[]")
            try:
                up_reader, up_writer = await asyncio.open_connection(self.hosts.get(host, host), int(port))
            except (OSError, ValueError):
                writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                return
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(OSError):
                writer.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            writer.close()
