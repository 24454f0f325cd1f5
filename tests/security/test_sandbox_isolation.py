"""From inside every sandbox backend (local bubblewrap and Docker), the same probe:

  network     only loopback; the proxy relay answers; the host's own ports (on 127.0.0.1 and
              on its other addresses), outside addresses and DNS do not;
  filesystem  writes succeed in the work dir, HOME and /tmp (private to the sandbox) and fail
              everywhere else, including read-only host mounts and the support dir;
  grader      the hidden tests and the task file are nowhere to be found;
  git         exactly one commit, one branch, no tags, remotes, stashes or fix objects;
  host        no host environment variables (API keys) and no host processes are visible.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import uuid

import pytest

from legorl_jax.sandbox import SandboxConfig, create_sandbox, images, local
from legorl_jax.tasks.schema import Task
from tests.security.conftest import repo_with_fix_in_history

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "sandbox"))
from unix_http import serve_unix  # noqa: E402

SECRET = "HIDDEN_GRADER_SECRET_41d7"
HOST_KEY = "sk-host-key-never-inside-77ab"
PROBE = r"""
import json, os, socket, subprocess, sys, urllib.request
cfg = json.loads(sys.argv[1])
out = {}
def tcp(host, port):
  s = socket.socket(); s.settimeout(2)
  try:
    return "open" if s.connect_ex((host, port)) == 0 else "closed"
  except OSError:
    return "closed"
  finally:
    s.close()
out["tcp"] = {f"{h}:{p}": tcp(h, p) for h, p in cfg["targets"]}
try:
  socket.getaddrinfo("pypi.org", 443); out["dns"] = "resolved"
except OSError:
  out["dns"] = "failed"
try:
  u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.sendto(b"x", ("8.8.8.8", 53)); out["udp"] = "sent"
except OSError:
  out["udp"] = "failed"
out["interfaces"] = sorted(n for _, n in socket.if_nameindex())
out["proxy"] = urllib.request.urlopen(cfg["proxy"] + "/v1/models", timeout=10).read().decode()
def write(p):
  try:
    with open(p, "w") as f:
      f.write("pwned")
    return "written"
  except OSError:
    return "denied"
out["writes"] = {p: write(p) for p in cfg["paths"]}
out["env_has_host_key"] = any(cfg["host_key"] in v for v in os.environ.values())
found = []
for root, dirs, files in os.walk("/"):
  if root == "/":
    dirs[:] = [d for d in dirs if d not in ("proc", "sys", "dev", "usr")]
  for name in files:
    p = os.path.join(root, name)
    if name.startswith("test_hidden") or name == "tasks.jsonl":
      found.append(p)
    try:
      with open(p, "rb") as f:
        if cfg["secret"].encode() in f.read(1 << 20):
          found.append(p)
    except OSError:
      pass
out["secret_found"] = found
def git(*a):
  return subprocess.run(["git", *a], capture_output=True, text=True).stdout
objs = subprocess.run(["git", "cat-file", "--batch-all-objects", "--batch"], capture_output=True).stdout.count(b"THE FIX")
out["git"] = {"commits": git("rev-list", "--all", "--count").strip(), "refs": git("for-each-ref", "--format=%(refname)").split(),
              "remotes": git("remote").split(), "stash": git("stash", "list"), "fix_objects": objs,
              "reflog_commits": len({l.split()[0] for l in git("reflog", "--all").splitlines()})}
procs = []
for pid in os.listdir("/proc"):
  if pid.isdigit():
    try:
      procs.append(open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace"))
    except OSError:
      pass
marker = "".join(cfg["host_marker_parts"])  # never whole on this probe's own command line
out["sees_host_processes"] = any(marker in c for c in procs)
print(json.dumps(out))
"""


def _host_ips() -> list[str]:
  r = subprocess.run(["hostname", "-I"], capture_output=True, text=True)
  return [ip for ip in r.stdout.split() if ":" not in ip and not ip.startswith("127.")]


def _docker_image():
  try:
    import docker
    client = docker.from_env(timeout=300)
    client.ping()
  except Exception as e:  # noqa: BLE001
    pytest.skip(f"no Docker engine reachable ({e}); .ci/setup_system.sh starts one")
  return images.ensure_base_image(client)


@pytest.fixture(scope="module")
def task(tmp_path_factory):
  d = tmp_path_factory.mktemp("isolation_task")
  base = repo_with_fix_in_history(str(d / "src"))
  obj = {"id": "isolation", "repo": {"type": "git", "url": str(d / "src"), "base_commit": base},
         "instruction": "x", "limits": {"memory_mb": 512, "pids": 64},
         "hidden_tests": {"tests/test_hidden.py": f"# {SECRET}\ndef test_x():\n  assert True\n"}}
  (d / "tasks.jsonl").write_text(json.dumps(obj) + "\n")  # the task file sits on the host
  return Task.from_dict(obj)


@pytest.mark.parametrize("backend", ["local", pytest.param("docker", marks=pytest.mark.docker)])
def test_inside_the_sandbox_only_the_work_dir_and_the_proxy_are_reachable(backend, task, tmp_path,
                                                                          monkeypatch):
  if backend == "local" and local.bwrap_path() is None:
    pytest.skip("bubblewrap not installed (.ci/setup_system.sh installs it)")
  image = _docker_image() if backend == "docker" else None
  monkeypatch.setenv("OPENAI_API_KEY", HOST_KEY)
  listener = socket.socket()
  listener.bind(("0.0.0.0", 0))
  listener.listen(8)
  port = listener.getsockname()[1]
  sock_dir = tmp_path / "sock"
  sock_dir.mkdir()
  os.chmod(sock_dir, 0o755)
  proxy = serve_unix(str(sock_dir / "proxy.sock"))
  ro = tmp_path / "ro_mount"
  ro.mkdir()
  os.chmod(tmp_path, 0o755)
  os.chmod(ro, 0o777)  # writable on the host, even to the sandbox's uid: only the mount protects it
  scratch = f"legorl_probe_{uuid.uuid4().hex[:8]}"
  marker = f"legorl_host_process_{uuid.uuid4().hex[:8]}"
  host_proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", marker])
  cfg = SandboxConfig(backend=backend, image=image, proxy_socket=str(sock_dir / "proxy.sock"),
                      proxy_port=18090, ro_mounts=((str(ro), "/mnt/host_ro"),))
  try:
    sb = create_sandbox(task, cfg)
    try:
      work, home = sb.workdir, sb.home
      paths = [f"{work}/ok.txt", f"{home}/ok.txt", f"/tmp/{scratch}", "/etc/pwned", "/usr/pwned",
               "/pwned", "/opt/legorl/pwned", "/run/legorl/pwned", "/mnt/host_ro/pwned", "/var/pwned",
               "/home/pwned", f"{work}/../pwned"]
      targets = [("127.0.0.1", port)] + [(ip, port) for ip in _host_ips()] + [("1.1.1.1", 53),
                                                                              ("8.8.8.8", 443)]
      probe_cfg = {"targets": targets, "proxy": sb.proxy_url, "paths": paths, "secret": SECRET,
                   "host_key": HOST_KEY, "host_marker_parts": [marker[:10], marker[10:]]}
      r = sb.exec(["python3", "-c", PROBE, json.dumps(probe_cfg)], timeout=240)
      assert r.ok, r
      out = json.loads(r.stdout)
    finally:
      sb.destroy()
  finally:
    listener.close()
    proxy.shutdown()
    host_proc.kill()
    host_proc.wait()
  assert out["proxy"] == "hello from the proxy"
  assert set(out["tcp"].values()) == {"closed"}, out["tcp"]
  assert out["dns"] == "failed" and out["udp"] == "failed"
  assert out["interfaces"] == ["lo"]
  writable = {f"{work}/ok.txt", f"{home}/ok.txt", f"/tmp/{scratch}"}
  assert {p for p, v in out["writes"].items() if v == "written"} == writable, out["writes"]
  assert os.listdir(ro) == [] and not os.path.exists(f"/tmp/{scratch}")  # nothing reached the host
  assert not any(os.path.exists(p) for p in ("/etc/pwned", "/usr/pwned", "/pwned", "/var/pwned"))
  assert out["secret_found"] == []
  assert out["git"] == {"commits": "1", "refs": ["refs/heads/main"], "remotes": [], "stash": "",
                        "fix_objects": 0, "reflog_commits": 1}
  assert out["env_has_host_key"] is False and out["sees_host_processes"] is False
  if backend == "local":
    assert not os.path.exists(sb.root)
  shutil.rmtree(sock_dir, ignore_errors=True)
