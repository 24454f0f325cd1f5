"""Checks on untrusted repository contents before an agent ever sees them.

A task's repository comes from a dataset we did not write. Before it becomes a sandbox's
work dir it must stay inside that work dir (no ``../`` or absolute archive members, no
symlink or hardlink that points out of the tree, no device files or FIFOs) and stay small
enough not to fill the host's disk (archive bombs, huge files). Every refusal says which
entry broke which rule and how to fix the task.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
import stat
import tarfile

from legorl_jax.errors import TaskError


@dataclasses.dataclass(frozen=True)
class RepoLimits:
  """Size limits for one task repository (bytes are the sum of regular files' sizes)."""
  max_total_bytes: int = 2 << 30
  max_file_bytes: int = 512 << 20
  max_entries: int = 200_000


DEFAULT_LIMITS = RepoLimits()


def _inside(rel: str) -> bool:
  """Whether a normalised POSIX path relative to the root stays inside it."""
  return rel not in ("..", "") and not rel.startswith("../") and not posixpath.isabs(rel)


def link_target_inside(link_rel: str, target: str) -> bool:
  """Whether a symlink at ``link_rel`` (relative to the root) pointing to ``target`` resolves
  lexically inside the root. Absolute targets never count as inside: they point at whatever
  the sandbox or host has at that path."""
  if not target or posixpath.isabs(target) or "\x00" in target:
    return False
  return _inside(posixpath.normpath(posixpath.join(posixpath.dirname(link_rel), target)))


class _Budget:
  """Running totals against a RepoLimits; ``what`` names the source in errors."""

  def __init__(self, limits: RepoLimits, what: str):
    self.limits, self.what = limits, what
    self.entries = self.total = 0

  def add(self, rel: str, size: int) -> None:
    lim = self.limits
    self.entries += 1
    if self.entries > lim.max_entries:
      raise TaskError(f"{self.what} has more than {lim.max_entries} entries (an archive bomb?); "
                      "trim the repository or raise RepoLimits.max_entries")
    if size > lim.max_file_bytes:
      raise TaskError(f"{self.what}: {rel!r} is {size} bytes, over the {lim.max_file_bytes}-byte "
                      "limit per file; remove it from the repository or raise RepoLimits.max_file_bytes")
    self.total += size
    if self.total > lim.max_total_bytes:
      raise TaskError(f"{self.what} holds more than {lim.max_total_bytes} bytes (at {rel!r}; an "
                      "archive bomb?); trim the repository or raise RepoLimits.max_total_bytes")


def check_archive(tf: tarfile.TarFile, what: str, limits: RepoLimits = DEFAULT_LIMITS
                  ) -> list[tarfile.TarInfo]:
  """Validates every member of an open archive; returns them (in order) for extraction.

  Members are read one header at a time so an oversized archive is refused as soon as its
  declared sizes pass the limit, before the rest is decompressed.
  """
  budget, members = _Budget(limits, f"repository archive {what}"), []
  for m in tf:
    name = m.name
    rel = posixpath.normpath(name)
    where = f"repository archive {what}: member {name!r}"
    if "\x00" in name or posixpath.isabs(name):
      raise TaskError(f"{where} has an absolute path; archive members must be relative to the "
                      "repository root (rebuild it with `tar -C REPO -czf x.tgz .`)")
    if rel != "." and not _inside(rel):
      raise TaskError(f"{where} escapes the repository with '..'; archive members must stay "
                      "inside the repository root")
    if m.issym():
      if not link_target_inside(rel, m.linkname):
        raise TaskError(f"{where} is a symlink to {m.linkname!r}, outside the repository; "
                        "replace it with the file itself or a relative link inside the repository")
    elif m.islnk():
      target = posixpath.normpath(m.linkname)
      if posixpath.isabs(m.linkname) or not _inside(target):
        raise TaskError(f"{where} is a hardlink to {m.linkname!r}, outside the repository; "
                        "archive the file itself instead")
    elif m.issparse():
      raise TaskError(f"{where} is a sparse file; archive it as a regular file")
    elif not (m.isreg() or m.isdir()):
      raise TaskError(f"{where} is a device file or FIFO; repositories hold only files, "
                      "directories and links; remove it")
    budget.add(name, m.size if m.isreg() else 0)
    members.append(m)
  return members


def check_tree(root: str, what: str, limits: RepoLimits = DEFAULT_LIMITS) -> None:
  """Validates a directory tree without walking into links (the rules of ``check_archive``;
  each symlink must also resolve, through any other links, inside ``root``).

  Hardlinked regular files are allowed (``git clone`` of a local path hardlinks its objects);
  copying them copies their content, never the link.
  """
  budget = _Budget(limits, f"repository {what}")
  real_root = os.path.realpath(root)
  for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
    for name in dirnames + filenames:
      full = os.path.join(dirpath, name)
      rel = os.path.relpath(full, root).replace(os.sep, "/")
      try:
        st = os.lstat(full)
      except OSError as e:
        raise TaskError(f"repository {what}: cannot inspect {rel!r}: {e.strerror}") from None
      if stat.S_ISLNK(st.st_mode):
        target = os.readlink(full)
        # Lexically inside is not enough: a link through another link ("up" -> "sub/..",
        # "sub" -> ".") can still climb out, so resolve it for real too.
        real = os.path.realpath(full)
        if not link_target_inside(rel, target) or not (real + "/").startswith(real_root + "/"):
          raise TaskError(f"repository {what}: {rel!r} is a symlink to {target!r}, outside the "
                          "repository; replace it with the file itself or a relative link inside "
                          "the repository")
        budget.add(rel, 0)
      elif stat.S_ISREG(st.st_mode):
        budget.add(rel, st.st_size)
      elif stat.S_ISDIR(st.st_mode):
        budget.add(rel, 0)
      else:
        raise TaskError(f"repository {what}: {rel!r} is a device file, socket or FIFO; "
                        "repositories hold only files, directories and links; remove it")
