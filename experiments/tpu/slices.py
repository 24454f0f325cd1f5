r"""The Cloud TPU slices we ship configs for, and the settings every TPU config shares.

One table serves the launch scripts (which need no JAX: they run on a laptop) and the configs:

  python3 -m experiments.tpu.slices v5p-32     # prints shell assignments for the scripts
"""

from __future__ import annotations

import dataclasses
import sys


@dataclasses.dataclass(frozen=True)
class Slice:
  accelerator_type: str      # gcloud --accelerator-type
  runtime_version: str       # gcloud --version (TPU VM software image)
  zone: str                  # a zone that offers this type (override with --zone)
  num_workers: int           # hosts (TPU VMs) in the slice = JAX processes
  chips_per_worker: int      # JAX devices per host
  hbm_gib_per_chip: int
  config: str                # training config file
  hf_model: str              # Hugging Face weights the setup script downloads


SLICES = {
    "v5e-8": Slice("v5litepod-8", "v2-alpha-tpuv5-lite", "us-west4-a", 1, 8, 16,
                   "experiments/configs/tpu_v5e_8.py", "Qwen/Qwen3-1.7B"),
    "v6e-8": Slice("v6e-8", "v2-alpha-tpuv6e", "us-east5-b", 1, 8, 32,
                   "experiments/configs/tpu_v6e_8.py", "Qwen/Qwen3-1.7B"),
    "v5p-32": Slice("v5p-32", "v2-alpha-tpuv5", "us-east5-a", 4, 4, 95,
                    "experiments/configs/tpu_v5p_32.py", "Qwen/Qwen3-8B"),
}

# Where setup.sh puts things on every worker (relative to the remote $HOME).
REMOTE_REPO = "legorl_jax"
REMOTE_VENV = "legorl_venv"
REMOTE_MODELS = "models"


def model_dir(name: str) -> str:
  """Remote directory (under $HOME) of a slice's downloaded weights."""
  return f"{REMOTE_MODELS}/{SLICES[name].hf_model.split('/')[-1]}"


def tpu_config(name: str):
  """``base_config()`` plus what every TPU run shares: real harness in Docker sandboxes,
  long contexts, bf16 compute, HF weights, multi-host start-up, and the slice's shape."""
  import ml_collections

  from experiments.configs import common

  s = SLICES[name]
  c = common.base_config()
  c.model.compute_dtype = "bfloat16"    # matmuls in bf16; parameters and optimizer stay fp32
  c.model.checkpoint = ""               # the launcher sets $HOME/models/<name> (setup.sh downloads it)

  c.tasks.source = "synthetic"          # or a TFDS task directory (gs:// works)
  c.tasks.difficulty = "easy"
  c.tasks.num_train = 2048
  c.tasks.num_val = 128

  c.harness.name = "mini-swe-agent"
  c.harness.max_turns = 30
  c.harness.timeout_s = 1800.0
  c.sandbox.backend = "docker"          # TPU VM images ship Docker; setup.sh enables it

  c.sampling.temperature = 1.0
  c.sampling.max_tokens = 4096
  c.loss.temperature = 1.0
  c.engine.max_len = 16384
  c.engine.prefill_buckets = (1024, 4096, 8192, 16384)
  c.engine.decode_chunk = 32

  c.trainer.steps = 200
  c.trainer.buckets = (8192, 16384)
  c.trainer.logprob_impl = "xla"        # portable; "pallas" is the TPU fast path
  c.optim.learning_rate = 1e-6
  c.optim.schedule = "cosine"
  c.optim.warmup_steps = 10
  c.optim.total_steps = 200
  c.sft.steps = 0                       # start from instruction-tuned weights
  c.eval.every = 25
  c.checkpoint.every = 10
  c.checkpoint.keep = 3

  c.distributed = ml_collections.ConfigDict()
  c.distributed.mode = "always" if s.num_workers > 1 else "auto"
  c.distributed.coordinator_address = ""   # empty on TPU VMs: read from the slice metadata
  c.distributed.num_processes = s.num_workers
  c.distributed.process_id = -1

  c.tpu = ml_collections.ConfigDict(dataclasses.asdict(s))
  c.tpu.name = name
  c.tpu.num_devices = s.num_workers * s.chips_per_worker
  return c


def shell_assignments(name: str) -> str:
  s = SLICES[name]
  rows = {"TPU_TYPE": name, "ACCELERATOR_TYPE": s.accelerator_type,
          "RUNTIME_VERSION": s.runtime_version, "DEFAULT_ZONE": s.zone,
          "NUM_WORKERS": s.num_workers, "CONFIG": s.config, "HF_MODEL": s.hf_model,
          "MODEL_DIR": model_dir(name), "REMOTE_REPO": REMOTE_REPO, "REMOTE_VENV": REMOTE_VENV}
  return "\n".join(f"{k}='{v}'" for k, v in rows.items())


if __name__ == "__main__":
  if len(sys.argv) != 2 or sys.argv[1] not in SLICES:
    sys.exit(f"usage: python3 -m experiments.tpu.slices {{{','.join(SLICES)}}}")
  print(shell_assignments(sys.argv[1]))
