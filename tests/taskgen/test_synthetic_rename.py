"""Renamed variants: same behaviour under new names, and tasks that still check out.

The hand-written expected source is the reference for the token-level rename; the variant
tasks are checked like the originals (unpack with tarfile, `git apply` the gold patch, run the
hidden tests with pytest).
"""

import collections
import io
import subprocess
import tarfile

from legorl_jax.taskgen.synthetic import generate_task_pool
from legorl_jax.taskgen.synthetic.rename import rename_function
from tests.taskgen.test_synthetic import _pytest, _unpack

SOURCE = '''def helper(x):
    return x


def total(items, scale=2):
    """Sum of ``items`` times ``scale``."""
    acc = 0
    for item in items:
        acc += item.value * scale
    text = "items and acc"
    return helper(dict(acc=acc, items=[i for i in items]))
'''

EXPECTED = '''def helper(x):
    return x


def total(rows, factor=2):
    """Sum of ``rows`` times ``factor``."""
    tally = 0
    for cell in rows:
        tally += cell.value * factor
    text = "items and acc"
    return helper(dict(acc=tally, items=[i for i in rows]))
'''


def test_rename_touches_variables_only():
  mapping = {"items": "rows", "scale": "factor", "acc": "tally", "item": "cell", "text": "text"}
  assert rename_function(SOURCE, "total", mapping) == EXPECTED
  # Other functions keep their names even when they share one.
  assert rename_function(SOURCE, "helper", {"x": "y"}).startswith("def helper(y):\n    return y\n")


def test_variants_are_new_names_for_the_same_tasks():
  pool = generate_task_pool("hinted", "train", variants=3)
  by_variant = collections.Counter(t.metadata.extra["variant"] for t in pool)
  originals = generate_task_pool("hinted", "train")
  assert by_variant[0] == len(originals) and by_variant[1] > len(originals) // 2 and by_variant[2] > 0
  assert len({t.id for t in pool}) == len(pool)
  renamed = [t for t in pool if t.metadata.extra["variant"] > 0]
  original_paths = {t.instruction.split("`")[3] for t in originals}
  assert not {t.instruction.split("`")[3] for t in renamed} & original_paths
  for t in renamed[:50]:
    path = t.instruction.split("`")[3]
    assert f"+++ b/{path}" in t.gold_patch and t.metadata.extra["bug_new"] in t.instruction


def test_variant_gold_patches_flip_the_hidden_tests(tmp_path):
  pool = [t for t in generate_task_pool("hinted", "train", variants=2) if t.metadata.extra["variant"] == 1]
  by_family = {}
  for t in pool:
    by_family.setdefault(t.metadata.extra["family"], t)
  for i, task in enumerate(by_family.values()):
    before, after = tmp_path / f"b{i}", tmp_path / f"a{i}"
    _unpack(task, before)
    _unpack(task, after)
    subprocess.run(["git", "init", "-q"], cwd=after, check=True)
    p = subprocess.run(["git", "apply", "-"], cwd=after, input=task.gold_patch, text=True, capture_output=True)
    assert p.returncode == 0, p.stderr
    assert set(task.test_ids) == _pytest(after, task), task.id
    assert task.fail_to_pass and not set(task.fail_to_pass) & _pytest(before, task)
    with tarfile.open(fileobj=io.BytesIO(task.repo.data)) as tf:
      names = tf.getnames()
    assert any(n.endswith(".py") and n.split("/")[0] == task.instruction.split("`")[3].split("/")[0]
               for n in names)


def test_names_are_single_tokens_of_the_bundled_tokenizer():
  """A renamed path or line must be copyable token by token: each name a variant can draw is
  one token of the bundled tokenizer in the context it appears in."""
  from legorl_jax.models.tokenizer import bundled_tokenizer_dir, load_tokenizer
  from legorl_jax.taskgen.synthetic import rename
  tok = load_tokenizer(bundled_tokenizer_dir())
  pieces = lambda s: [tok.decode([i]) for i in tok.encode(s)]  # noqa: E731
  for w in rename.PACKAGES:
    assert pieces(w) == [w] and pieces("_" + w) == ["_" + w], w
  for m in rename.MODULES:
    assert pieces("/" + m) == ["/" + m], m
  for w in rename.WORDS:
    assert pieces(" " + w) == [" " + w], w
  assert len(set(rename.WORDS)) == len(rename.WORDS) and len(set(rename.PACKAGES)) == len(rename.PACKAGES)
  # A whole path: package word, "_" word, "/" module, ".py".
  assert pieces("ledger_sensor/model.py") == ["ledger", "_sensor", "/model", ".py"]
