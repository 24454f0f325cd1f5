"""legorl_jax.tasks."""
