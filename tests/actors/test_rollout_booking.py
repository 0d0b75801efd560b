"""What the executor's running batch asks of the runner and books for rollouts, on the plain
objects: the logprob fields of each input, the prompt positions each prefill chunk scores (cut
where the step's budget ends), logprobs in the updates of the requests that asked, a prompt
computed alone (max_tokens 0), and the end of an aborted sequence."""

from actors.executor.running_batch import RunningBatch
from gpu.step_io import PositionLogprobs, StepLogprobs
from schemas.generate import SamplingParams, TokenLogprobs
from schemas.step import DropSequence, PrefillChunk, SequenceUpdate, StartSequence

PROMPT = [11, 12, 13, 14, 15, 16, 17, 18]
EOS = 2


def started(params: SamplingParams, prompt: list[int] = PROMPT, request_id: str = "r") -> RunningBatch:
    """A batch running one sequence whose prompt the scheduler sent as two chunks, 5 tokens then 3
    (the first naming the token after it when the prompt is scored, as the scheduler does)."""
    batch = RunningBatch(block_size=4, max_model_len=64, eos_token_ids=[EOS], vocab_size=1000)
    batch.apply(StartSequence(request_id, params, [0, 1, 2, 3], 0, 0))
    scored = params.prompt_logprobs_from is not None
    batch.apply(PrefillChunk(request_id, prompt[:5], 0, False, prompt[5] if scored else None))
    batch.apply(PrefillChunk(request_id, prompt[5:], 5, True))
    return batch


def positions(values: list[float], top: int = 0, ids: int = 0) -> PositionLogprobs:
    """Logprobs as a runner returns them: empty per-position lists where none were asked."""
    return PositionLogprobs(
        values,
        [list(range(top)) for _ in values],
        [[-1.0 - i for i in range(top)] for _ in values],
        [[-2.0] * ids for _ in values],
    )


def test_chunks_cut_at_the_budget_score_every_prompt_position_from_the_first_asked_once():
    params = SamplingParams(max_tokens=2, prompt_logprobs_from=2, top_logprobs=2, logprob_token_ids=[5])
    batch = started(params)
    scored, booked, fed = [], [], []
    for budget in (3, 3, 3):  # the first chunk cut after 3 tokens, its rest, then the last chunk
        inputs, plan = batch.plan_step(budget)
        (one,) = inputs
        assert (one.top_logprobs, one.logprob_token_ids, one.logprobs) == (2, (5,), False)
        fed.append(len(one.token_ids))
        # target i follows fed position scored_from + i: the next prompt token, never the drawn one
        assert list(one.scored_targets) == [
            PROMPT[one.start_position + i + 1]
            for i in range(one.scored_from, one.scored_from + len(one.scored_targets))
        ]
        scored += [one.start_position + one.scored_from + 1 + i for i in range(len(one.scored_targets))]
        values = [-float(p) for p in range(len(one.scored_targets))]
        step = StepLogprobs(None, positions(values, top=2, ids=1))
        booked += batch.book(plan, [9 if one.sample else None], [step])
    assert fed == [3, 2, 3]
    assert scored == [2, 3, 4, 5, 6, 7]  # from position 2 to the last, which the draw follows
    starts = [u.prompt_logprobs.start for u in booked]
    assert starts == [2, 4, 6]
    assert booked[0].prompt_logprobs == TokenLogprobs(2, [-0.0, -1.0], [[0, 1]] * 2, [[-1.0, -2.0]] * 2, [[-2.0]] * 2)
    assert booked[-1].token_ids == [9] and booked[-1].logprobs is None  # the drawn token's were not asked


def test_a_prompt_scored_from_the_start_scores_position_one_on():
    batch = started(SamplingParams(max_tokens=1, prompt_logprobs_from=0))
    inputs, _ = batch.plan_step(100)
    assert [(s.scored_from, s.scored_targets) for s in inputs] == [(0, tuple(PROMPT[1:6]))]
    inputs, _ = batch.plan_step(100)
    assert [(s.scored_from, s.scored_targets) for s in inputs] == [(0, tuple(PROMPT[6:]))]


def test_the_drawn_tokens_logprobs_go_to_the_requests_that_asked_alone():
    batch = RunningBatch(block_size=4, max_model_len=64, eos_token_ids=[EOS], vocab_size=1000)
    asks = SamplingParams(max_tokens=3, logprobs=True, top_logprobs=1, processed_logprobs=True)
    for request_id, params in (("asks", asks), ("quiet", SamplingParams(max_tokens=3))):
        batch.apply(StartSequence(request_id, params, [0, 1], 0, 0))
        batch.apply(PrefillChunk(request_id, [5, 6, 7], 0, True))
    inputs, plan = batch.plan_step(100)
    assert [(s.logprobs, s.top_logprobs, s.processed_logprobs) for s in inputs] == [(True, 1, True), (False, 0, False)]
    assert RunningBatch.asks_logprobs(plan)
    drawn = StepLogprobs(positions([-0.25], top=1), None)
    updates = batch.book(plan, [40, 41], [drawn, None])
    assert updates[0].logprobs == TokenLogprobs(0, [-0.25], [[0]], [[-1.0]])
    assert updates[1].logprobs is None and updates[1].prompt_logprobs is None
    inputs, plan = batch.plan_step(100)  # decodes: output 1
    updates = batch.book(plan, [EOS, 42], [StepLogprobs(positions([-3.5], top=1), None), None])
    assert (updates[0].finish_reason, updates[0].logprobs.start, updates[0].logprobs.logprobs) == ("stop", 1, [-3.5])
    assert not RunningBatch.asks_logprobs(batch.plan_step(100)[1])  # only "quiet" is left


def test_max_tokens_zero_computes_the_prompt_and_ends_without_a_draw():
    batch = started(SamplingParams(max_tokens=0, prompt_logprobs_from=1))
    updates = []
    while batch.sequences:
        inputs, plan = batch.plan_step(100)
        assert inputs and not any(s.sample for s in inputs)
        prompt = StepLogprobs(None, positions([-1.0] * len(inputs[0].scored_targets)))
        updates += batch.book(plan, [None], [prompt])
    assert [(u.token_ids, u.prefilled_tokens, u.finish_reason) for u in updates] == [([], 5, None), ([], 3, "length")]
    assert [(u.prompt_logprobs.start, len(u.prompt_logprobs.logprobs)) for u in updates] == [(1, 5), (6, 2)]
    assert batch.plan_step(100) == ([], [])


def test_an_aborted_sequence_ends_after_the_last_token_it_published():
    batch = started(SamplingParams(max_tokens=10))
    inputs, plan = batch.plan_step(100)
    assert batch.book(plan, [None]) == [SequenceUpdate("r", [], 0, 5, cached_tokens=0)]
    inputs, plan = batch.plan_step(100)
    assert batch.book(plan, [30])[0].token_ids == [30]
    _, in_flight = batch.plan_step(100)  # output 1 is being drawn
    batch.apply(DropSequence("r", abort=True))
    batch.apply(DropSequence("gone", abort=True))  # not running here (it finished): no second end
    assert batch.book(in_flight, [31]) == []  # drawn after the abort: nobody gets it
    assert batch.take_ended() == [SequenceUpdate("r", [], 1, finish_reason="abort")]
    assert batch.take_dropped() == ["r", "gone"] and batch.take_ended() == []


def test_a_resubmitted_run_scores_nothing_and_counts_its_outputs_for_an_abort():
    batch = RunningBatch(block_size=4, max_model_len=64, eos_token_ids=[EOS], vocab_size=1000)
    batch.apply(StartSequence("r", SamplingParams(max_tokens=8, prompt_logprobs_from=0), [0, 1, 2], 3, 0))
    batch.apply(PrefillChunk("r", [5, 6, 7, 40, 41, 42], 0, True))
    (one,), _ = batch.plan_step(100)
    assert one.scored_targets == () and one.output_index == 3
    batch.apply(DropSequence("r", abort=True))
    assert batch.take_ended() == [SequenceUpdate("r", [], 3, finish_reason="abort")]
