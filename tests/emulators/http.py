"""What the JSON-over-HTTP emulators (``compute``, ``storage``, ``models``, ``bigquery``) share: Google's error shape
and its status names, injected faults (an error answered before the request takes effect, or a reply lost after it
took effect: ``Lost``), and a threaded HTTP server on 127.0.0.1 that hands each request to the emulator's
``handle``."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

REASONS = {
    400: "invalid",
    401: "authError",
    403: "forbidden",
    404: "notFound",
    409: "alreadyExists",
    412: "conditionNotMet",
    429: "rateLimitExceeded",
    500: "backendError",
    503: "backendError",
}
# google.rpc.Code's name of each HTTP status, as the "status" of an error (https://cloud.google.com/apis/design/errors)
STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ALREADY_EXISTS",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}


class HttpError(Exception):
    """An error answer in Google's JSON shape, so the clients raise the ``google.api_core.exceptions`` class of its
    status."""

    def __init__(self, status: int, message: str, reason: str = "", info: dict | None = None, domain: str = "global"):
        super().__init__(message)
        self.status, self.message, self.reason = status, message, reason or REASONS.get(status, "error")
        self.info = info  # a google.rpc.ErrorInfo (reason, domain, metadata), sent in the error's details
        self.domain = domain  # the ``errors[].domain``

    def body(self) -> dict:
        error = {
            "code": self.status,
            "message": self.message,
            "errors": [{"message": self.message, "domain": self.domain, "reason": self.reason}],
        }
        if self.info:  # Google's error model carries it in details (https://cloud.google.com/apis/design/errors)
            error["details"] = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", **self.info}]
        return {"error": error}


@dataclass
class Fault:
    method: str
    status: int | None  # None: the emulator's own kind of failure (e.g. a quota error in an operation)
    reason: str
    message: str
    times: int = 1
    when: Callable[[dict], bool] = lambda request: True
    info: dict | None = field(default=None, kw_only=True)  # the answer's ErrorInfo (HttpError.info)
    # a lost reply: the request takes effect, then the connection is closed before any answer (``Lost``)
    lost: bool = field(default=False, kw_only=True)


@dataclass
class Cut:
    """A media answer that breaks off: ``Content-Length`` says all of ``data``, the first ``sent`` bytes of it are
    sent, and the connection is closed (the client reads those bytes, then a body shorter than it was told: a
    dropped connection, where a reset would also discard what the client had not read yet, a race a test cannot
    pin)."""

    data: bytes
    sent: int


@dataclass(frozen=True)
class Lost:
    """The answer to a request that took effect but whose reply never reaches the client: the connection is closed
    before a byte of it is sent. Cloud Storage counts "Socket timeouts and TCP disconnects" among the transient
    failures a client retries (https://cloud.google.com/storage/docs/retry-strategy, "Response"), so a retry may
    find what its first try did."""


class HttpServer:
    """Serves ``handle(http, body) -> (status, payload[, headers])`` for every method: the body as bytes; the payload
    JSON (a dict), media (bytes; a :class:`Cut` of them: sent in part, then the connection closed) or nothing
    (None). ``start()`` returns the endpoint; ``stop()`` also ends the connections clients keep open."""

    def __init__(self, handle: Callable[[BaseHTTPRequestHandler, bytes], tuple]):
        self.handle = handle
        self._server: ThreadingHTTPServer | None = None
        self._connections: set = set()
        self.endpoint = ""

    def start(self) -> str:
        handle, connections = self.handle, self._connections

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # an answer is two writes (the headers, then the body): with Nagle's algorithm the body would wait for the
            # client's (delayed) acknowledgement of the headers, some 40 ms a request on loopback
            disable_nagle_algorithm = True

            def setup(self):
                super().setup()
                connections.add(self.connection)

            def finish(self):
                connections.discard(self.connection)
                super().finish()

            def do_GET(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    status, payload, *rest = handle(self, body)
                    headers = rest[0] if rest else {}
                except HttpError as e:
                    status, payload, headers = e.status, e.body(), {}
                if isinstance(payload, Lost):
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                cut = payload if isinstance(payload, Cut) else None
                if isinstance(payload, dict):
                    data = json.dumps(payload).encode()
                    headers = {"Content-Type": "application/json; charset=UTF-8", **headers}
                else:
                    data = cut.data if cut else payload or b""
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[: cut.sent] if cut else data)
                if cut:
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)

            do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.endpoint = f"http://127.0.0.1:{self._server.server_port}"
        return self.endpoint

    def stop(self) -> None:
        for connection in list(self._connections):
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class HttpEmulator:
    """Base of an emulator that answers in ``_serve(http, body_text) -> (status, payload)``."""

    def __init__(self):
        self._http = HttpServer(self._serve)
        self.endpoint = ""

    def _serve(self, http: BaseHTTPRequestHandler, body: bytes) -> tuple:
        raise NotImplementedError

    def start(self) -> str:
        """Serve on 127.0.0.1 (a free port); the endpoint, ``http://127.0.0.1:PORT``."""
        self.endpoint = self._http.start()
        return self.endpoint

    def stop(self) -> None:
        self._http.stop()
