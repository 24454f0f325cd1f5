"""legorl_jax.harnesses: native coding-agent harnesses as rollout workers.

``base`` (the adapter interface), one module per harness (``builtin``, ``mini_swe_agent``,
``aider``, ``openhands``, ``opencode``, ``codex``, ``claude_code``), ``install`` (isolated,
pinned CLI installs), ``scripted`` (the gold-patch policy for plumbing tests and
demonstrations) and ``registry`` (name -> adapter, mixed-harness choice).
"""

from legorl_jax.harnesses.registry import HarnessChooser, get_adapter, names

__all__ = ["HarnessChooser", "get_adapter", "names"]
