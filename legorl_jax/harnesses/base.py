"""The harness adapter interface.

An adapter turns "run harness X on this task against this endpoint" into a launch spec: argv,
environment and config files inside the sandbox's private HOME. The trial runner
(``legorl_jax.rollout.trial``) executes that spec inside the sandbox with a wall-clock limit
and asks the adapter to map the exit to a harness status. Adapters never change the harness;
they only configure it the way a user would.
"""

from __future__ import annotations

import abc
import dataclasses
import shutil
from typing import Mapping

from legorl_jax import errors

WIRE_CHAT = "openai_chat"
WIRE_RESPONSES = "openai_responses"
WIRE_MESSAGES = "anthropic_messages"
WIRE_APIS = (WIRE_CHAT, WIRE_RESPONSES, WIRE_MESSAGES)

# Harness-level outcomes (before the verifier runs).
HARNESS_OK = "ok"                 # exited normally (submitted or gave up)
HARNESS_TIMEOUT = "timeout"       # ran past its wall-clock limit (policy outcome)
HARNESS_OVERLONG = "overlong"     # the conversation outgrew the context (policy outcome)
HARNESS_ERROR = "harness_error"   # crashed / misconfigured / endpoint unreachable (infrastructure)


@dataclasses.dataclass(frozen=True)
class Endpoint:
  """How a harness inside the sandbox reaches its session on the proxy.

  ``root``: e.g. ``http://127.0.0.1:8080/sess/<id>`` (Anthropic clients use it as is);
  ``openai_base``: ``root + "/v1"``. ``token`` is the session's bearer token.
  """

  root: str
  token: str
  model: str = "policy"

  @property
  def openai_base(self) -> str:
    return self.root.rstrip("/") + "/v1"


@dataclasses.dataclass
class LaunchSpec:
  """What to run inside the sandbox. ``files``: absolute in-sandbox path -> content (config
  files, the task text); ``log_files``: in-sandbox paths worth keeping after the trial."""

  argv: list[str]
  env: dict[str, str] = dataclasses.field(default_factory=dict)
  files: dict[str, str | bytes] = dataclasses.field(default_factory=dict)
  cwd: str | None = None
  log_files: list[str] = dataclasses.field(default_factory=list)


class HarnessAdapter(abc.ABC):
  """One native harness. Subclasses set ``name`` and ``wire_api`` and implement ``launch``."""

  name: str = ""
  wire_api: str = WIRE_CHAT

  # -- installation ---------------------------------------------------------------------------
  def executable(self) -> str | None:
    """Host path of the harness entry point, or None when not installed."""
    return None

  def install_hint(self) -> str:
    return f"python -m legorl_jax.harnesses.install {self.name}"

  def check_installed(self) -> None:
    if self.executable() is None:
      raise errors.HarnessError(
          f"Harness {self.name!r} is not installed. Install it with `{self.install_hint()}`.")

  def ro_mounts(self) -> list[str]:
    """Host paths the harness needs inside the sandbox (read-only): its install, runtimes."""
    return []

  # -- one trial ------------------------------------------------------------------------------
  @abc.abstractmethod
  def launch(self, instruction: str, endpoint: Endpoint, *, home: str, workdir: str,
             max_turns: int, temperature: float | None = None) -> LaunchSpec:
    """The launch spec for one trial (``home``/``workdir`` are in-sandbox paths)."""

  def harness_status(self, exit_code: int, timed_out: bool, stdout_tail: str,
                     stderr_tail: str) -> str:
    """Maps the process outcome to a harness status. Default: 0 -> ok, else harness_error."""
    if timed_out:
      return HARNESS_TIMEOUT
    if "context_length_exceeded" in stdout_tail + stderr_tail:
      return HARNESS_OVERLONG
    return HARNESS_OK if exit_code == 0 else HARNESS_ERROR


def which(names: list[str], extra_paths: Mapping[str, str] | None = None) -> str | None:
  for n in names:
    p = shutil.which(n)
    if p:
      return p
  return None
