"""Docker sandbox against a real engine: same rewards as the local backend, escapes contained.

The base image is built once (debootstrap + docker import, cached by content hash); each
test here starts as few containers as it can (~1 s each).
"""

import os
import socket
import subprocess
import sys
import time

import pytest

from legorl_jax.errors import TaskError
from legorl_jax.rewards import status as st
from legorl_jax.rewards.verifier import verify
from legorl_jax.sandbox import SandboxConfig, base, create_sandbox, images
from legorl_jax.sandbox.local import bwrap_path
from legorl_jax.tasks.schema import Task
from legorl_jax.taskgen.synthetic import generate_tasks

sys.path.insert(0, os.path.dirname(__file__))
from unix_http import serve_unix  # noqa: E402

pytestmark = pytest.mark.docker


def _engine():
  try:
    import docker
    client = docker.from_env(timeout=300)
    client.ping()
    return client
  except Exception as e:  # noqa: BLE001
    pytest.skip(f"no Docker engine reachable ({e}); run .ci/setup_system.sh as root to install and start one")


@pytest.fixture(scope="module")
def client():
  return _engine()


@pytest.fixture(scope="module")
def image(client):
  return images.ensure_base_image(client)


@pytest.fixture(scope="module")
def tasks():
  return generate_tasks(2, seed=3)


def _ours(client):
  """This process's sandbox containers (another xdist worker's come and go meanwhile)."""
  owner = f"{socket.gethostname()}:{os.getpid()}"
  return client.containers.list(all=True, filters={"label": [base.LABEL, f"legorl.owner={owner}"]})


def _cfg(image, **kw):
  return SandboxConfig(backend="docker", image=image, **kw)


def test_image_is_cached_by_content_hash(client, image):
  t0 = time.perf_counter()
  assert images.ensure_base_image(client) == image
  assert time.perf_counter() - t0 < 2.0
  assert image.endswith(images.recipe_hash("bookworm", ("python3", "git"), "minbase", None))


def test_same_reward_as_local_backend(client, image, tasks):
  before = {c.id for c in _ours(client)}
  for task in tasks:
    visible = [p for p in task.verifier.test_files if p not in task.hidden_tests][0]
    actions = {"gold": lambda sb: sb.apply_patch(task.gold_patch), "none": lambda sb: None,
               "hack": lambda sb: sb.exec(f"rm {visible}")}
    expected = {"gold": (st.SOLVED, 1.0), "none": (st.FAILED, 0.0), "hack": (st.REWARD_HACK, 0.0)}
    backends = ["docker"] + (["local"] if bwrap_path() else [])
    for name, action in actions.items():
      results = []
      for backend in backends:
        cfg = _cfg(image) if backend == "docker" else SandboxConfig()
        with create_sandbox(task, cfg) as sb:
          action(sb)
          res = verify(sb)
        results.append((res.status, res.reward, res.fail_to_pass, res.pass_to_pass))
      assert results[0][:2] == expected[name], (task.id, name, results[0])
      assert all(r == results[0] for r in results), (task.id, name, results)
  assert {c.id for c in _ours(client)} == before


def test_escapes_fail_and_nothing_is_left(client, image, tasks, tmp_path):
  task = tasks[0]
  server = socket.socket()
  server.bind(("0.0.0.0", 0))
  server.listen(1)
  port = server.getsockname()[1]
  sock = str(tmp_path / "proxy.sock")
  srv = serve_unix(sock)
  marker = tmp_path / "marker"
  marker.write_text("original")
  try:
    sb = create_sandbox(task, _cfg(image, proxy_socket=sock, proxy_port=18081, pids=40, memory_mb=256,
                                    ro_mounts=(str(tmp_path),)))
    name = sb.container.name
    try:
      # Writing outside the work dir: read-only root, read-only host mounts.
      for target in ("/etc/pwned", "/usr/pwned", "/pwned", str(marker)):
        r = sb.exec(f"echo pwned > {target}", timeout=30)
        assert r.exit_code != 0, (target, r)
      # The hidden tests are not in the container; git history has one commit.
      secret = next(iter(task.hidden_tests))
      r = sb.exec(f"find / -path /proc -prune -o -name '{os.path.basename(secret)}' -print; "
                  "git log --all --oneline | wc -l; git remote | wc -l", timeout=60)
      assert r.stdout.split() == [b"1", b"0"], r
      # Only the proxy is reachable.
      probe = ("import socket, urllib.request\nres = []\n"
               f"for host in ('127.0.0.1', '172.17.0.1', '10.0.2.2'):\n"
               "  s = socket.socket(); s.settimeout(1)\n"
               f"  try:\n    s.connect((host, {port})); res.append('open')\n"
               "  except OSError:\n    res.append('closed')\n"
               f"print(res, urllib.request.urlopen('{sb.proxy_url}/x', timeout=10).read().decode())\n")
      r = sb.exec(["python3", "-c", probe], timeout=60)
      assert r.stdout.decode().strip() == "['closed', 'closed', 'closed'] hello from the proxy", r
      # Fork bomb and memory hog.
      counter = ("import os, time\nn = 0\ntry:\n  for _ in range(500):\n    if os.fork() == 0:\n"
                 "      time.sleep(60); os._exit(0)\n    n += 1\nexcept OSError:\n  pass\nprint(n)\n")
      r = sb.exec(["python3", "-c", counter], timeout=60)
      assert 0 < int(r.stdout) < 40, r
      sb.kill_all()
      r = sb.exec("bomb() { bomb | bomb & }; bomb; sleep 30", timeout=3)
      assert r.timed_out or b"fork" in r.stderr.lower(), r  # killed at the deadline, or starved of pids
      sb.kill_all()
      r = sb.exec(["python3", "-c", "b = bytearray(1 << 30); print('allocated')"], timeout=60)
      assert r.exit_code != 0 and b"allocated" not in r.stdout, r
      assert sb.exec("echo alive", timeout=30).stdout == b"alive\n"
    finally:
      sb.destroy()
  finally:
    server.close()
    srv.shutdown()
  assert marker.read_text() == "original"
  assert name not in {c.name for c in _ours(client)}


def test_exec_files_and_diff(image, tasks, tmp_path):
  with create_sandbox(tasks[1], _cfg(image)) as sb:
    r = sb.exec(["sh", "-c", "echo $HOME $EXTRA; pwd; id -u; cat"], env={"EXTRA": "e"}, stdin=b"in")
    assert r.stdout == b"/home/agent e\n/workspace\n1000\nin", r
    out = tmp_path / "out.log"
    r = sb.exec("echo streamed; exit 4", stdout_path=str(out))
    assert (r.exit_code, out.read_text()) == (4, "streamed\n")
    r = sb.exec("setsid sleep 300 & sleep 300", timeout=1)
    assert r.timed_out and r.duration_s < 15
    sb.write_file("new/file.txt", "hello")
    assert sb.read_file("new/file.txt") == b"hello"
    assert sb.exec("cat new/file.txt").stdout == b"hello"
    assert [(c.path, c.kind) for c in sb.diff().changes] == [("new/file.txt", "added")]


def test_bad_image_and_reaper(client, image, tasks):
  bad = Task.from_dict({**tasks[0].to_dict(), "image": "legorl/does-not-exist:1"})
  before = {c.id for c in _ours(client)}
  with pytest.raises(TaskError, match="not available"):
    create_sandbox(bad, _cfg(None))
  assert {c.id for c in _ours(client)} == before
  # A container left by a dead owner is removed by the reaper.
  dead = subprocess.Popen(["true"])
  dead.wait()
  c = client.containers.create(image, ["sleep", "60"], labels={base.LABEL: "1",
                                                             "legorl.owner": f"{socket.gethostname()}:{dead.pid}"})
  from legorl_jax.sandbox.docker_sandbox import reap_docker
  assert c.name in reap_docker(client)
  assert c.id not in {x.id for x in client.containers.list(all=True, filters={"label": base.LABEL})}
