"""Trial statuses shared by the sandbox, verifier, rollout and metrics layers.

Every trial ends with exactly one of these. *Policy* outcomes are scored and trained on
(a timeout or a tampered test suite is the policy's fault); *infrastructure* outcomes mean
the trial says nothing about the policy, so its group is masked out of the loss.
"""

SOLVED = "solved"
FAILED = "failed"
TIMEOUT = "timeout"
OVERLONG = "overlong"
REWARD_HACK = "reward_hack"
HARNESS_ERROR = "harness_error"
SANDBOX_ERROR = "sandbox_error"
VERIFIER_ERROR = "verifier_error"

POLICY_STATUSES = frozenset({SOLVED, FAILED, TIMEOUT, OVERLONG, REWARD_HACK})
INFRASTRUCTURE_STATUSES = frozenset({HARNESS_ERROR, SANDBOX_ERROR, VERIFIER_ERROR})
ALL_STATUSES = POLICY_STATUSES | INFRASTRUCTURE_STATUSES


def is_infrastructure(status: str) -> bool:
  """True when the trial failed for reasons outside the policy (exclude it from the loss)."""
  check(status)
  return status in INFRASTRUCTURE_STATUSES


def check(status: str) -> str:
  """Returns ``status`` unchanged, or raises ValueError naming the allowed values."""
  if status not in ALL_STATUSES:
    raise ValueError(f"unknown trial status {status!r}; expected one of {sorted(ALL_STATUSES)}")
  return status
