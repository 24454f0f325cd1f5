"""legorl_jax.sandbox: isolated places where one trial works on one repository.

``create_sandbox(task, config)`` picks the backend named by ``config.backend``
("local": bubblewrap, "docker": one container per trial); both give the same layout and
API (see ``base.Sandbox``).
"""

from legorl_jax.errors import SandboxError
from legorl_jax.sandbox.base import ExecResult, Sandbox, SandboxConfig

BACKENDS = ("local", "docker")


def create_sandbox(task, config: SandboxConfig | None = None) -> Sandbox:
  """Creates, sets up and returns a sandbox for ``task``; the caller must destroy() it."""
  config = config or SandboxConfig()
  if config.backend == "local":
    from legorl_jax.sandbox.local import LocalSandbox
    return LocalSandbox(task, config)
  if config.backend == "docker":
    from legorl_jax.sandbox.docker_sandbox import DockerSandbox
    return DockerSandbox(task, config)
  raise SandboxError(f"unknown sandbox backend {config.backend!r}; choose one of {BACKENDS}")


__all__ = ["BACKENDS", "ExecResult", "Sandbox", "SandboxConfig", "create_sandbox"]
