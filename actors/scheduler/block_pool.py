"""KV cache block ids and their reference counts. The scheduler is their single owner; the
executor only ever sees the ids it is granted."""

from collections import deque


class BlockPool:
    """Fixed-size blocks, handed out all-or-nothing, freed when their last reference goes."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._refs = [0] * num_blocks

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, count: int) -> list[int] | None:
        """`count` fresh blocks with one reference each, or None (and nothing taken) if too few are free."""
        if count > len(self._free):
            return None
        blocks = [self._free.popleft() for _ in range(count)]
        for block in blocks:
            self._refs[block] = 1
        return blocks

    def retain(self, blocks: list[int]) -> None:
        """One more holder for blocks already in use (a shared prefix)."""
        for block in blocks:
            if self._refs[block] == 0:
                raise ValueError(f"block {block} is free and cannot be shared")
            self._refs[block] += 1

    def release(self, blocks: list[int]) -> None:
        for block in blocks:
            if self._refs[block] == 0:
                raise ValueError(f"block {block} released twice")
            self._refs[block] -= 1
            if self._refs[block] == 0:
                self._free.append(block)

    def ref_count(self, block: int) -> int:
        return self._refs[block]
