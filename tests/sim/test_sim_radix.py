"""The radix tree (match, insert, split, locks, LRU eviction) and the KV budget built on it."""

from __future__ import annotations

import random

import pytest

from backends.sim.kvcache import Hold, KVCache
from backends.sim.radix import RadixTree, TreeNode


def prefixes(keys: list[list[int]]) -> set[tuple[int, ...]]:
    """Every non-empty prefix of the keys: what a tree holding them stores, one token each."""
    return {tuple(key[:n]) for key in keys for n in range(1, len(key) + 1)}


def test_empty_tree_matches_nothing() -> None:
    tree = RadixTree()
    match = tree.match_prefix([1, 2, 3])
    assert match.length == 0 and match.node is tree.root and tree.size == 0


def test_insert_reports_what_was_there_and_stores_a_shared_prefix_once() -> None:
    tree = RadixTree()
    assert tree.insert([1, 2, 3, 4]) == 0
    assert tree.insert([1, 2, 3, 4]) == 4
    assert tree.insert([1, 2, 5]) == 2
    assert tree.size == 5 == tree.evictable_size  # 1 2 3 4 and 5, nothing locked
    assert tree.match_prefix([1, 2, 5, 6]).length == 3
    assert tree.match_prefix([9]).length == 0


def test_a_match_ending_inside_a_node_splits_it_at_the_boundary() -> None:
    tree = RadixTree()
    tree.insert([1, 2, 3, 4, 5, 6])
    match = tree.match_prefix([1, 2, 3, 9])
    assert match.length == 3 and match.node.key == [1, 2, 3]
    assert [child.key for child in match.node.children.values()] == [[4, 5, 6]]
    assert tree.size == 6  # a split moves tokens, it adds none
    assert tree.insert([1, 2, 3, 7]) == 3 and tree.size == 7


def test_tree_agrees_with_a_set_of_prefixes() -> None:
    rng = random.Random(5)
    tree = RadixTree()
    keys: list[list[int]] = []
    for _ in range(300):
        key = [rng.randrange(4) for _ in range(rng.randint(1, 12))]
        stored = prefixes(keys)
        expected = max((n for n in range(len(key) + 1) if n == 0 or tuple(key[:n]) in stored), default=0)
        assert tree.peek(key) == expected
        if rng.random() < 0.5:
            assert tree.match_prefix(key).length == expected
        assert tree.insert(key) == expected
        keys.append(key)
        assert tree.size == len(prefixes(keys))


def test_peek_changes_neither_the_tree_nor_its_recency() -> None:
    tree = RadixTree()
    tree.insert([1, 1, 1])
    tree.insert([2, 2, 2])
    assert tree.peek([1, 1, 9]) == 2
    assert len(tree.root.children[1].children) == 0  # not split
    tree.evict(1)  # [1, 1, 1] is still the least recently used
    assert tree.peek([1, 1, 1]) == 0 and tree.peek([2, 2, 2]) == 3


def test_eviction_takes_least_recently_used_leaves_first() -> None:
    tree = RadixTree()
    for first in (1, 2, 3):
        tree.insert([first] * 4)
    tree.match_prefix([1, 1])  # 1 becomes the most recently used
    assert tree.evict(1) == 4  # a whole leaf goes, though one token was asked for
    assert [tree.peek([k] * 4) for k in (1, 2, 3)] == [4, 0, 4]
    tree.evict(1)
    assert [tree.peek([k] * 4) for k in (1, 2, 3)] == [4, 0, 0]


def test_a_parent_left_without_children_is_evicted_in_turn() -> None:
    tree = RadixTree()
    tree.insert([1, 2, 3])
    tree.insert([1, 2, 4])
    assert tree.evict(2) == 2  # both leaves (3 and 4): the shared [1, 2] is not a leaf until then
    assert tree.size == 2
    assert tree.evict(1) == 2 and tree.size == 0


def test_locked_paths_are_protected_until_unlocked() -> None:
    tree = RadixTree()
    tree.insert([1, 2, 3, 4])
    tree.insert([1, 2, 7, 8])
    held = tree.match_prefix([1, 2, 3, 4, 5]).node
    tree.lock(held)
    tree.lock(held)  # two requests share the prefix
    assert (tree.protected_size, tree.evictable_size) == (4, 2)
    assert tree.evict(100) == 2 and tree.peek([1, 2, 3, 4]) == 4 and tree.peek([1, 2, 7]) == 2
    tree.unlock(held)
    assert tree.evict(100) == 0  # still one holder
    tree.unlock(held)
    assert (tree.protected_size, tree.evictable_size) == (0, 4)
    assert tree.evict(100) == 4 and tree.size == 0


def test_a_split_keeps_the_locks_of_the_node_it_cuts() -> None:
    tree = RadixTree()
    tree.insert([1, 2, 3, 4])
    held = tree.match_prefix([1, 2, 3, 4]).node
    tree.lock(held)
    tree.insert([1, 2, 9])  # splits the locked node
    assert (tree.protected_size, tree.evictable_size) == (4, 1)
    tree.unlock(held)
    assert (tree.protected_size, tree.evictable_size) == (0, 5)


def test_reset_forgets_everything() -> None:
    tree = RadixTree()
    tree.insert([1, 2, 3])
    tree.reset()
    assert tree.size == 0 and tree.peek([1, 2, 3]) == 0


def test_pair_keys_behave_as_a_tree_keyed_on_the_pairs() -> None:
    """An EAGLE server's tree, stored as tokens, against the same operations on explicit token pairs."""
    rng = random.Random(3)
    tokens, pairs = RadixTree(pair_keys=True), RadixTree()
    held: list[tuple[TreeNode, TreeNode]] = []
    stems = [[rng.randrange(3) for _ in range(8)] for _ in range(3)]
    for _ in range(3000):
        key = rng.choice(stems)[: rng.randint(0, 8)] + [rng.randrange(3) for _ in range(rng.randint(0, 6))]
        paired = list(zip(key, key[1:], strict=False))
        op = rng.random()
        if op < 0.35:
            assert tokens.insert(key) == pairs.insert(paired)
        elif op < 0.65:
            a, b = tokens.match_prefix(key), pairs.match_prefix(paired)
            assert a.length == b.length
            if rng.random() < 0.3:
                tokens.lock(a.node)
                pairs.lock(b.node)
                held.append((a.node, b.node))
        elif op < 0.8:
            assert tokens.peek(key) == pairs.peek(paired)
        elif op < 0.9 and held:
            a_node, b_node = held.pop(rng.randrange(len(held)))
            tokens.unlock(a_node)
            pairs.unlock(b_node)
        else:
            wanted = rng.randint(1, 10)
            assert tokens.evict(wanted) == pairs.evict(wanted)
        assert (tokens.evictable_size, tokens.protected_size) == (pairs.evictable_size, pairs.protected_size)


# ----- the KV budget -----


def test_admission_counts_evictable_tokens_as_room_and_evicts_the_shortfall() -> None:
    kv = KVCache(100)
    old = kv.admit(kv.match([1] * 60, 59), 60, 10)
    assert old is not None
    kv.release(old, [1] * 60)  # 60 tokens cached, none locked: free 40, evictable 60
    assert (kv.free, kv.tree.evictable_size) == (40, 60)
    hold = kv.admit(kv.match([2] * 30, 29), 30, 40)  # needs 70: more than free, less than free + evictable
    assert hold is not None and hold.cached == 0
    assert kv.tree.size == 0 and kv.free == 30
    assert kv.admit(kv.match([3] * 30, 29), 30, 1) is None  # 31 > 30 free and nothing evictable


def test_a_requests_own_prefix_is_locked_before_room_is_made() -> None:
    kv = KVCache(100)
    first = kv.admit(kv.match(list(range(50)), 49), 50, 0)
    assert first is not None
    kv.release(first, list(range(50)))
    # It would reuse the 50 cached tokens: evicting them would make no room at all.
    assert kv.admit(kv.match(list(range(60)), 59), 60, 45) is None  # 10 + 45 > 50 free
    assert kv.tree.size == 50  # refused without evicting anything
    fits = kv.admit(kv.match(list(range(60)), 59), 60, 40)  # 10 + 40 of the 50 free
    assert fits is not None and fits.cached == 50 and kv.free == 0


def test_capacity_is_never_exceeded_and_only_unlocked_tokens_are_evicted() -> None:
    rng = random.Random(11)
    kv = KVCache(400)
    stems = [[rng.randrange(50) for _ in range(40)] for _ in range(4)]
    holds: list[tuple[Hold, list[int], list[int]]] = []
    for _ in range(400):
        if holds and (rng.random() < 0.45 or len(holds) > 6):
            held, prompt, output = holds.pop(rng.randrange(len(holds)))
            kv.release(held, prompt + output)
        else:
            prompt = rng.choice(stems)[: rng.randint(5, 40)] + [rng.randrange(50) for _ in range(rng.randint(1, 30))]
            max_new = rng.randint(1, 40)
            admitted = kv.admit(kv.match(prompt, len(prompt) - 1), len(prompt), max_new)
            if admitted is not None:
                output = [rng.randrange(50) for _ in range(rng.randint(0, max_new - 1))]  # the last token has no KV
                holds.append((admitted, prompt, output))
        assert kv.tree.size + kv.reserved <= kv.capacity
        assert kv.tree.protected_size <= sum(h.cached for h, _, _ in holds)
        for hold, prompt, _ in holds:
            assert kv.tree.peek(prompt[: hold.cached]) == hold.cached  # eviction never took a locked prefix


def test_an_eagle_server_keys_bigrams_and_reuses_one_token_less() -> None:
    for bigram_keys, reused in ((False, 10), (True, 9)):
        kv = KVCache(1000, bigram_keys=bigram_keys)
        prompt = list(range(10))
        hold = kv.admit(kv.match(prompt, 9), 10, 5)
        assert hold is not None
        kv.release(hold, prompt)
        assert kv.match(prompt + [99], 10).length == reused
        assert kv.tree.size == 10 - bigram_keys


@pytest.mark.parametrize("limit", [0, 5])
def test_disabled_cache_matches_nothing_and_keeps_nothing(limit: int) -> None:
    kv = KVCache(100, enabled=False)
    hold = kv.admit(kv.match([1] * 6, limit), 6, 4)
    assert hold is not None and hold.cached == 0 and kv.free == 90
    kv.release(hold, [1] * 6)
    assert kv.tree.size == 0 and kv.free == 100 and kv.peek([1] * 6, 5) == 0
