"""A counting, fault-injecting HTTP proxy on loopback in front of the GCS server
(tests/gcs_server.py): every client goes through it by its own endpoint variable (`Proxy.env`,
the same list as `Server.env`), so the tests see each request as Cloud Storage would (kind,
object, bytes, time) and can make a seeded share of them fail as Cloud Storage does.

Written here rather than taken from a tool: toxiproxy works at the TCP level (these faults
need the GCS request's kind and object name: a 429 for a second write to one object within a
second is a rule about names) and its server is not on PyPI; mitmproxy could host the rules as
an addon, at the price of some 30 dependencies and its own event loop in every test run. This
is about 250 lines of the standard library.

Faults (`Faults.kinds`), each drawn with probability `rate` per eligible request (of the
`requests` kinds and `clients`), or each in turn for the `first` N of them:
  429       Too Many Requests with Retry-After: 1 (not forwarded)
  500, 503  a server error (not forwarded)
  reset     forwarded, then the connection is reset halfway through the response body
  truncate  forwarded, then the full Content-Length is announced and half the body sent
  stall     held `stall_s` seconds, then forwarded
A request to a resumable upload session that already finished is answered by the proxy with the
object, as Cloud Storage answers it (the session stays valid for a week); fake-gcs-server forgets
the session and answers 404, so a client retrying an upload whose answer was lost (a reset
or cut answer) would fail here where it succeeds on Cloud Storage. Such answers are logged with
fault 'replayed'.

And `per_object_limit`: a second write (upload, copy) to one object name within a second gets
429, as GCS's limit of about one write per second per object does; `read_only_after`: every
write after the one of a named object gets 403 (the bucket's permissions changed mid-run).
"""

from __future__ import annotations

import collections
import dataclasses
import http.client
import http.server
import json
import random
import re
import socket
import struct
import threading
import time
import urllib.parse

import gcs_server

KINDS = ("429", "500", "503", "reset", "truncate", "stall")
# User-Agent -> the library that sent the request (every client laplax uses names itself).
CLIENTS = (("gcsfs", "gcsfs"), ("gcloud-python", "google-cloud-storage"),
           ("tensorstore", "tensorstore"), ("gl-cpp", "google-cloud-cpp"))
REQUESTS = ("session", "upload", "copy", "download", "metadata", "list", "delete", "other")
_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host",
        "proxy-connection", "te", "trailer", "upgrade"}


@dataclasses.dataclass(frozen=True)
class Faults:
  rate: float = 0.0  # the share of eligible requests that fail
  kinds: tuple[str, ...] = KINDS
  requests: tuple[str, ...] = REQUESTS  # the request kinds that may fail
  clients: tuple[str, ...] | None = None  # the clients whose requests may fail (None: all)
  first: int = 0  # the first this many eligible requests fail, each of `kinds` in turn
  per_object_limit: bool = False
  read_only_after: str | None = None  # once an object whose name holds this is written, every
                                      # later write gets 403 (the bucket turned read-only)
  stall_s: float = 3.0
  seed: int = 0


@dataclasses.dataclass(frozen=True)
class Request:
  time: float  # time.monotonic() when it arrived
  method: str
  kind: str  # one of REQUESTS
  name: str  # the object's name ('' for a list or a bucket)
  sent: int  # request body bytes (what a client uploads)
  status: int  # what the store answered (0: never forwarded; a reset or cut answer still
  fault: str | None  # has the store's status: it was done there, the client did not hear)
  client: str = ""  # which library sent it (CLIENTS, from its User-Agent)


def client_of(user_agent: str) -> str:
  for mark, name in CLIENTS:
    if mark in user_agent:
      return name
  return user_agent.split("/")[0] or "?"


def _classify(method: str, url: str, body: bytes, uploads: dict[str, str]) -> tuple[str, str]:
  """(kind, object name) of a GCS JSON-API request."""
  parts = urllib.parse.urlsplit(url)
  query = urllib.parse.parse_qs(parts.query)
  path = parts.path
  if path.startswith("/upload/storage/v1/b/"):
    if "upload_id" in query:  # a resumable upload's data, to the session URL
      return "upload", query["name"][0] if "name" in query else uploads.get(
          query["upload_id"][0], "")
    # A resumable upload starts (no data yet), or a one-request upload; the name is in the
    # query or in the JSON metadata (first part of a multipart body).
    kind = "session" if query.get("uploadType") == ["resumable"] else "upload"
    if "name" in query:
      return kind, query["name"][0]
    found = re.search(rb'"name"\s*:\s*"((?:[^"\\]|\\.)*)"', body[:8192])
    return kind, json.loads(b'"' + found.group(1) + b'"') if found else ""
  m = re.match(r"/storage/v1/b/[^/]+/o/(.+?)/(?:rewriteTo|copyTo)/b/[^/]+/o/(.+)$", path)
  if m:
    return "copy", urllib.parse.unquote(m.group(2))
  m = re.match(r"/(?:download/)?storage/v1/b/[^/]+/o/(.+)$", path)
  if m:
    name = urllib.parse.unquote(m.group(1))
    if method == "DELETE":
      return "delete", name
    if method in ("GET", "HEAD"):
      return ("download" if query.get("alt") == ["media"] or path.startswith("/download/")
              else "metadata"), name
    return "other", name
  if re.match(r"/storage/v1/b/[^/]+/o/?$", path) and method == "GET":
    return "list", ""
  return "other", ""


class Proxy:
  """The proxy: `url`, `env` (every client's endpoint variable), `requests` (the log),
  `faults` (may be replaced between runs), `stop()`."""

  def __init__(self, server: gcs_server.Server, faults: Faults = Faults()):
    self.upstream = urllib.parse.urlsplit(server.url)
    self.requests: list[Request] = []
    self._lock = threading.Lock()
    self._uploads: dict[str, str] = {}  # resumable upload id -> object name
    self._completed: dict[str, tuple] = {}  # resumable upload id -> the store's final answer
    self._last_write: dict[str, float] = {}
    self.set_faults(faults)  # the rules, their random draws, _read_only, _eligible
    proxy = self

    class Handler(http.server.BaseHTTPRequestHandler):
      protocol_version = "HTTP/1.1"

      def log_message(self, *args):  # quiet
        pass

      def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
          chunks = []
          while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if not size:
              while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass
              return b"".join(chunks)
            chunks.append(self.rfile.read(size))
            self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

      def _cut(self, status: int, headers, body: bytes, announce: bool) -> None:
        self.send_response(status)
        for k, v in headers:
          self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body[:len(body) // 2])
        self.wfile.flush()
        if not announce:  # a reset: RST instead of FIN
          self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                     struct.pack("ii", 1, 0))
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)

      def _send(self, status: int, headers, body: bytes) -> None:
        self.send_response(status)
        for k, v in headers:
          self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

      def _handle(self) -> None:
        body = self._body()
        kind, name = _classify(self.command, self.path, body, proxy._uploads)
        client = client_of(self.headers.get("User-Agent", ""))
        fault = proxy._draw(kind, name, client)
        log = lambda status: proxy._log(Request(time.monotonic(), self.command, kind, name,
                                                len(body), status, fault, client))
        if fault in ("403", "429", "limit", "500", "503"):  # refused: the store never sees it
          log(0)
          status = 429 if fault in ("429", "limit") else int(fault)
          extra = [("Retry-After", "1")] if status == 429 else []
          self._send(status, extra + [("Content-Type", "application/json")], json.dumps(
              {"error": {"code": status, "message": f"injected {fault}"}}).encode())
          return
        if fault == "stall":
          time.sleep(proxy.faults.stall_s)
        session = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query).get(
            "upload_id", [None])[0]
        if session in proxy._completed:  # GCS answers a finished session with its object
          status, headers, data = proxy._completed[session]
          fault = fault or "replayed"
          log(0)
          self._send(status, headers, data)
          return
        try:
          status, headers, data = proxy._forward(self.command, self.path, self.headers, body)
        except OSError:
          log(0)
          raise
        if session and status in (200, 201):
          proxy._completed[session] = (status, headers, data)
        if kind == "session" and status < 300:
          location = dict((k.lower(), v) for k, v in headers).get("location", "")
          upload = urllib.parse.parse_qs(urllib.parse.urlsplit(location).query)
          if "upload_id" in upload:  # a resumable upload starts: its data comes later
            proxy._uploads[upload["upload_id"][0]] = name
        # Logged before the client hears back: a test reading the log after its call sees it.
        log(status)
        if fault in ("reset", "truncate"):  # done on the store, lost on the way back
          self._cut(status, headers, data, announce=fault == "truncate")
        else:
          self._send(status, headers, data)

      def handle(self):
        try:
          super().handle()
        except (BrokenPipeError, ConnectionResetError):
          pass  # the client gave up on this connection (a stall past its timeout)

      do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _handle

    self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    self._server.daemon_threads = True
    self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
    self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
    self._thread.start()

  @property
  def env(self) -> dict[str, str]:
    return gcs_server.endpoint_env(self.url)

  def set_faults(self, faults: Faults) -> None:
    """New rules from the next request on, drawn from their own seed."""
    with self._lock:
      self.faults, self._rng = faults, random.Random(faults.seed)
      self._read_only, self._eligible = False, 0

  def _log(self, request: Request) -> None:
    with self._lock:
      self.requests.append(request)
      if request.kind in ("upload", "copy") and 200 <= request.status < 300:
        self._last_write[request.name] = request.time
        marker = self.faults.read_only_after
        self._read_only = self._read_only or bool(marker and marker in request.name)

  def _draw(self, kind: str, name: str, client: str) -> str | None:
    with self._lock:
      f = self.faults
      if self._read_only and kind in ("session", "upload", "copy", "delete"):
        return "403"
      if (f.per_object_limit and kind in ("upload", "copy") and name in self._last_write
          and time.monotonic() - self._last_write[name] < 1.0):
        return "limit"
      if kind not in f.requests or (f.clients is not None and client not in f.clients):
        return None
      self._eligible += 1
      if self._eligible <= f.first:
        return f.kinds[(self._eligible - 1) % len(f.kinds)]
      if f.rate and self._rng.random() < f.rate:
        return self._rng.choice(f.kinds)
      return None

  def _forward(self, method: str, path: str, headers, body: bytes):
    conn = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port, timeout=60)
    try:
      conn.request(method, path, body=body if body or method in ("POST", "PUT", "PATCH")
                   else None,
                   headers={k: v for k, v in headers.items() if k.lower() not in _HOP})
      response = conn.getresponse()
      data = response.read()
      out = []
      mine, theirs = self.url.split("//")[1], self.upstream.netloc
      for k, v in response.getheaders():
        if k.lower() in _HOP:
          continue
        out.append((k, v.replace(theirs, mine) if k.lower() == "location" else v))
      if "json" in (response.getheader("Content-Type") or ""):  # links point back here
        data = data.replace(theirs.encode(), mine.encode())
      return response.status, out, data
    finally:
      conn.close()

  # --- what the log says -------------------------------------------------------------------

  def writes(self, prefix: str = "") -> list[Request]:
    """The writes (uploads and copies) the store carried out, of objects whose name starts
    with prefix."""
    with self._lock:
      return [r for r in self.requests if r.kind in ("upload", "copy")
              and 200 <= r.status < 300 and r.name.startswith(prefix)]

  def most_writes_in_a_second(self, prefix: str = "") -> dict[str, int]:
    """object name -> the most writes of it within any 1 s window, for the names written
    more than once in a second (what GCS answers with 429)."""
    times = collections.defaultdict(list)
    for r in self.writes(prefix):
      times[r.name].append(r.time)
    out = {}
    for name, ts in times.items():
      ts.sort()
      most = max(sum(1 for u in ts[i:] if u - t < 1.0) for i, t in enumerate(ts))
      if most > 1:
        out[name] = most
    return out

  def faulted(self, by: str = "kind") -> collections.Counter:
    """(request kind or client, fault) -> how many requests got it."""
    with self._lock:
      return collections.Counter((getattr(r, by), r.fault) for r in self.requests if r.fault)

  def stop(self) -> None:
    self._server.shutdown()
    self._server.server_close()
