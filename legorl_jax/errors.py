"""The one exception hierarchy of legorl_jax.

Every error a user can cause (bad config, bad checkpoint, bad task, bad request) is a
``LegorlError`` whose message names the problem and how to fix it. Host-side layers catch
these per trial / per request so one bad input never takes a run down.
"""


class LegorlError(Exception):
  """Base class of every error raised on purpose by legorl_jax."""


class ConfigError(LegorlError, ValueError):
  """A config key or value is invalid; the message names the key."""


class InvalidJSONError(LegorlError, ValueError):
  """Text from outside (a request body, a task file, a model's tool-call arguments) is not
  JSON we accept: malformed, nested too deep, or holding an over-large number. HTTP layers
  answer it with a 400 (``status``/``code``)."""

  status = 400
  code = "invalid_json"


class CheckpointError(LegorlError):
  """A checkpoint directory is missing, malformed or incompatible."""


class UnsupportedArchitectureError(CheckpointError):
  """A Hugging Face checkpoint uses an architecture this package cannot load."""


class TokenizerError(LegorlError):
  """A tokenizer or chat template is missing or cannot render a prompt."""


class ShardingError(LegorlError, ValueError):
  """A mesh or sharding rule does not fit the array it is applied to."""


class SamplingError(LegorlError):
  """The sampling engine could not serve a request."""


class ContextLengthError(SamplingError):
  """A prompt (plus requested tokens) does not fit the model's context."""


class KernelError(LegorlError, ValueError):
  """A fused kernel was called with unsupported shapes, dtypes or implementation."""


class TaskError(LegorlError):
  """A task is malformed or its repository cannot be materialised."""


class TaskValidationError(TaskError, ValueError):
  """A task record failed validation; carries the file, line and field."""

  def __init__(self, message, *, path=None, line=None, field=None):
    self.path, self.line, self.field = path, line, field
    where = ":".join(str(x) for x in (path, line) if x is not None)
    prefix = f"{where}: " if where else ""
    fld = f"field {field!r}: " if field else ""
    super().__init__(f"{prefix}{fld}{message}")


class SandboxError(LegorlError):
  """A sandbox could not be created, used or destroyed (an infrastructure failure)."""


class VerifierError(LegorlError):
  """The verifier could not run or its output could not be parsed."""


class HarnessError(LegorlError):
  """A harness CLI is missing, misconfigured or failed to start."""


class ProxyError(LegorlError):
  """A request to the LLM proxy is invalid; carries an HTTP status and an error code."""

  def __init__(self, message, *, status=400, code="invalid_request_error", param=None):
    self.status, self.code, self.param = status, code, param
    super().__init__(message)


class RolloutError(LegorlError):
  """A trial or a batch of trajectories could not be produced."""


class TrainerError(LegorlError):
  """The learner or training loop hit an unrecoverable condition."""


class KLBoundError(TrainerError):
  """The policy moved further from its start than ``trainer.max_kl`` allows; the message names
  the step, the KL and the flag."""
