"""legorl_jax.harnesses: native coding-agent harnesses as rollout workers.

``base`` (the adapter interface), one module per harness (``builtin``, ``mini_swe_agent``,
``aider``, ``openhands``, ``opencode``, ``codex``, ``claude_code``), ``install`` (isolated,
pinned CLI installs), ``scripted`` (the gold-patch policy for plumbing tests and
demonstrations) and ``registry`` (name -> adapter, mixed-harness choice).
"""

__all__ = ["HarnessChooser", "get_adapter", "names"]


def __getattr__(name):
  # Lazy: ``python -m legorl_jax.harnesses.install`` runs in CI before the package's
  # dependencies are installed, so importing this package must not import numpy.
  if name in __all__:
    from legorl_jax.harnesses import registry
    return getattr(registry, name)
  raise AttributeError(f"module 'legorl_jax.harnesses' has no attribute {name!r}")
