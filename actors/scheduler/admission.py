"""The admission of a waiting sequence to the running batch: whether the blocks for its uncached
tokens can be had, and the commands that start its run on the executor. The batcher
(batching.py) decides whom to admit, in arrival order; these functions admit one.
"""

from actors.scheduler.kv_manager import KVManager
from actors.scheduler.request_table import RequestTable
from actors.scheduler.sequence import Sequence, State
from schemas.step import Command, StartSequence


def admit(seq: Sequence, requests: RequestTable, kv: KVManager) -> list[Command] | None:
    """Starts `seq` if blocks for all its uncached tokens can be had, and returns the commands that
    start it on the executor, in the order it applies them; None if `seq` must wait (the loads `kv`
    queued for its prefix stay there, for the round). It reads the cached prefix's shared blocks and
    writes only its own, after them; a choice whose parent computed the prompt forks the parent's
    blocks instead."""
    parent = requests.get(seq.fork_of) if seq.fork_of and not seq.output_ids else None
    if parent is not None and (parent.prefilling or parent.state is State.DRAINING):
        return None  # the prompt is being computed, once for every choice
    commands: list[Command] = []
    if parent is not None and parent.state is State.RUNNING:
        copy = kv.fork(seq, parent)
        if copy is None:
            return None
        commands.append(copy)
        computed = len(seq.prompt_ids) - 1  # the prompt's last token again, for this choice's logits
    elif kv.start(seq):
        computed = seq.cached.num_tokens
    else:
        return None
    commands += kv.take_commands()  # loads of its prefix from the host: before its start
    requests.start(seq)
    seq.start_run(computed)
    commands.append(start_command(seq, computed))
    return commands


def start_command(seq: Sequence, computed: int) -> StartSequence:
    """The command that starts a run of `seq` whose first `computed` tokens are in its blocks. A
    penalty counts the prompt (the repetition penalty) and the outputs before a preemption; a
    constraint's grammar replays those outputs."""
    p = seq.params
    penalized = p.repetition_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0
    return StartSequence(
        seq.request_id,
        seq.params,
        list(seq.blocks),
        len(seq.output_ids),
        computed,
        penalty_prompt_ids=list(seq.prompt_ids) if p.repetition_penalty != 1.0 else [],
        output_ids=list(seq.output_ids) if penalized or p.constraint is not None else [],
        pooling=seq.pooling,
    )
