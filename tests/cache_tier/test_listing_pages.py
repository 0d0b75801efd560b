"""The cache_tier actor on a real nats-server lists a disk in pages, so that a disk holding more
hashes than one bus message can carry is listed whole, and no block is skipped when others come
and go between the pages."""

import msgspec

from actors.cache_tier import actor as cache_tier_actor
from schemas.cache import BlocksListed, BlocksSpilled, DiskFigures, ListBlocks
from schemas.errors import Error
from tests.cache_tier.test_lanes import NAMESPACE, ask, spill


async def test_a_listing_comes_in_pages_that_hold_every_block(cache_tier, monkeypatch):
    monkeypatch.setattr(cache_tier_actor, "LIST_PAGE_BLOCKS", 2)
    bus, segment = cache_tier
    spilled, _ = await ask(bus, spill(segment, [0, 1, 2, 3, 4], 0))
    assert isinstance(spilled, BlocksSpilled) and len(spilled.stored) == 5
    pages, start = [], 0
    while start is not None:
        page, _ = await ask(bus, ListBlocks(segment.name, NAMESPACE, start))
        assert isinstance(page, BlocksListed) and len(page.hashes) <= 2
        pages.append(page.hashes)
        start = page.next_start
        if len(pages) == 1:  # blocks come between the pages: the pages are still cut from one listing
            assert isinstance((await ask(bus, spill(segment, [5, 6, 7], 100)))[0], BlocksSpilled)
    assert len(pages) == 3
    assert sorted(h for page in pages for h in page) == sorted(spilled.stored)
    # The listing is over: a page of it asked again is refused, and the scheduler lists anew.
    refused, _ = await ask(bus, ListBlocks(segment.name, NAMESPACE, 2))
    assert isinstance(refused, Error) and refused.retriable


def test_a_full_page_fits_the_bus_default_payload_limit():
    hashes = [i.to_bytes(16, "little") for i in range(cache_tier_actor.LIST_PAGE_BLOCKS + 5)]
    page = cache_tier_actor.page_of(hashes, 0, DiskFigures(len(hashes), 1 << 40, 1 << 41))
    assert page.next_start == cache_tier_actor.LIST_PAGE_BLOCKS
    assert len(msgspec.msgpack.encode(page)) < 1 << 20  # nats-server's default max_payload
