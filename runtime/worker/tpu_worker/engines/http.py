"""A small HTTP client for an OpenAI-compatible engine: JSON calls and server-sent event streams
that a cancel token can cut at any moment, over TCP (an operator-run server) or a Unix domain
socket (the server the worker starts: vllm_process.py). Stdlib only: the worker's environment
stays as it is."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ..cancel import CancelToken
from ..errors import Cancelled


class EngineHttpError(Exception):
    """The engine answered with an error status or could not be reached."""

    def __init__(self, status: int | None, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over a Unix domain socket (the Host header says "localhost")."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


@dataclass(frozen=True)
class Endpoint:
    url: str  # http://host:port, no path (with `uds`: only the scheme counts)
    key: str | None
    uds: str | None = None  # the path of the server's Unix domain socket, instead of host:port

    def _conn(self, timeout: float) -> http.client.HTTPConnection:
        if self.uds is not None:
            return _UnixConnection(self.uds, timeout)
        parts = urlsplit(self.url)
        if parts.scheme == "https":
            return http.client.HTTPSConnection(parts.hostname or "", parts.port or 443, timeout=timeout)
        return http.client.HTTPConnection(parts.hostname or "", parts.port or 80, timeout=timeout)

    def _headers(self, body: bool) -> dict[str, str]:
        h = {"Accept": "application/json"}
        if body:
            h["Content-Type"] = "application/json"
        if self.key:
            h["Authorization"] = f"Bearer {self.key}"
        return h

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
        conn = self._conn(timeout)
        try:
            conn.request("GET", path, headers=self._headers(False))
            resp = conn.getresponse()
            return resp.status, resp.read(1 << 20)
        except (OSError, http.client.HTTPException) as exc:
            raise EngineHttpError(None, f"{type(exc).__name__}") from None
        finally:
            conn.close()

    def get_json(self, path: str, timeout: float = 5.0) -> Any:
        status, body = self.get(path, timeout)
        if status != 200:
            raise EngineHttpError(status, _error_text(body))
        return json.loads(body)

    def post(self, path: str, payload: dict, timeout: float = 5.0) -> int:
        """POSTs `payload` and returns the status (the body is read and dropped)."""
        conn = self._conn(timeout)
        try:
            conn.request("POST", path, body=json.dumps(payload).encode(), headers=self._headers(True))
            resp = conn.getresponse()
            resp.read(1 << 16)
            return resp.status
        except (OSError, http.client.HTTPException) as exc:
            raise EngineHttpError(None, f"{type(exc).__name__}") from None
        finally:
            conn.close()

    def stream(
        self,
        path: str,
        payload: dict,
        token: CancelToken,
        timeout: float = 600.0,
        headers: dict[str, str] | None = None,
        on_cancel: Callable[[], None] | None = None,
    ) -> Iterator[dict]:
        """POSTs `payload` and yields each `data:` event as a dict until `[DONE]`. A cancel on
        `token` shuts the socket down and raises Cancelled here; so does closing the generator.
        Nothing is sent once the token is cancelled. Closing the socket alone does not always
        stop the request in vLLM (see VllmEngine.stream): `on_cancel` runs on the watcher right
        after the socket is shut, so the caller can abort it there, even while the thread that
        reads the stream is held up elsewhere."""
        conn = self._conn(timeout)
        done = threading.Event()
        # The request's socket once sent: a response that closes the connection at its end
        # (HTTP/1.0, "Connection: close") takes it from conn.sock, which is then None.
        sent: list[socket.socket] = []

        def watch() -> None:
            while not token.wait(0.05):
                if done.is_set():
                    return
            # Cancelled: shut the socket as soon as there is one (a cancel that lands while it
            # connects must still cut it), until the stream ends here.
            while not done.is_set():
                sock = conn.sock or (sent[0] if sent else None)
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
                    if on_cancel is not None:
                        on_cancel()
                    return
                done.wait(0.01)

        watcher = threading.Thread(target=watch, name="engine-cancel", daemon=True)
        watcher.start()
        try:
            token.check()  # a call cancelled before it started sends nothing
            try:
                conn.request(
                    "POST", path, body=json.dumps(payload).encode(), headers={**self._headers(True), **(headers or {})}
                )
                if conn.sock is not None:
                    sent.append(conn.sock)
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                token.check()
                raise EngineHttpError(None, f"{type(exc).__name__}") from None
            if resp.status != 200:
                raise EngineHttpError(resp.status, _error_text(resp.read(1 << 16)))
            while True:
                try:
                    line = resp.readline(1 << 22)
                except (OSError, http.client.HTTPException) as exc:
                    token.check()
                    raise EngineHttpError(None, f"{type(exc).__name__}") from None
                if not line:
                    token.check()
                    raise EngineHttpError(None, "the engine closed the stream before it finished")
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    return
                event = json.loads(data)
                if isinstance(event, dict) and "error" in event and "choices" not in event:
                    raise EngineHttpError(None, _error_text(data))
                yield event
                if token.cancelled:
                    raise Cancelled()
        finally:
            done.set()
            conn.close()


def _error_text(body: bytes) -> str:
    """The engine's own error message, short (it is logged, never sent to the agent raw)."""
    try:
        obj = json.loads(body)
        err = obj.get("error", obj) if isinstance(obj, dict) else obj
        msg = err.get("message") if isinstance(err, dict) else None
        if msg is None and isinstance(obj, dict):
            msg = obj.get("detail") or obj.get("message")
        return str(msg or err)[:500]
    except (ValueError, AttributeError):
        return body[:500].decode("utf-8", "replace")
