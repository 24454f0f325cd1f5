"""A tiny HTTP server on a Unix socket, standing in for the proxy in sandbox tests."""

import http.server
import os
import socketserver
import threading


class _Handler(http.server.BaseHTTPRequestHandler):
  def do_POST(self):  # noqa: N802 - http.server's naming
    body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
    self._reply(b"echo:" + body)

  def do_GET(self):  # noqa: N802
    self._reply(b"hello from the proxy")

  def _reply(self, data):
    self.send_response(200)
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data)

  def address_string(self):
    return "unix"

  def log_message(self, *args):
    pass


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
  daemon_threads = True


def serve_unix(path):
  """Starts the server on ``path`` (world-connectable); returns it (call .shutdown())."""
  srv = _Server(path, _Handler)
  os.chmod(path, 0o777)
  threading.Thread(target=srv.serve_forever, daemon=True).start()
  return srv
