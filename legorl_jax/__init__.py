"""legorl_jax: harness-native reinforcement learning for coding agents, in JAX."""

__version__ = "0.1.0"
