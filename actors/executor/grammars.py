"""Structured output on the executor: each constraint compiled once for the served vocabulary, each
constrained sequence's place in its grammar, and the token masks of a step's constrained draws.

A constraint is compiled in a worker thread (xgrammar's compiler, from the served tokenizer's
vocabulary, padded to the model's), cached by its kind and text, so a new schema delays only its own
requests' first draw (the running batch plans none before it is ready) and never the step loop.
Each constrained sequence keeps an xgrammar `GrammarMatcher` that has accepted every output it drew,
those of a run before a preemption or a migration included (replayed when the run starts), so a
restarted run masks its next draw as the first run would have.

Steps overlap, so a decode's previous token is still on the device when its step is launched; its
mask can only be made once that token is known. `StepMasks` is what the runner calls after it has
enqueued the step's forward pass and before the draw: it waits for the step before's tokens, feeds
the constrained ones to their matchers, and fills the masks, all on the host while the device runs
the forward pass. The draw follows at once, so the device waits only if the host takes longer than
the forward pass.
"""

import os
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import numpy as np
import torch

from actors.lib.constraint_grammar import ConstraintError, grammar_of
from actors.lib.hf_tokenizer import load_tokenizer
from gpu.step_io import PendingStep, SequenceInput
from schemas.errors import Error
from schemas.generate import Constraint

if TYPE_CHECKING:
    import xgrammar  # imported where first used: it pulls in transformers, 1.3 s of CPU at every start

    from actors.executor.running_sequence import PlannedInput

COMPILED_GRAMMARS = 256  # kept, the least recently used dropped first
# Nearly every mask allows a token among a vocabulary's first ids (bytes, punctuation, digits: what
# a BPE learns first), so a mask is read whole only when none of these is allowed.
LEADING_WORDS = 64  # 2,048 ids


class SequenceGrammar:
    """One sequence's place in its grammar: a matcher that has accepted its first `accepted` outputs.
    It is made once the grammar is compiled (`ready`), replaying the outputs of earlier runs. A
    compile that failed, a mask that allows no token, or an output the grammar rejects sets `error`
    (the client's `Error`: "invalid_request" where the request asks for the impossible, "internal"
    for a token the mask should have kept out), and the sequence fails."""

    def __init__(self, compiled: Future | None, replay: list[int], error: Error | None = None) -> None:
        self._compiled = compiled
        self._replay = replay  # the outputs drawn before this run, fed to the matcher when it is made
        self.matcher: xgrammar.GrammarMatcher | None = None
        self.accepted = 0
        self.error = error  # set from the start when there is no compiled grammar to come

    def ready(self) -> bool:
        """Whether its next draw can be masked (or `error` says why it never will): the grammar is
        compiled and the matcher has replayed the outputs before this run."""
        if self.matcher is None and self.error is None:
            if not self._compiled.done():
                return False
            import xgrammar

            try:
                self.matcher = xgrammar.GrammarMatcher(self._compiled.result())
            except (ConstraintError, RuntimeError, OSError, ValueError) as exc:
                self.error = _invalid(f"the constraint does not compile for this model: {exc}")
                return True
            for token in self._replay:
                self.accept(self.accepted, token)
            self._replay = []
        return True

    def accept(self, output_index: int, token: int) -> None:
        """Feeds output `output_index`, once: an output it has accepted already is skipped (the masks
        of a launch feed the tokens of the step before, which its booking feeds again)."""
        if self.error is not None or output_index < self.accepted:
            return
        if self.matcher is None or output_index > self.accepted:
            self.error = _internal(f"output {output_index} came before the grammar had {self.accepted} of them")
        elif self.matcher.is_terminated() or not self.matcher.accept_token(token):
            self.error = _internal(f"the grammar does not allow token {token} at output {output_index}")
        else:
            self.accepted += 1

    def allows_nothing(self) -> None:
        """Its mask came out empty: the language ends nowhere from here (an empty character class, say)."""
        self.error = _invalid(f"the constraint allows no token after output {self.accepted}")

    def failure(self, param: str, bans_tokens: bool) -> Error:
        """Its `error`, naming `param`. A token the grammar refused is the request's own doing where
        its own masks or min_tokens (`bans_tokens`) may have left nothing the grammar allows."""
        error = msgspec.structs.replace(self.error, param=param)
        if error.code == "internal" and bans_tokens:
            message = f"{error.message}; its token masks or min_tokens may leave no token the grammar allows"
            error = msgspec.structs.replace(error, code="invalid_request", message=message)
        return error

    @property
    def terminated(self) -> bool:
        """The grammar has ended: it accepted an end token, and nothing may follow."""
        return self.matcher is not None and self.matcher.is_terminated()

    @property
    def masks(self) -> bool:
        """Whether its next draw is masked: it is ready, has not failed, and has not ended (the draw
        of a sequence that ended is discarded, so it is left unmasked)."""
        return self.matcher is not None and self.error is None and not self.matcher.is_terminated()


class Grammars:
    """The compiled grammars of one served model, from the tokenizer in `tokenizer_dir` (loaded in the
    worker thread on the first constraint). `on_compiled` is called from that thread after each
    compile: a loop that waits for work must plan the sequences that waited for it. `fill_threads`:
    how many threads fill a step's masks (default: half the cores, at most 8)."""

    def __init__(
        self,
        tokenizer_dir: str | Path,
        vocab_size: int,
        eos_token_ids: list[int],
        on_compiled: Callable[[], None] = lambda: None,
        fill_threads: int | None = None,
    ) -> None:
        self.tokenizer_dir = Path(tokenizer_dir)
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self.on_compiled = on_compiled
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-compile")
        self._compiler: xgrammar.GrammarCompiler | None = None  # made and used in the worker thread
        self._compiled: OrderedDict[tuple[str, str], Future] = OrderedDict()
        self.fill_threads = fill_threads or max(1, min(8, (os.cpu_count() or 2) // 2))
        self._batch: xgrammar.BatchGrammarMatcher | None = None

    @property
    def batch(self) -> "xgrammar.BatchGrammarMatcher":
        """Fills many rows' masks on `fill_threads` threads; made at the first constrained step."""
        if self._batch is None:
            import xgrammar

            self._batch = xgrammar.BatchGrammarMatcher(self.fill_threads)
        return self._batch

    def start(self, constraint: Constraint, replay: list[int]) -> SequenceGrammar:
        """The grammar state of a sequence starting under `constraint`, whose earlier runs drew `replay`."""
        return SequenceGrammar(self.compile(constraint), replay)

    def compile(self, constraint: Constraint) -> Future:
        """The compiled grammar of `constraint`, from the cache or from a compile started now."""
        key = (constraint.kind, constraint.text)
        future = self._compiled.get(key)
        if future is None:
            future = self._pool.submit(self._compile, constraint)
            future.add_done_callback(lambda _: self.on_compiled())
            self._compiled[key] = future
            if len(self._compiled) > COMPILED_GRAMMARS:
                self._compiled.popitem(last=False)
        else:
            self._compiled.move_to_end(key)
        return future

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _compile(self, constraint: Constraint) -> "xgrammar.CompiledGrammar":
        import xgrammar

        if self._compiler is None:
            tokenizer = load_tokenizer(self.tokenizer_dir)
            # The model's vocabulary may be wider than the tokenizer's: the ids past it are never allowed.
            info = xgrammar.TokenizerInfo.from_huggingface(
                tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.eos_token_ids
            )
            # Our cache keeps the compiled grammars; xgrammar's would keep a second copy of each.
            self._compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)
        return self._compiler.compile_grammar(grammar_of(constraint))


def start_grammar(
    grammars: Grammars | None, constraint: Constraint | None, replay: list[int]
) -> SequenceGrammar | None:
    """The grammar state of a sequence starting under `constraint` (None: unconstrained), whose
    earlier runs drew `replay`; one that fails at once where there are no `grammars` (the served
    model has no tokenizer)."""
    if constraint is None:
        return None
    if grammars is None:
        return SequenceGrammar(None, [], _invalid("the served model has no tokenizer to constrain decoding with"))
    return grammars.start(constraint, replay)


class StepMasks:
    """The token masks of one launch's constrained draws; the runner calls it with the step's host
    bitmask [R, ceil(V/32)] int32 (every row all allowed) once the forward pass is enqueued, and
    applies it before the draw. `rows`: (row among the drawing rows, its grammar). `previous`: the
    step launched before, not yet booked, whose constrained tokens the masks must follow."""

    def __init__(
        self,
        rows: list[tuple[int, SequenceGrammar]],
        previous: "tuple[PendingStep, list[PlannedInput]] | None",
        batch: "xgrammar.BatchGrammarMatcher",
    ) -> None:
        self.rows = rows
        self.previous = previous
        self.batch = batch

    @classmethod
    def of(
        cls,
        inputs: list[SequenceInput],
        plan: "list[PlannedInput]",
        previous: "tuple[PendingStep, list[PlannedInput]] | None",
        grammars: Grammars | None,
    ) -> "StepMasks | None":
        """The masks of the step of `inputs` (planned as `plan`), or None when none of its draws is
        constrained. `previous`: the step launched before it, not yet booked."""
        if grammars is None:
            return None
        rows, drawn = [], 0
        for sequence_input, planned in zip(inputs, plan):
            if sequence_input.sample:
                if planned.seq.grammar is not None:
                    rows.append((drawn, planned.seq.grammar))
                drawn += 1
        if not rows:
            return None
        if previous is not None and not any(p.seq.grammar is not None for p in previous[1]):
            previous = None  # nothing it draws is constrained: no need to wait for it
        return cls(rows, previous, grammars.batch)

    def __call__(self, bitmask: torch.Tensor) -> None:
        if self.previous is not None:
            pending, plan = self.previous
            accept_drawn(plan, pending.tokens())  # waits for the step before (its forward ran first)
        masking = {row: grammar for row, grammar in self.rows if grammar.masks}
        rows = list(masking)
        if len(rows) == 1:
            masking[rows[0]].matcher.fill_next_token_bitmask(bitmask, rows[0])
        elif rows:
            self.batch.batch_fill_next_token_bitmask([g.matcher for g in masking.values()], bitmask, rows)
        for row in rows_allowing_nothing(bitmask, rows):
            masking[row].allows_nothing()  # its draw is then refused, and it fails


def rows_allowing_nothing(bitmask: torch.Tensor, rows: list[int]) -> list[int]:
    """The rows among `rows` of the host bitmask [R, words] int32 with no bit set. Read with numpy,
    on this thread and mostly a few words a row: torch's ops over the whole bitmask (a copy of the
    rows, a comparison, a reduction) each ran on its intra-op threads, a region that ends in a
    barrier across every core and so waits for the busiest, on the step's path."""
    words = bitmask.numpy()
    suspects = np.flatnonzero(~words[rows, :LEADING_WORDS].any(axis=1))
    return [rows[i] for i in suspects if not words[rows[i]].any()]


def accept_drawn(plan: "list[PlannedInput]", tokens: list[int | None]) -> None:
    """Feeds a step's drawn tokens to the grammars of the constrained sequences that drew them."""
    for planned, token in zip(plan, tokens):
        if token is not None and planned.seq.grammar is not None:
            planned.seq.grammar.accept(planned.output_index, token)


def _invalid(message: str) -> Error:
    return Error("invalid_request", f"structured output: {message}")


def _internal(message: str) -> Error:
    return Error("internal", f"structured output: {message}")
