"""A small Python project with a pytest suite, as files, for the repository task builder.

Kept as data (not as files under tests/) so the project's own tests are never collected by
this repository's test run. ``write(root)`` lays it out; variants make the bad inputs.
"""

import io
import os
import tarfile

PYPROJECT = '''[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "tallykit"
version = "0.3.0"
description = "Counting and summary helpers"

[tool.pytest.ini_options]
testpaths = ["tests"]
'''

STATS = '''"""Summary statistics over plain lists."""


def mean(values):
    """Arithmetic mean; ValueError on an empty sequence."""
    if not values:
        raise ValueError("mean of an empty sequence")
    return sum(values) / len(values)


def clamp(x, lo, hi):
    """``x`` limited to the closed interval [lo, hi]."""
    if lo > hi:
        raise ValueError("lo must not exceed hi")
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def is_sorted(values):
    """True when ``values`` never decreases."""
    for i in range(len(values) - 1):
        if values[i] > values[i + 1]:
            return False
    return True


def running_total(values):
    """Prefix sums: [a, a + b, a + b + c, ...]."""
    out = []
    total = 0
    for v in values:
        total += v
        out.append(total)
    return out
'''

TEXT = '''"""Word counting."""


class Tally:
    """Case-insensitive word counts."""

    def __init__(self):
        self.counts = {}

    def add(self, word, n=1):
        word = word.lower()
        self.counts[word] = self.counts.get(word, 0) + n
        return self.counts[word]

    def top(self, k):
        """The ``k`` most frequent words, ties broken alphabetically."""
        items = sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0]))
        return items[:k]


def split_words(text):
    """Words of ``text``, commas counting as spaces."""
    return [w for w in text.replace(",", " ").split() if w]


def abbreviate(name):
    """Upper-case initials of a name: 'ada lovelace' -> 'AL'."""
    parts = [p for p in name.split() if p]
    return "".join(p[0].upper() for p in parts)
'''

TEST_STATS = '''import pytest

from tallykit.stats import clamp, is_sorted, mean, running_total


def test_average_of_three():
    assert mean([1, 2, 3]) == 2


def test_average_of_floats():
    assert mean([0.5, 1.5]) == 1.0


def test_average_rejects_empty():
    with pytest.raises(ValueError):
        mean([])


def test_bounds_below():
    assert clamp(-5, 0, 10) == 0


def test_bounds_above():
    assert clamp(15, 0, 10) == 10


def test_bounds_inside():
    assert clamp(5, 0, 10) == 5


def test_bounds_reject_inverted_interval():
    with pytest.raises(ValueError):
        clamp(1, 10, 0)


def test_order_check_accepts_ties():
    assert is_sorted([1, 2, 2, 3])


def test_order_check_rejects_descent():
    assert not is_sorted([3, 1, 2])


def test_prefix_sums():
    assert running_total([1, 2, 3]) == [1, 3, 6]
'''

TEST_TEXT = '''from tallykit.text import Tally, abbreviate, split_words


def test_tally_counts_case_insensitively():
    t = Tally()
    t.add("Apple")
    assert t.add("apple") == 2


def test_tally_weighted_add():
    t = Tally()
    assert t.add("pear", 3) == 3


def test_most_frequent_first():
    t = Tally()
    for w in ["b", "a", "b", "c", "b", "a"]:
        t.add(w)
    assert t.top(2) == [("b", 3), ("a", 2)]


def test_words_split_on_commas():
    assert split_words("one,two  three") == ["one", "two", "three"]


def test_initial_letters():
    assert abbreviate("ada  lovelace") == "AL"
'''

FILES = {
    "pyproject.toml": PYPROJECT,
    "README.md": "# tallykit\n\nCounting and summary helpers.\n",
    "tallykit/__init__.py": '"""tallykit: counting and summary helpers."""\n',
    "tallykit/stats.py": STATS,
    "tallykit/text.py": TEXT,
    "tests/__init__.py": "",
    "tests/test_stats.py": TEST_STATS,
    "tests/test_text.py": TEST_TEXT,
}


def write(root, files=None):
  """Writes the project (or ``files``) under ``root``; returns ``root``."""
  for rel, text in (FILES if files is None else files).items():
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
      f.write(text)
  return root


def sdist(path, files, top="tallykit-0.3.0"):
  """A .tar.gz laid out as an sdist (one top directory) holding ``files``."""
  with tarfile.open(path, "w:gz") as tf:
    for rel, text in sorted(files.items()):
      data = text.encode()
      ti = tarfile.TarInfo(f"{top}/{rel}")
      ti.size = len(data)
      tf.addfile(ti, io.BytesIO(data))
  return path
