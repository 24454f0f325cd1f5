"""Local (bubblewrap) sandbox: escape attempts fail, the host is unchanged, nothing is left."""

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from legorl_jax.errors import SandboxError, TaskError
from legorl_jax.sandbox import SandboxConfig, create_sandbox, local
from legorl_jax.tasks.schema import Task

sys.path.insert(0, os.path.dirname(__file__))
from unix_http import serve_unix  # noqa: E402

pytestmark = pytest.mark.skipif(local.bwrap_path() is None,
                                reason="bubblewrap not installed (.ci/setup_system.sh installs it)")
SECRET = "HIDDEN_SECRET_7f3a9"
GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}


@pytest.fixture
def task(tmp_path):
  """A git task whose history (another branch, a tag) contains THE FIX; hidden tests on disk."""
  src = tmp_path / "src"
  src.mkdir()
  (src / "m.py").write_text("X = 1  # bug\n")

  def git(*a):
    return subprocess.run(["git", *a], cwd=src, env=GIT_ENV, check=True, capture_output=True, text=True).stdout
  git("init", "-q", "-b", "main")
  git("add", "-A")
  git("commit", "-q", "-m", "base")
  base = git("rev-parse", "HEAD").strip()
  git("checkout", "-q", "-b", "fix")
  (src / "m.py").write_text("X = 2  # THE FIX\n")
  git("commit", "-q", "-am", "THE FIX")
  git("tag", "fixed")
  d = {"id": "escape", "repo": {"type": "git", "url": str(src), "base_commit": base}, "instruction": "x",
       "hidden_tests": {"tests/test_hidden.py": f"# {SECRET}\ndef test_x():\n  from m import X\n  assert X == 2\n"},
       "FAIL_TO_PASS": ["tests/test_hidden.py::test_x"], "limits": {"memory_mb": 256, "pids": 48}}
  (tmp_path / "tasks.jsonl").write_text(json.dumps(d) + "\n")  # the task file sits on the host
  return Task.from_dict(d)


def _wait_no_processes(uid):
  """The kernel tears a PID namespace down asynchronously; give it a moment."""
  for _ in range(100):
    if not local.processes_of_uid(uid):
      return
    time.sleep(0.02)
  assert local.processes_of_uid(uid) == []


def _gone(sb):
  assert not os.path.exists(sb.root)
  if sb.uid is not None:
    _wait_no_processes(sb.uid)


def test_filesystem_git_and_hidden_test_escapes_fail(task, tmp_path):
  marker = tmp_path / "host_marker.txt"
  marker.write_text("original")
  sb = create_sandbox(task, SandboxConfig())
  try:
    for target in (marker, "/etc/legorl_pwned", "/usr/pwned", "/legorl_pwned"):
      r = sb.exec(f"echo pwned > {target}", timeout=30)
      assert r.exit_code != 0 and b"cannot create" in r.stderr, (target, r)
    assert sb.exec(f"ls {tmp_path}", timeout=30).exit_code != 0  # the host's files are not there
    # The hidden tests and the task file are nowhere to be found.
    r = sb.exec(f"grep -rls {SECRET} / --exclude-dir=proc --exclude-dir=sys --exclude-dir=usr "
                "--exclude-dir=dev; find / -name 'test_hidden*' -not -path '/proc/*' 2>/dev/null", timeout=120)
    assert r.stdout == b""
    # Git history has exactly one commit and no trace of the fix.
    r = sb.exec("git log --all --oneline | wc -l; git tag; git branch -a; git remote; "
                "git cat-file --batch-all-objects --batch | grep -c 'THE FIX'", timeout=30)
    assert r.stdout.split() == [b"1", b"*", b"main", b"0"], r
  finally:
    sb.destroy()
  assert marker.read_text() == "original"
  assert not any(os.path.exists(p) for p in ("/etc/legorl_pwned", "/usr/pwned", "/legorl_pwned"))
  _gone(sb)


def test_network_reaches_only_the_proxy(task, tmp_path):
  server = socket.socket()
  server.bind(("127.0.0.1", 0))
  server.listen(1)
  host_port = server.getsockname()[1]
  sock = str(tmp_path / "proxy.sock")
  srv = serve_unix(sock)
  try:
    with create_sandbox(task, SandboxConfig(proxy_socket=sock, proxy_port=18080)) as sb:
      probe = ("import socket, sys, urllib.request\n"
               f"s = socket.socket(); s.settimeout(2); print(s.connect_ex(('127.0.0.1', {host_port})))\n"
               "try:\n  socket.create_connection(('1.1.1.1', 53), timeout=2); print('net')\n"
               "except OSError: print('nonet')\n"
               f"print(urllib.request.urlopen('{sb.proxy_url}/v1/models', timeout=10).read().decode())\n")
      r = sb.exec(["python3", "-c", probe], timeout=60)
      assert r.ok, r
      assert r.stdout.decode().split("\n")[:3] == ["111", "nonet", "hello from the proxy"]
  finally:
    server.close()
    srv.shutdown()


def test_fork_bomb_and_memory_hog_are_contained(task):
  with create_sandbox(task, SandboxConfig(pids=32)) as sb:
    counter = ("import os, time\nn = 0\ntry:\n  for _ in range(500):\n    if os.fork() == 0:\n"
               "      time.sleep(60); os._exit(0)\n    n += 1\nexcept OSError:\n  pass\nprint(n)\n")
    r = sb.exec(["python3", "-c", counter], timeout=60)
    assert 0 < int(r.stdout) < 32, r
    r = sb.exec("bomb() { bomb | bomb & }; bomb; sleep 30", timeout=3)
    assert r.timed_out or b"fork" in r.stderr.lower(), r  # killed at the deadline, or starved of pids
    hog = "b = bytearray(1 << 30); print('allocated')"
    r = sb.exec(["python3", "-c", hog], timeout=30)
    assert r.exit_code != 0 and b"MemoryError" in r.stderr and b"allocated" not in r.stdout
    assert sb.exec("echo still usable", timeout=10).stdout == b"still usable\n"
  _gone(sb)


def test_exec_interface(task, tmp_path):
  with create_sandbox(task, SandboxConfig(env={"BASE_VAR": "b"})) as sb:
    r = sb.exec(["sh", "-c", "echo $HOME $BASE_VAR $EXTRA; pwd; cat"], env={"EXTRA": "e"},
                stdin=b"from stdin")
    assert r.ok and r.stdout == b"/home/agent b e\n/workspace\nfrom stdin"
    sb.write_file("sub/dir/f.txt", "content")
    assert sb.exec("cat f.txt", cwd="/workspace/sub/dir").stdout == b"content"
    out, err = tmp_path / "out.log", tmp_path / "err.log"
    r = sb.exec("echo to-out; echo to-err >&2; exit 3", stdout_path=str(out), stderr_path=str(err))
    assert (r.exit_code, r.stdout, out.read_text(), err.read_text()) == (3, b"", "to-out\n", "to-err\n")
    # A detached grandchild does not outlive the timeout.
    r = sb.exec("setsid sleep 300 & sleep 300", timeout=1)
    assert r.timed_out and 1 <= r.duration_s < 5
    if sb.uid is not None:
      _wait_no_processes(sb.uid)
    assert sb.read_file("m.py") == b"X = 1  # bug\n"
    sb.exec("ln -s /etc/shadow leak")
    with pytest.raises(SandboxError):
      sb.read_file("/etc/passwd")
    with pytest.raises(SandboxError):
      sb.read_file("leak")
    sb.write_file("m.py", "X = 2\n")
    d = sb.diff()
    assert [(c.path, c.kind) for c in d.changes] == [("leak", "added"), ("m.py", "modified"),
                                                     ("sub/dir/f.txt", "added")]


def test_bad_tasks_fail_clearly_and_leave_nothing(tmp_path):
  base = str(tmp_path / "sandboxes")
  missing = Task.from_dict({"id": "m", "repo": {"type": "dir", "path": str(tmp_path / "nope")}, "instruction": "i",
                            "hidden_tests": {"t.py": ""}})
  with pytest.raises(TaskError, match="does not exist"):
    create_sandbox(missing, SandboxConfig(base_dir=base))
  (tmp_path / "r").mkdir()
  failing_setup = Task.from_dict({"id": "s", "repo": {"type": "dir", "path": str(tmp_path / "r")}, "instruction": "i",
                                  "hidden_tests": {"t.py": ""}, "setup_commands": ["exit 7"]})
  with pytest.raises(SandboxError, match="setup command"):
    create_sandbox(failing_setup, SandboxConfig(base_dir=base))
  assert os.listdir(base) == []


def test_reaper_removes_leftovers_of_dead_owners(tmp_path):
  base = tmp_path / "sandboxes"
  dead = subprocess.Popen(["true"])
  dead.wait()
  for name, pid in (("lgdead", dead.pid), ("lgalive", os.getpid())):
    (base / name / "work").mkdir(parents=True)
    (base / name / local.MARKER).write_text(json.dumps({"owner_pid": pid, "uid": None}))
  removed = local.reap_local(str(base))
  assert removed == [str(base / "lgdead")] and os.listdir(base) == ["lgalive"]


def test_concurrent_sandboxes_are_independent(task):
  results = {}

  def run(i):
    with create_sandbox(task, SandboxConfig()) as sb:
      sb.write_file("m.py", f"X = {i}\n")
      results[i] = sb.exec("python3 -c 'from m import X; print(X)'").stdout.strip()
  threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert results == {i: str(i).encode() for i in range(4)}
