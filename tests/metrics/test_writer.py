"""metrics.jsonl round trip, including the duplicate rows a resumed run leaves behind."""

import json

from legorl_jax.metrics.writer import MetricsWriter, read_metrics


def test_round_trip_keeps_every_step(tmp_path):
  w = MetricsWriter(str(tmp_path))
  for step in range(3):
    w.write(step, {"loss": float(step)}, phase="train")
  w.write(0, {"solve_rate": 0.5}, phase="eval")
  w.close()
  rows = read_metrics(str(tmp_path))
  assert [(r["phase"], r["step"]) for r in rows] == [("train", 0), ("train", 1), ("train", 2), ("eval", 0)]
  assert [r.get("loss") for r in rows[:3]] == [0.0, 1.0, 2.0]


def test_a_redone_step_keeps_its_last_row_and_bad_lines_are_skipped(tmp_path):
  lines = [{"step": 1, "phase": "train", "loss": 1.0}, {"step": 2, "phase": "train", "loss": 2.0},
           {"step": 2, "phase": "train", "loss": 2.5}, {"step": 3, "phase": "train", "loss": 3.0}]
  with open(tmp_path / "metrics.jsonl", "w") as f:
    f.write(json.dumps(lines[0]) + "\n" + json.dumps(lines[1]) + "\n{not json\n")
    f.write("\n".join(json.dumps(l) for l in lines[2:]) + "\n")
  rows = read_metrics(str(tmp_path))
  assert [(r["step"], r["loss"]) for r in rows] == [(1, 1.0), (2, 2.5), (3, 3.0)]


_TB_CHILD = """
import glob, struct, sys
from legorl_jax.metrics.writer import MetricsWriter
w = MetricsWriter(sys.argv[1])
w.write(3, {"loss": 1.5}, phase="train")
w.close()
print("torch loaded:", "torch" in sys.modules)
(events,) = glob.glob(sys.argv[1] + "/tb/events.out.tfevents.*")
from tensorboardX.proto import event_pb2
data, tags = open(events, "rb").read(), []
while data:  # TFRecord framing: u64 length, u32 crc, payload, u32 crc
  (n,) = struct.unpack("<Q", data[:8])
  ev = event_pb2.Event.FromString(data[12:12 + n])
  tags += [(ev.step, v.tag, v.simple_value) for v in ev.summary.value]
  data = data[12 + n + 4:]
print("scalars:", tags)
import torch
print("torch importable:", torch.__name__)
"""


def test_tensorboard_scalars_are_written_without_loading_torch(tmp_path):
  """A fresh process (as every run is) writes the TensorBoard scalar without importing PyTorch
  (``writer._summary_writer_class``), and torch can still be imported after."""
  import subprocess
  import sys
  r = subprocess.run([sys.executable, "-c", _TB_CHILD, str(tmp_path)], capture_output=True,
                     text=True, timeout=120)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "torch loaded: False" in r.stdout
  assert "scalars: [(3, 'train/loss', 1.5)]" in r.stdout
  assert "torch importable: torch" in r.stdout
