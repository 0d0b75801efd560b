"""The check after a step's masks are filled (actors/executor/grammars.py): it finds exactly the rows
whose mask allows nothing, wherever a row's allowed tokens lie (it reads most rows only in part).
"""

import torch

from actors.executor.grammars import LEADING_WORDS, rows_allowing_nothing


def test_rows_allowing_nothing_are_those_with_no_bit_set():
    bitmask = torch.full((6, 4008), -1, dtype=torch.int32)  # 128,256 tokens
    bitmask[1] = 0  # allows nothing
    bitmask[2] = 0
    bitmask[2, -1] = 1 << 9  # one token far past the leading words (an end token, say)
    bitmask[3, :LEADING_WORDS] = 0  # nothing among the first ids, much after
    bitmask[4] = 0
    bitmask[4, LEADING_WORDS] = 1  # the first id past the leading words
    assert rows_allowing_nothing(bitmask, [0, 1, 2, 3, 4, 5]) == [1]
    assert rows_allowing_nothing(bitmask, [4, 2, 0]) == []
    assert rows_allowing_nothing(bitmask, [5, 1]) == [1]
