"""The cache_tier writes the blocks of one spill that follow one another as one chain file."""

from actors.cache_tier.actor import chain_runs


def test_blocks_that_follow_one_another_make_one_run():
    a, b, c, x, y = (bytes([n]) * 16 for n in range(5))
    # a <- b <- c is one prompt's chain; x starts another; y follows a, not x
    assert chain_runs([a, b, c, x, y], [b"r" * 16, a, b, b"r" * 16, a]) == [(0, 3), (3, 4), (4, 5)]
    assert chain_runs([], []) == []
