"""What the executor keeps of one admitted sequence (`RunningSequence`), and what one input of a
step stands for (`PlannedInput`), to book that input's result once the step ran."""

from collections import deque
from dataclasses import dataclass, field

from actors.executor.grammars import SequenceGrammar
from actors.executor.prompt_pool import PromptPool
from gpu.logit_rules import TokenRules
from schemas.generate import SamplingParams
from schemas.step import PrefillChunk


@dataclass
class RunningSequence:
    request_id: str
    params: SamplingParams
    block_table: list[int]
    num_outputs: int  # output tokens drawn by the steps launched so far, before a preemption included
    position: int = 0  # tokens whose KV the steps launched so far write
    chunks: deque[PrefillChunk] = field(default_factory=deque)
    last_token: int | None = None  # drawn and booked, not yet fed back
    pending: "PlannedInput | None" = None  # the launched input whose drawn token is fed next, not yet booked
    exhausted: bool = False  # the last token planned reaches max_tokens or the context: nothing more to plan
    stop_ids: frozenset[int] = frozenset()
    cached_tokens: int | None = None  # reported in the first update, then None
    booked_outputs: int = 0  # output tokens in the step outputs so far (before a preemption included)
    # The prompt position from which its prompt tokens are scored; None: not scored. Only a run with
    # no outputs yet scores: a later one's prefill holds outputs, and its client has the prompt's.
    scores_from: int | None = None
    rules: TokenRules | None = None  # penalties, bias, masks, min_tokens: built at its start
    pool: PromptPool | None = None  # an embedding's pooling of its prompt (prompt_pool.py)
    grammar: SequenceGrammar | None = None  # its constraint's state (structured output)


@dataclass(frozen=True)
class PlannedInput:
    """What one `SequenceInput` of a step stands for, to book its result afterwards."""

    seq: RunningSequence
    row: int  # its index among the step's inputs
    prefill_tokens: int  # 0 for a decode
    output_index: int  # of the token it draws (of the next one when it draws none)
    last: bool  # the sequence ends with this input: its token reaches max_tokens or the context (or, with
    # max_tokens 0, its prompt's last chunk draws none)
    scored_start: int = -1  # the prompt position of its first scored target; -1: it scores none
    pooled_tokens: int = 0  # its last tokens whose hidden states an embedding pools
