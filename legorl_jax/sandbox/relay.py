"""TCP → Unix-socket relay: how a sandbox with no network reaches the proxy.

The sandbox has only a loopback interface. This script runs inside it, listens on
``127.0.0.1:PORT`` and forwards every connection, byte for byte, to the proxy's Unix socket
that is bind-mounted into the sandbox. Standalone and stdlib-only: it runs under whatever
``python3`` the sandbox image has.

  python3 relay.py --listen 127.0.0.1:8080 --unix /run/legorl/proxy.sock [--ready-file F]
"""

import argparse
import os
import socket
import sys
import threading


def pump(src, dst):
  """Copies ``src`` to ``dst`` until EOF, then half-closes ``dst`` (also used by
  ``rollout.ray_worker``'s forwarder)."""
  try:
    while True:
      data = src.recv(65536)
      if not data:
        break
      dst.sendall(data)
  except OSError:
    pass
  finally:
    try:
      dst.shutdown(socket.SHUT_WR)
    except OSError:
      pass


def _serve_one(client, unix_path):
  upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
  try:
    upstream.connect(unix_path)
  except OSError as e:
    sys.stderr.write(f"relay: cannot reach {unix_path}: {e}\n")
    client.close()
    upstream.close()
    return
  t = threading.Thread(target=pump, args=(upstream, client), daemon=True)
  t.start()
  pump(client, upstream)
  t.join()
  client.close()
  upstream.close()


def main(argv=None):
  ap = argparse.ArgumentParser(description="TCP to Unix-socket relay")
  ap.add_argument("--listen", default="127.0.0.1:8080", help="HOST:PORT to listen on")
  ap.add_argument("--unix", required=True, help="Unix socket to forward to")
  ap.add_argument("--ready-file", default=None, help="created once listening")
  args = ap.parse_args(argv)
  host, _, port = args.listen.rpartition(":")
  srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
  srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
  srv.bind((host or "127.0.0.1", int(port)))
  srv.listen(128)
  if args.ready_file:
    with open(args.ready_file + ".tmp", "w") as f:
      f.write(str(os.getpid()))
    os.replace(args.ready_file + ".tmp", args.ready_file)
  # Small stacks: under a tight memory limit (RLIMIT_DATA counts thread stacks) the default
  # 8 MiB per thread would leave accepted connections hanging with no thread to serve them.
  threading.stack_size(256 << 10)
  while True:
    client, _ = srv.accept()
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
      threading.Thread(target=_serve_one, args=(client, args.unix), daemon=True).start()
    except RuntimeError as e:  # no memory for a thread: refuse this one, never leave it hanging
      sys.stderr.write(f"relay: cannot serve a connection: {e}\n")
      client.close()


if __name__ == "__main__":
  sys.exit(main())
