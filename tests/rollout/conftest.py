"""Fixtures for trial/runner tests: a shell-script "harness" and a scripted proxy.

``ShellAdapter`` is a real harness in the adapter sense (a subprocess in the sandbox that may
call the proxy), whose behaviour is one shell script: crash, hang, do nothing, or fix the bug
by applying the gold patch. That lets the tests drive every trial outcome deterministically.
"""

import pytest

from legorl_jax.harnesses import base
from legorl_jax.harnesses.scripted import ScriptedPolicy, patches_by_instruction
from legorl_jax.models.tokenizer import load_tokenizer
from legorl_jax.proxy import ProxyConfig, ScriptedBackend
from legorl_jax.taskgen.synthetic import generate_tasks
from tests.harnesses.conftest import start_proxy, stop_proxy


class ShellAdapter(base.HarnessAdapter):
  """Runs ``script`` with /bin/sh in the work dir; ``$TASK_FILE`` holds the instruction and
  ``$FIX`` the gold patch when ``give_patch``."""

  wire_api = base.WIRE_CHAT

  def __init__(self, name, script, patches=None):
    self.name, self.script, self.patches = name, script, patches or {}

  def executable(self):
    return "/bin/sh"

  def launch(self, instruction, endpoint, *, home, workdir, max_turns, temperature=None):
    files = {f"{home}/task.md": instruction}
    if instruction in self.patches:
      files[f"{home}/fix.diff"] = self.patches[instruction]
    return base.LaunchSpec(
        argv=["/bin/sh", "-c", self.script], cwd=workdir, files=files,
        env={"TASK_FILE": f"{home}/task.md", "FIX": f"{home}/fix.diff",
             "BASE_URL": endpoint.openai_base, "TOKEN": endpoint.token},
        log_files=[f"{home}/task.md"])


@pytest.fixture(scope="session")
def rollout_tasks():
  return generate_tasks(3, seed=5, difficulty="easy")


@pytest.fixture(scope="session")
def rollout_proxy(rollout_tasks):
  tok = load_tokenizer()
  server = start_proxy(
      ScriptedBackend(tok, ScriptedPolicy(patches_by_instruction(rollout_tasks)).reply), tok,
      ProxyConfig(model_name="policy"))
  yield server
  stop_proxy(server)


@pytest.fixture(scope="session")
def gold(rollout_tasks):
  return {t.instruction: t.gold_patch for t in rollout_tasks}
