"""Untrusted input: adversarial task repositories, task files, configs and harness output.

Each bad input is refused with an error that names the offending entry and says how to fix
it, nothing is written outside where it belongs, and nothing else is dropped (the other task
lines, the other trials).
"""

import base64
import copy
import gzip
import io
import json
import math
import os
import random
import tarfile

import pytest

from experiments.configs import common
from legorl_jax import errors
from legorl_jax.errors import TaskError, TaskValidationError
from legorl_jax.harnesses import base as hbase
from legorl_jax.rewards import status as st
from legorl_jax.rollout.runner import TrialJob, run_trials
from legorl_jax.rollout.trial import TrialConfig
from legorl_jax.sandbox import SandboxConfig, create_sandbox, local
from legorl_jax.tasks import tree_check
from legorl_jax.tasks.jsonl import load_tasks_jsonl
from legorl_jax.tasks.repo import materialize_repo, squash_git_history
from legorl_jax.tasks.schema import RepoSource, Task
from legorl_jax.trainer import config_check
from tests.security.conftest import git, member, tar_bytes

needs_bwrap = pytest.mark.skipif(local.bwrap_path() is None, reason="bubblewrap not installed")
GOOD = {"id": "good", "repo": {"type": "dir", "path": "r"}, "instruction": "fix it",
        "hidden_tests": {"tests/test_x.py": "def test_x():\n  pass\n"}}


def _archive_task(data: bytes, tid="adv") -> Task:
  return Task.from_dict({**GOOD, "id": tid, "repo": {"type": "archive",
                                                     "archive_b64": base64.b64encode(data).decode()}})


# -- repositories ----------------------------------------------------------------------------
@pytest.mark.parametrize("members,match", [
    ([member("ok.py"), member("../escape.txt")], r"'\.\./escape\.txt' escapes the repository"),
    ([member("a/../../escape.txt")], "escapes the repository"),
    ([member("/abs_escape.txt")], r"'/abs_escape\.txt' has an absolute path"),
    ([member("leak", kind=tarfile.SYMTYPE, linkname="/etc/passwd")], r"symlink to '/etc/passwd'"),
    ([member("sub/leak", kind=tarfile.SYMTYPE, linkname="../../outside")], "symlink to '../../outside'"),
    ([member("hard", kind=tarfile.LNKTYPE, linkname="../outside")], "hardlink to '../outside'"),
    ([member("hard", kind=tarfile.LNKTYPE, linkname="/etc/passwd")], "hardlink to '/etc/passwd'"),
    ([member("dev", kind=tarfile.CHRTYPE)], "device file or FIFO"),
    ([member("fifo", kind=tarfile.FIFOTYPE)], "device file or FIFO"),
])
def test_archive_members_that_leave_the_repository_are_refused(tmp_path, members, match):
  dest = tmp_path / "repo"
  with pytest.raises(TaskError, match=match) as e:
    materialize_repo(RepoSource(kind="archive", data=tar_bytes(members)), str(dest))
  assert "repository archive" in str(e.value)
  assert not dest.exists()  # nothing half-extracted is left behind
  assert sorted(os.listdir(tmp_path)) == []
  assert not os.path.exists("/abs_escape.txt")


def test_links_inside_the_repository_are_kept(tmp_path):
  data = tar_bytes([member("pkg/a.py", data=b"A = 1\n"),
                    member("pkg/alias.py", kind=tarfile.SYMTYPE, linkname="a.py"),
                    member("top.py", kind=tarfile.SYMTYPE, linkname="pkg/a.py"),
                    member("copy.py", kind=tarfile.LNKTYPE, linkname="pkg/a.py")])
  dest = tmp_path / "repo"
  materialize_repo(RepoSource(kind="archive", data=data), str(dest))
  assert os.readlink(dest / "top.py") == "pkg/a.py"
  assert (dest / "copy.py").read_bytes() == b"A = 1\n"


def test_symlink_chain_that_climbs_out_is_refused(tmp_path):
  """Each link is lexically inside, but "up" -> "sub/.." with "sub" -> "." resolves above the
  repository; only real resolution catches it."""
  src = tmp_path / "proj"
  src.mkdir()
  (src / "m.py").write_text("X = 1\n")
  os.symlink(".", src / "sub")
  os.symlink("sub/..", src / "up")
  with pytest.raises(TaskError, match=r"'up' is a symlink to 'sub/\.\.', outside the repository"):
    materialize_repo(RepoSource(kind="dir", path=str(src)), str(tmp_path / "dest"))
  assert not (tmp_path / "dest").exists()


def test_dir_source_with_escaping_links_or_special_files_is_refused(tmp_path):
  secret = tmp_path / "host_secret.txt"
  secret.write_text("SECRET")
  for i, make in enumerate([lambda p: os.symlink(str(secret), p / "abs_link"),
                            lambda p: os.symlink("../host_secret.txt", p / "rel_link"),
                            lambda p: os.mkfifo(p / "pipe")]):
    src = tmp_path / f"proj{i}"
    src.mkdir()
    (src / "m.py").write_text("X = 1\n")
    make(src)
    with pytest.raises(TaskError, match="outside the repository|FIFO") as e:
      materialize_repo(RepoSource(kind="dir", path=str(src)), str(tmp_path / f"dest{i}"))
    msg = str(e.value)
    assert f"proj{i}" in msg and ("remove it" in msg or "replace it" in msg), msg
    assert not (tmp_path / f"dest{i}").exists()


def test_archive_bomb_and_huge_files_are_refused_early(tmp_path):
  limits = tree_check.RepoLimits(max_total_bytes=16 << 20, max_file_bytes=8 << 20, max_entries=100)
  # 64 MiB of zeros compresses to ~64 KiB: refused from the headers, never written out.
  zeros = io.BytesIO()
  with tarfile.open(fileobj=zeros, mode="w:gz") as tf:
    for i in range(8):
      ti = tarfile.TarInfo(f"blob{i}.bin")
      ti.size = 6 << 20
      tf.addfile(ti, io.BytesIO(bytes(ti.size)))
  bomb = zeros.getvalue()
  assert len(bomb) < 1 << 20
  with pytest.raises(TaskError, match=r"more than 16777216 bytes .*archive bomb"):
    materialize_repo(RepoSource(kind="archive", data=bomb), str(tmp_path / "b"), limits=limits)
  huge = tar_bytes([member("big.bin", data=bytes(9 << 20))], compress=True)
  with pytest.raises(TaskError, match=r"'big\.bin' is 9437184 bytes, over the 8388608-byte limit"):
    materialize_repo(RepoSource(kind="archive", data=huge), str(tmp_path / "h"), limits=limits)
  many = tar_bytes([member(f"f{i}.txt") for i in range(150)])
  with pytest.raises(TaskError, match="more than 100 entries"):
    materialize_repo(RepoSource(kind="archive", data=many), str(tmp_path / "m"), limits=limits)
  src = tmp_path / "proj"
  src.mkdir()
  with open(src / "big.bin", "wb") as f:
    f.truncate(9 << 20)  # sparse on disk, 9 MiB to copy
  with pytest.raises(TaskError, match="big.bin"):
    materialize_repo(RepoSource(kind="dir", path=str(src)), str(tmp_path / "d"), limits=limits)
  assert sorted(os.listdir(tmp_path)) == ["proj"]
  assert tree_check.DEFAULT_LIMITS.max_file_bytes < tree_check.DEFAULT_LIMITS.max_total_bytes


def test_corrupt_archive_is_a_clear_error(tmp_path):
  good = tar_bytes([member("a.py")], compress=True)
  for data in (good[: len(good) // 2], b"not an archive at all", gzip.compress(b"\x00" * 10)):
    with pytest.raises(TaskError, match="unreadable .*repo archives must be"):
      materialize_repo(RepoSource(kind="archive", data=data), str(tmp_path / "x"))
    assert not (tmp_path / "x").exists()


def test_git_url_and_ref_cannot_inject_options_or_run_commands(tmp_path):
  pwned = tmp_path / "pwned"
  for url, commit in ((f"--upload-pack=touch {pwned}", "main"), (f"ext::sh -c touch% {pwned}", "main"),
                      (str(tmp_path), f"--upload-pack=touch {pwned}")):
    with pytest.raises(TaskValidationError, match="repo.url|repo.base_commit"):
      Task.from_dict({**GOOD, "repo": {"type": "git", "url": url, "base_commit": commit}})
  # Even when a RepoSource is built by hand, git treats the URL as a URL, not an option, and
  # the `ext::` transport is not allowed.
  for url in (f"--upload-pack=touch {pwned}", f"ext::sh -c touch% {pwned}"):
    with pytest.raises(TaskError, match="cannot fetch"):
      materialize_repo(RepoSource(kind="git", url=url, commit="main"), str(tmp_path / "g"))
  assert not pwned.exists() and not (tmp_path / "g").exists()


def test_gitdir_file_cannot_redirect_squash_to_another_repository(tmp_path):
  victim = tmp_path / "victim"
  victim.mkdir()
  git(victim, "init", "-q", "-b", "main")
  (victim / "v.txt").write_text("v")
  git(victim, "add", "-A")
  git(victim, "commit", "-q", "-m", "victim")
  head = git(victim, "rev-parse", "HEAD")
  data = tar_bytes([member("m.py"), member(".git", data=f"gitdir: {victim}/.git\n".encode())])
  dest = tmp_path / "repo"
  materialize_repo(RepoSource(kind="archive", data=data), str(dest))
  squash_git_history(str(dest))
  assert (dest / ".git").is_dir()
  assert git(victim, "rev-parse", "HEAD") == head and git(victim, "log", "--oneline").count("\n") == 1
  assert git(dest, "log", "--all", "--format=%s").strip() == "Initial commit"


@needs_bwrap
def test_adversarial_task_fails_its_trial_only(tmp_path, scripted_uds_proxy, easy_tasks):
  """An adversarial task among good ones: its trial ends sandbox_error naming the member, every
  other trial runs normally, and no sandbox directory is left."""
  from legorl_jax.harnesses.builtin import BuiltinAdapter
  bad = _archive_task(tar_bytes([member("m.py"), member("../../etc/cron.d/pwn")]))
  base_dir = str(tmp_path / "sandboxes")
  with pytest.raises(TaskError, match="escapes the repository"):
    create_sandbox(bad, SandboxConfig(base_dir=base_dir))
  jobs = [TrialJob(easy_tasks[0], BuiltinAdapter()), TrialJob(bad, BuiltinAdapter()),
          TrialJob(easy_tasks[1], BuiltinAdapter())]
  cfg = TrialConfig(harness_timeout_s=120, max_turns=6, sandbox=SandboxConfig(base_dir=base_dir))
  res = run_trials(jobs, scripted_uds_proxy, cfg, str(tmp_path / "out"), concurrency=3, max_retries=1)
  assert [r.status for r in res] == [st.SOLVED, st.SANDBOX_ERROR, st.SOLVED], [r.error for r in res]
  assert "escapes the repository" in res[1].error
  lines = [json.loads(x) for x in open(tmp_path / "out" / "trials.jsonl")]
  assert sorted(x["task_id"] for x in lines if x["final"]) == sorted(j.task.id for j in jobs)
  assert os.listdir(base_dir) == []


# -- task files ------------------------------------------------------------------------------
def test_bad_jsonl_lines_are_reported_with_line_numbers_and_the_rest_load(tmp_path):
  p = tmp_path / "tasks.jsonl"
  lines = [
      json.dumps(GOOD).encode(),                                          # 1 ok
      b'{"id": "bad-utf8", "instruction": "caf\xe9"}',                    # 2 not UTF-8
      json.dumps({**GOOD, "id": "n1"}).encode(),                          # 3 ok
      b"[" * 3000,                                                        # 4 nesting bomb
      b'{"id": "long", "pad": "' + b"x" * 5000 + b'"}',                   # 5 over the line limit
      json.dumps({**GOOD, "id": "nan", "limits": {"timeout_s": math.nan}}).encode(),  # 6
      json.dumps({**GOOD, "id": "trav", "hidden_tests": {"../../x.py": ""}}).encode(),  # 7
      json.dumps({**GOOD, "id": "wd", "workdir": "/home/agent"}).encode(),  # 8
      json.dumps({**GOOD, "id": "nul", "hidden_tests": {"t\x00.py": ""}}).encode(),  # 9
      b"42",                                                              # 10 not an object
      json.dumps({**GOOD, "id": "n2"}).encode(),                          # 11 ok (last, no newline)
  ]
  p.write_bytes(b"\n".join(lines))
  tasks, errs = load_tasks_jsonl(str(p), max_line_bytes=4096)
  assert [t.id for t in tasks] == ["good", "n1", "n2"]
  got = {e.line: (e.field, str(e)) for e in errs}
  assert sorted(got) == [2, 4, 5, 6, 7, 8, 9, 10]
  assert "not valid UTF-8" in got[2][1] and "re-encode" in got[2][1]
  assert "JSON" in got[4][1]
  assert "longer than 4096 bytes" in got[5][1]
  assert got[6][0] == "limits.timeout_s" and "finite" in got[6][1]
  assert got[7][0] == "hidden_tests['../../x.py']"
  assert got[8][0] == "workdir" and "/home/agent" in got[8][1]
  assert got[9][0].startswith("hidden_tests")
  assert "JSON object" in got[10][1]
  assert all(msg.startswith(f"{p}:{ln}: ") for ln, (_, msg) in got.items())
  with pytest.raises(TaskValidationError, match=r"tasks\.jsonl:2: not valid UTF-8"):
    load_tasks_jsonl(str(p), strict=True, max_line_bytes=4096)


def test_fuzzed_task_objects_only_ever_raise_task_validation_error():
  rng = random.Random(0)
  base = {**GOOD, "verifier": {"type": "pytest", "test_files": ["tests/test_x.py"], "timeout_s": 5},
          "limits": {"timeout_s": 10, "memory_mb": 100}, "setup_commands": ["true"],
          "FAIL_TO_PASS": ["tests/test_x.py::test_x"], "metadata": {"language": "python"}}
  junk = [None, True, 0, -1, 1e309, -1e309, "", "..", "/", "\x00", "../x", [], {}, [None], {"a": None},
          "x" * 300, 10 ** 40, "ext::x", "-x"]

  def mutate(obj, depth=0):
    if isinstance(obj, dict) and obj and depth < 3:
      k = rng.choice(sorted(obj))
      if rng.random() < 0.5:
        obj[k] = rng.choice(junk)
      else:
        mutate(obj[k], depth + 1)
    elif isinstance(obj, list) and obj:
      obj[rng.randrange(len(obj))] = rng.choice(junk)

  n_ok = 0
  for _ in range(2000):
    d = copy.deepcopy(base)
    for _ in range(rng.randint(1, 3)):
      mutate(d)
    try:
      Task.from_dict(d)
      n_ok += 1
    except TaskValidationError as e:
      assert e.field is None or isinstance(e.field, str)
  assert 0 < n_ok < 2000


# -- configs ---------------------------------------------------------------------------------
@pytest.mark.parametrize("key,value", [
    ("trainer.steps", None), ("rollout.concurrency", True), ("optim.learning_rate", math.nan),
    ("sampling.temperature", math.inf), ("engine.max_batch", None),
])
def test_config_values_of_the_wrong_kind_name_the_key(key, value):
  cfg = common.base_config()
  section, field = key.split(".")
  cfg[section][field] = value
  with pytest.raises(errors.ConfigError, match=rf"config {key}=.*must be"):
    config_check.validate(cfg)


# -- harness output --------------------------------------------------------------------------
class _NoisyAdapter(hbase.HarnessAdapter):
  """A harness that floods stdout/stderr with invalid UTF-8 and one huge line, then exits."""

  name = "noisy"
  wire_api = hbase.WIRE_CHAT

  def __init__(self, exit_code):
    self.exit_code = exit_code

  def executable(self):
    return "/bin/sh"

  def launch(self, instruction, endpoint, *, home, workdir, max_turns, temperature=None):
    script = ("python3 -c \"import sys; w = sys.stdout.buffer.write; w(b'\\xff\\xfe\\xc3(' * 1000); "
              "w(b'A' * (16 << 20)); w(b'\\x80\\n'); sys.stderr.buffer.write(b'\\xed\\xa0\\x80 bad \\xff' * 4000)\"; "
              f"printf '\\377\\376' > {home}/agent.log; exit {self.exit_code}")
    return hbase.LaunchSpec(argv=["/bin/sh", "-c", script], cwd=workdir, log_files=[f"{home}/agent.log"])

  def harness_status(self, exit_code, timed_out, stdout_tail, stderr_tail):
    assert isinstance(stdout_tail, str) and isinstance(stderr_tail, str)
    if timed_out:
      return hbase.HARNESS_TIMEOUT
    return hbase.HARNESS_OK if exit_code == 0 else hbase.HARNESS_ERROR


@needs_bwrap
def test_harness_output_with_invalid_utf8_and_huge_lines_is_recorded(tmp_path, scripted_uds_proxy,
                                                                    easy_tasks):
  jobs = [TrialJob(easy_tasks[2], _NoisyAdapter(0)), TrialJob(easy_tasks[2], _NoisyAdapter(1))]
  out = tmp_path / "out"
  res = run_trials(jobs, scripted_uds_proxy, TrialConfig(harness_timeout_s=120), str(out),
                   concurrency=2, max_retries=0)
  assert [r.status for r in res] == [st.FAILED, st.HARNESS_ERROR], [r.error[:300] for r in res]
  assert "\ufffd" in res[1].error and len(res[1].error) < 2000
  assert os.path.getsize(res[0].log_paths["stdout"]) > 1 << 20  # the flood reached the log file
  assert open(res[0].log_paths["agent.log"], "rb").read() == b"\xff\xfe"
  lines = [json.loads(x) for x in open(out / "trials.jsonl", encoding="utf-8")]
  assert sorted(x["status"] for x in lines) == sorted([st.FAILED, st.HARNESS_ERROR])


class _PlantingAdapter(_NoisyAdapter):
  """A harness that replaces the log files the trial copies out with a FIFO (an unguarded
  reader would block forever), a link to a host file and a link to a directory."""

  name = "planting"

  def launch(self, instruction, endpoint, *, home, workdir, max_turns, temperature=None):
    script = (f"mkfifo {home}/agent.log; ln -s /etc/passwd {home}/passwd.log; "
              f"ln -s /etc {home}/etc_dir; exit 0")
    return hbase.LaunchSpec(argv=["/bin/sh", "-c", script], cwd=workdir,
                            log_files=[f"{home}/agent.log", f"{home}/passwd.log", f"{home}/etc_dir/passwd"])


@needs_bwrap
@pytest.mark.timeout(300)
def test_planted_fifo_or_links_in_place_of_logs_do_not_hang_or_leak(tmp_path, scripted_uds_proxy,
                                                                    easy_tasks):
  res = run_trials([TrialJob(easy_tasks[0], _PlantingAdapter(0))], scripted_uds_proxy,
                   TrialConfig(harness_timeout_s=60), str(tmp_path / "out"), max_retries=0)[0]
  assert res.status == st.FAILED, res.error
  assert set(res.log_paths) == {"stdout", "stderr"}  # none of the planted files was copied
  assert not any(f.endswith(("agent.log", "passwd.log", "passwd")) for _, _, fs in os.walk(tmp_path)
                 for f in fs)
