"""SlotTable: session binding, prefix matching, LRU eviction."""

from legorl_jax.sampling.slots import SlotTable, common_prefix_len


def test_common_prefix_len():
  assert common_prefix_len([1, 2, 3], [1, 2, 4, 5]) == 2
  assert common_prefix_len([1, 2], [1, 2, 3]) == 2
  assert common_prefix_len([], [1]) == 0
  assert common_prefix_len([9], [1]) == 0


def test_session_reuses_its_row_up_to_last_prompt_token():
  t = SlotTable(2)
  slot, reuse = t.acquire([1, 2, 3], "a")
  assert reuse == 0
  t.release(slot, [1, 2, 3, 7, 8], "a")  # prompt + sampled (minus the unfed last token)
  assert t.acquire([1, 2, 3, 7, 8, 9, 10], "a") == (slot, 5)
  t.release(slot, [1, 2, 3, 7, 8, 9], "a")
  # A resend of exactly the cached history still feeds its last token through decode.
  assert t.acquire([1, 2, 3, 7, 8, 9], "a") == (slot, 5)
  t.release(slot, [1, 2, 3, 7, 8, 9], "a")
  # Divergent history: only the common prefix is reused.
  assert t.acquire([1, 2, 5, 5], "a") == (slot, 2)


def test_sessionless_request_takes_best_unbound_prefix_and_leaves_sessions_alone():
  t = SlotTable(4)
  asks = (([1, 2, 3], "sess"), ([7], None), ([4, 5, 6], None))
  rows = [t.acquire(p, sess)[0] for p, sess in asks]
  for row, cached, sess in zip(rows, ([1, 2, 3, 4], [7, 7], [4, 5, 6, 7]), ("sess", None, None)):
    t.release(row, cached, sess)
  assert t.acquire([4, 5, 6, 9], None) == (rows[2], 3)  # longest prefix beats lower index
  assert t.acquire([1, 2, 3, 4, 5], None) == (rows[1], 0)  # the session's row is not up for grabs


def test_lru_eviction_and_busy_rows():
  t = SlotTable(2)
  a, _ = t.acquire([1, 1], "a")
  t.release(a, [1, 1, 1], "a")
  b, _ = t.acquire([2, 2], "b")
  t.release(b, [2, 2, 2], "b")
  t.acquire([1, 1, 1, 1], "a")  # touches a -> b is now least recently used
  t.release(a, [1, 1, 1, 1], "a")
  c, reuse = t.acquire([3, 3], "c")
  assert c == b and reuse == 0 and t.evictions == 1 and "b" not in t.sessions
  assert t.acquire([1, 1, 1, 1, 5], "a") == (a, 4)
  assert t.acquire([9, 9], None) is None  # both rows busy
  assert t.num_free() == 0


def test_busy_session_row_gets_a_second_row_and_last_release_wins():
  t = SlotTable(2)
  a, _ = t.acquire([1, 2], "s")
  b, _ = t.acquire([1, 2], "s")  # own row busy -> another row, no reuse
  assert b != a
  t.release(a, [1, 2, 3], "s")
  t.release(b, [1, 2, 4], "s")
  assert t.sessions["s"] == b and t.slots[a].session is None
  assert t.acquire([1, 2, 4, 5], "s") == (b, 3)


def test_invalidate_and_reuse_off():
  t = SlotTable(1)
  a, _ = t.acquire([1, 2], "s")
  t.release(a, [1, 2, 3], "s")
  t.invalidate()
  assert t.acquire([1, 2, 3, 4], "s") == (a, 0)
  off = SlotTable(1, reuse=False)
  a, _ = off.acquire([1, 2], "s")
  off.release(a, [1, 2, 3], "s")
  assert off.acquire([1, 2, 3, 4], "s") == (a, 0)
