"""How much prompt the executor gets, and when: the prefill budget of a scheduling round, the
chunks that spend it, and which waiting requests wait for a prefill they can read instead of
computing the same tokens again."""

from actors.scheduler.kv_manager import KVManager
from actors.scheduler.sequence import Sequence
from schemas.step import PrefillChunk

# Prompt tokens sent ahead of what the executor has reported computed, in steps' budgets. The
# executor plans a step as soon as it publishes the output of the step before last, so the commands
# answering an output reach it two plans later: the chunks it needs meanwhile, for the step on the
# device, the one launched behind it and the next, must already be there, or it runs steps with
# less prefill than the budget allows.
PREFILL_STEPS_AHEAD = 3


class PrefillPlanner:
    """Invariants: prompt tokens sent and not yet reported computed, over all running sequences,
    stay within `PREFILL_STEPS_AHEAD` step budgets (`max_prefill_tokens` each); a run's chunks go
    out in order, each token once, the last one marked."""

    def __init__(self, max_prefill_tokens: int) -> None:
        self.max_prefill_tokens = max_prefill_tokens

    def budget(self, running: list[Sequence]) -> int:
        """The prompt tokens this round may send."""
        in_flight = sum(s.prefill_sent - s.prefill_done for s in running)
        return PREFILL_STEPS_AHEAD * self.max_prefill_tokens - in_flight

    def next_chunk(self, seq: Sequence, budget: int) -> PrefillChunk:
        """The next chunk of `seq`'s prefill, at most `budget` tokens, counted as sent."""
        start = seq.prefill_sent
        end = min(len(seq.prefill_ids), start + budget)
        seq.prefill_sent = end
        last = end == len(seq.prefill_ids)
        # A run that scores its prompt scores the token after the chunk at the chunk's last position.
        next_token = seq.prefill_ids[end] if seq.scores_prompt and not last else None
        return PrefillChunk(seq.request_id, seq.prefill_ids[start:end], start, last, next_token)

    def awaits_shared_prefill(self, seq: Sequence, running: list[Sequence], kv: KVManager) -> bool:
        """Whether a running request of the same tenant is computing blocks of `seq`'s tokens that
        the cache lacks. Admitted once that prefill is done, `seq` reads them from the cache instead
        of computing them again: requests that arrive together with one system prompt compute it once."""
        peers = [o for o in running if o.prefilling and o.tenant == seq.tenant]
        if seq.fork_of or not kv.cache.enabled or not peers:
            return False  # and no tree walk beside the admission's, in the common case
        tokens = kv.lookup_tokens(seq)
        cached = kv.cache.match(tokens, seq.tenant)  # a read: the request's lookup is recorded at its start
        end = (len(cached.blocks) + 1) * kv.block_size  # one block past what the cache has
        if end >= len(tokens):
            return False
        head = tokens[:end]
        return any(o.prefill_ids[:end] == head for o in peers)
