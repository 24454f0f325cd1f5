"""The Colab notebooks: structure (badge, runtime detection, a ``parameters`` cell, no stored
outputs) and a top-to-bottom run of each on CPU with ``nbclient``, small settings injected
after the parameters cell (as papermill does), plus a final cell that checks what each
notebook claims to show. Any cell error fails the test."""

import json
import os

import pytest

from tests.xla_flags import subprocess_xla_flags

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COLAB = os.path.join(ROOT, "colab")
NOTEBOOKS = ("quickstart.ipynb", "harness_rollouts.ipynb", "fused_loss.ipynb")

# Small settings for a CI run, and a check of the notebook's result run in its kernel.
SMALL = {
    "quickstart.ipynb": dict(
        params=dict(NUM_TRAIN_TASKS=4, NUM_VAL_TASKS=2, SFT_DEMOS=4, SFT_STEPS=3, RL_STEPS=1,
                    TASKS_PER_STEP=2, SAMPLES_PER_TASK=2, EVAL_SAMPLES=1, EVAL_GREEDY=False,
                    MAX_TURNS=2, MAX_TOKENS=32, ROWS_PER_BATCH=4, MICRO_BATCHES=1),
        check="""
import os
assert summary["rl_steps"] == 1 and os.path.exists(os.path.join(WORKDIR, "summary.json"))
assert 0.0 <= summary["val_solve_rate_after_rl"] <= 1.0
assert len(train_rows) == 1 and charts["Solve rate"]["held-out (sampled)"]
assert all(s.startswith("<svg") and "polyline" in s for s in svgs)
assert sum(sum(c.values()) for c in by_phase.values()) == len(trials) > 0
"""),
    "harness_rollouts.ipynb": dict(
        params=dict(NEURAL_MAX_TURNS=2, NEURAL_MAX_TOKENS=24),
        check="""
assert scripted.status == "solved" and scripted.reward == 1.0, scripted.error
assert neural.status in ("failed", "overlong", "timeout", "solved"), neural.error
assert neural.trajectory.segments and max_abs_dlogp < 1e-4, max_abs_dlogp
assert n_sampled > 0 and "loss-mask" in token_html
"""),
    "fused_loss.ipynb": dict(
        params=dict(D=64, V=4096, NS=[256, 1024], STEPS=1, VOCAB_CHUNK=512),
        check="""
assert len(results) == 4 and max_err < 1e-4, max_err
big = {r["variant"]: r for r in results if r["n"] == 1024}
assert big["fused"]["temp_mib"] < big["materialised"]["temp_mib"]
"""),
}


def load(name):
  with open(os.path.join(COLAB, name)) as f:
    return nbformat.read(f, as_version=4)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_structure(name):
  nb = load(name)
  nbformat.validate(nb)
  first = nb.cells[0].source
  assert ("https://colab.research.google.com/github/legorl/legorl_jax/blob/main/colab/"
          f"{name}") in first and "colab-badge.svg" in first
  tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
  assert len(tagged) == 1 and "SKIP_INSTALL" in tagged[0].source
  code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
  assert "jax.default_backend()" in code and "https://github.com/legorl/legorl_jax.git" in code
  for c in nb.cells:  # committed without outputs, so diffs stay readable
    if c.cell_type == "code":
      assert not c.outputs and c.execution_count is None, f"{name}: clear outputs before committing"


def _inject(nb, params: dict, check: str, workdir: str):
  idx = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
  params = dict(params, SKIP_INSTALL=True)
  for key in ("WORKDIR", "OUT_DIR"):
    if key + " =" in nb.cells[idx].source:
      params[key] = os.path.join(workdir, key.lower())
  src = "\n".join(f"{k} = {json.dumps(v) if not isinstance(v, bool) else v}" for k, v in params.items())
  cell = nbformat.v4.new_code_cell(src)
  cell.metadata["tags"] = ["injected-parameters"]
  nb.cells.insert(idx + 1, cell)
  nb.cells.append(nbformat.v4.new_code_cell(check.strip()))
  for i, c in enumerate(nb.cells):
    c["id"] = f"c{i}"
  return nb


@pytest.mark.slow
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_runs_top_to_bottom_on_cpu(name, tmp_path, monkeypatch):
  # A Colab CPU runtime has one device; so does the kernel here (faster to compile, too).
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  monkeypatch.setenv("XLA_FLAGS", subprocess_xla_flags())
  monkeypatch.setenv("PYTHONPATH", ROOT)
  nb = _inject(load(name), SMALL[name]["params"], SMALL[name]["check"], str(tmp_path))
  client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                   resources={"metadata": {"path": COLAB}})
  try:
    client.execute()
  except nbclient.exceptions.CellExecutionError as e:
    pytest.fail(f"{name}: a cell failed:\n{str(e)[-6000:]}")
