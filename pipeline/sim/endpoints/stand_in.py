"""What the HTTP stand-ins share: a threaded server started and stopped once, and page tokens.

The stand-ins (dcgm-exporter, Compute Engine, the metadata server, the TPU API) each speak a
real protocol; this module holds only their plumbing, so each file is its protocol.
"""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self


class HttpStandIn:
    """A ThreadingHTTPServer on a daemon thread: `start()`/`stop()` or `with`."""

    thread_name = "stand-in"

    def _listen(self, host: str, port: int, handler: type[BaseHTTPRequestHandler]) -> None:
        self.host = host
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> Self:
        self._thread = threading.Thread(
            target=self._server.serve_forever, name=f"{self.thread_name}-{self.port}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def page_token(offset: int, scope: str) -> str:
    """An opaque token for the next page of the list named by `scope` (a path or parent)."""
    return base64.urlsafe_b64encode(json.dumps({"o": offset, "p": scope}).encode()).decode()


def page_offset(token: str, scope: str, field: str) -> int:
    """Where a page token points; ValueError naming `field` (as the real API words it) when the
    token is not one of ours or belongs to another list."""
    if not token:
        return 0
    try:
        fields = json.loads(base64.urlsafe_b64decode(token.encode()))
        offset, same = int(fields["o"]), fields["p"] == scope
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"Invalid value for field '{field}': {token!r}") from None
    if not same:
        raise ValueError(f"Invalid value for field '{field}': it belongs to another list")
    return offset
