"""Loads into the KV pool that land layer by layer (gpu/kv_transfer.py), and the waits that order
them with the step's work: a step writes and reads layer i once every load's layer i has landed,
not once the whole load has, so a prompt whose prefix comes back from the host computes while the
later layers still cross PCIe. Writes wait too: a block that the scheduler evicted while its load
was still landing may already be another sequence's, whose new KV must land after the load's.

Whatever reads the pool outside a forward pass (a decode graph, which cannot wait inside itself; a
copy of blocks; a save) waits for the whole of every load first, and so does the
current stream after each forward pass (`settle`): work queued later sees every loaded block whole.
"""

import torch


class LayerArrivals:
    """The per-layer events of the loads not yet waited for, oldest first, and the stream that waits
    for them: the one current when they were issued, the step's. On the CPU, where a load is done
    when it returns, there are none."""

    def __init__(self) -> None:
        self._pending: list[list[torch.cuda.Event]] = []  # each load's events, one per layer
        self._stream: torch.cuda.Stream | None = None

    def add(self, layer_events: list[torch.cuda.Event], stream: torch.cuda.Stream) -> None:
        """A load's events, which `stream` (the step's) is to wait for."""
        self._pending.append(layer_events)
        self._stream = stream

    def wait_for(self, layer: int) -> None:
        """Makes the step's stream wait until layer `layer` of every pending load has landed."""
        for events in self._pending:
            self._stream.wait_event(events[layer])

    def wait_whole(self, stream: torch.cuda.Stream) -> None:
        """Makes `stream` (another than the step's: a save's) wait until every pending load has
        landed whole; they stay pending for the step's stream."""
        for events in self._pending:
            stream.wait_event(events[-1])

    def settle(self) -> None:
        """Makes the step's stream wait until every pending load has landed whole: none is pending
        after."""
        if self._pending:
            self.wait_whole(self._stream)
            self._pending.clear()

    @property
    def pending(self) -> bool:
        return bool(self._pending)
