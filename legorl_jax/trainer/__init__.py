"""Learner: train state, sharded train step, checkpoints, and the RL loop."""
