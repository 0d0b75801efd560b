"""Markers in text that streams in: how much of what came so far could still be a marker's start,
and so must wait for the next piece before it goes out as text."""


def partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of `text` that is a proper start of `marker`."""
    first = marker[0]
    at = text.find(first, max(0, len(text) - len(marker) + 1))
    while at >= 0:
        if marker.startswith(text[at:]):
            return len(text) - at
        at = text.find(first, at + 1)
    return 0
