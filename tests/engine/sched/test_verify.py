"""Speculative decoding from the prompt (engine.draft, engine.speculation, Sampler.verify), on the fake model: greedy
answers are token for token the argmax chain, sampled tokens follow the target distribution, and stop strings,
max_tokens and grammars behave exactly as without drafts."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from phi_api.engine import SamplingParams
from phi_api.engine.sampling.draft import Counted, Drafter
from phi_api.engine.sampling.logits import Sampler, distribution
from phi_api.engine.sampling.lookup import Index
from phi_api.engine.sched.stepcost import StepCosts
from tests.support.fakes import EOS, fake_engine, text_pieces
from tests.support.generations import collect, generate

SCRIPT = list(range(1, 21))  # the fake's answer: 1, 2, ..., 20, then again
PIECES = text_pieces(*[f" w{token}".encode() for token in SCRIPT])
COPYING = [30, 31, 32] + SCRIPT[:20] + [33]  # the prompt holds the answer: drafts come true
FREE = [40 + index % 7 for index in range(24)]  # no stretch of the answer in it


def run(prompt, server_draft_max, **params):
    engine = fake_engine(SCRIPT, PIECES, draft_max=server_draft_max)
    try:
        text, finished = generate(engine, prompt, **{"max_tokens": 18, "temperature": 0, **params})
        return text, finished, list(engine.model.script.steps)
    finally:
        engine.stop()


def test_greedy_answers_are_the_argmax_chain_and_copying_takes_fewer_steps():
    plain, finished_plain, steps_plain = run(COPYING, 0)
    drafted, finished, steps = run(COPYING, 8)
    assert drafted == plain == "".join(f" w{token}" for token in SCRIPT[:18])
    assert finished.completion_tokens == finished_plain.completion_tokens == 18
    assert finished.accepted_tokens > 0 and finished_plain.drafted_tokens == 0
    assert len(steps) < len(steps_plain) / 2  # checks of several tokens instead of one step a token
    assert any(step.startswith("check:") for step in steps)


def test_drafts_that_keep_failing_stop_being_tried():
    plain, _, _ = run(FREE, 0)
    drafted, finished, steps = run(FREE, 8, max_tokens=18)
    assert drafted == plain
    assert finished.accepted_tokens == 0
    assert sum(step.startswith("check:") for step in steps) <= 3  # backed off after the first failures


@pytest.mark.parametrize("stop", ["w9", " w12 w13", "w1"])
def test_stop_strings_end_the_text_exactly_as_without_drafts(stop):
    plain, finished_plain, _ = run(COPYING, 0, stop=(stop,))
    drafted, finished, _ = run(COPYING, 8, stop=(stop,))
    assert drafted == plain and stop not in drafted
    assert finished.reason == finished_plain.reason == "stop"


@pytest.mark.parametrize("max_tokens", [1, 2, 5, 9])
def test_max_tokens_is_never_passed(max_tokens):
    drafted, finished, _ = run(COPYING, 8, max_tokens=max_tokens)
    assert finished.completion_tokens == max_tokens and finished.reason == "length"
    assert drafted == "".join(f" w{token}" for token in SCRIPT[:max_tokens])


class Forbidding:
    """A grammar that never allows ``token`` (and ends at end of sequence)."""

    failed = None

    def __init__(self, token: int) -> None:
        self.token = token

    def mask(self, logits: np.ndarray) -> None:
        logits[self.token] = -np.inf

    def consume(self, token: int) -> None:
        assert token != self.token, "the grammar was violated"


def test_a_grammar_is_never_violated_by_a_draft():
    outputs = []
    for draft_max in (0, 8):
        engine = fake_engine(SCRIPT, PIECES, draft_max=draft_max)
        engine.model.guide = lambda grammar: Forbidding(6)
        try:
            outputs.append(generate(engine, COPYING, max_tokens=18, temperature=0, guidance=("json_schema", "{}")))
        finally:
            engine.stop()
    (plain, _), (drafted, finished) = outputs
    assert drafted == plain and " w6" not in drafted
    assert finished.drafted_tokens > 0  # drafts offering 6 were tried, and refused


def test_a_request_can_turn_drafting_off():
    _, finished, steps = run(COPYING, 8, draft_max=0)
    assert finished.drafted_tokens == 0 and not any(step.startswith("check:") for step in steps)



def test_a_request_s_n_min_leaves_shorter_drafts_unchecked():
    plain, _, _ = run(COPYING, 8)
    text, finished, steps = run(COPYING, 8, draft_min=6)
    assert text == plain
    checks = [int(step.split(":")[1]) for step in steps if step.startswith("check:")]
    assert checks and min(checks) >= 7  # the pending token and at least 6 drafted
    drafter = Drafter([1, 2, 3, 1, 2], max_tokens=8, min_tokens=3)
    assert drafter.propose(8) == [3, 1, 2, 3, 1, 2, 3, 1]  # "1 2" came 3 tokens back: a loop, drafted on
    assert drafter.propose(2) == []  # room for 2 only: not worth a check


def test_a_prediction_of_the_answer_is_drafted_from_and_counted_apart():
    plain, _, steps_plain = run(FREE, 0)
    predicted, finished, steps = run(FREE, 8, prediction=tuple(SCRIPT[:18]))
    assert predicted == plain  # the same answer: a prediction changes how fast, never what
    assert finished.predicted_accepted >= 12 and finished.predicted_rejected == 0
    assert finished.accepted_tokens == finished.predicted_accepted  # the prompt copies nothing of the answer
    assert len(steps) < len(steps_plain) / 2


def test_a_prediction_that_parts_from_the_answer_is_refused_there_and_counted_so():
    wrong = tuple(SCRIPT[:3]) + tuple(token + 100 for token in SCRIPT[3:18])
    plain, _, _ = run(FREE, 0)
    predicted, finished, _ = run(FREE, 8, prediction=wrong)
    assert predicted == plain
    assert (finished.predicted_accepted, finished.predicted_rejected) == (2, 6)  # "2 3" kept of its first 8 tokens


def test_a_prediction_is_followed_in_order_where_its_n_grams_repeat():
    # The answer the client expects: "1 2 3 7 1 2 3 8"; the answer so far has passed its first "1 2 3 7".
    drafter = Drafter([50, 51], max_tokens=8, prediction=Index([1, 2, 3, 7, 1, 2, 3, 8]))
    drafter.extend([1])
    assert drafter.propose(8) == [2, 3, 7, 1, 2, 3, 8]  # the answer begins as predicted: the rest, no n-gram needed
    drafter.record(7, 3)
    drafter.extend([2, 3, 7, 9, 1, 2, 3])  # an edit (9 for 1), then "1 2 3" again
    assert drafter.propose(8) == [8]  # after the occurrence past the kept draft, not the first "1 2 3"
    assert drafter.sources == {"prediction": Counted(checked=7, kept=3)}



def test_a_key_s_earlier_answers_draft_for_that_key_alone():
    engine = fake_engine(SCRIPT, PIECES, draft_max=8, history_tokens=1024)
    try:
        def ask(key):
            return collect(engine.submit(np.asarray(FREE, dtype=np.int32), SamplingParams(max_tokens=18,
                                                                                            temperature=0),
                                         cache_key=key))

        first, cold = ask("team-a")
        again, warm = ask("team-a")
        other, stranger = ask("team-b")
    finally:
        engine.stop()
    assert first == again == other  # drafts change how fast, never what
    sources = {name: dict((source, kept) for source, _, kept in finished.draft_sources)
               for name, finished in (("cold", cold), ("warm", warm), ("stranger", stranger))}
    assert sources["warm"].get("history", 0) >= 12  # its own first answer, drafted
    assert "history" not in sources["cold"] and "history" not in sources["stranger"]  # never another key's


@pytest.mark.parametrize("row_wise", [False, True])
def test_batch_invariant_keeps_a_key_s_history_out_of_its_drafts_unless_checks_are_exact(row_wise):
    """Where a check gives one-token steps' bits (a graph of row-wise operators), drafts change no answer: the
    history drafts batch-invariant too."""
    engine = fake_engine(SCRIPT, PIECES, draft_max=8, history_tokens=1024, batch_invariant=True, row_wise=row_wise)
    try:
        answers = [collect(engine.submit(np.asarray(FREE, dtype=np.int32),
                                         SamplingParams(max_tokens=18, temperature=0), cache_key="team-a"))
                   for _ in range(2)]
    finally:
        engine.stop()
    kept = sum(kept for source, _, kept in answers[1][1].draft_sources if source == "history")
    assert kept >= 12 if row_wise else kept == 0
    assert answers[0][0] == answers[1][0]


# The sampled rule ----------------------------------------------------------------------------------------

LOGITS = np.log(np.array([0.3, 0.25, 0.2, 0.1, 0.08, 0.05, 0.02], dtype=np.float32))
CHI2_DF6_P001 = 22.46  # the chi-square distribution's 0.999 quantile for 6 degrees of freedom


def chi_square(counts: np.ndarray, expected: np.ndarray) -> float:
    keep = expected > 0
    return float((((counts - expected) ** 2)[keep] / expected[keep]).sum())


@pytest.mark.parametrize("params,draft", [
    ({"temperature": 1.0}, 0),  # the likeliest token drafted
    ({"temperature": 1.0}, 5),  # an unlikely one
    ({"temperature": 0.7, "logit_bias": ((6, 2.0),)}, 6),
    ({"temperature": 1.3, "top_k": 5}, 2),
    ({"temperature": 1.0, "top_p": 0.8}, 6),  # a draft outside top-p: always rejected
])
def test_sampled_tokens_follow_the_target_distribution(params, draft):
    """Over many seeded draws, the first token a check gives is distributed as the sampler's own distribution
    (after every logit processor), whatever the draft: the speculative-sampling rule is exact."""
    sampling = SamplingParams(max_tokens=8, **params)
    processed = LOGITS.copy()
    for token, bias in sampling.logit_bias:
        processed[token] += bias
    pool, probabilities = distribution(processed, sampling.temperature, sampling.top_k, sampling.top_p)
    target = np.zeros(LOGITS.size)
    target[pool] = probabilities
    draws = 6000
    counts = np.zeros(LOGITS.size)
    for seed in range(draws):
        sampler = Sampler(SamplingParams(**{**sampling.__dict__, "seed": seed}), np.array([], dtype=np.int32),
                          frozenset({99}))
        token, _ = sampler.verify(np.stack([LOGITS.copy(), LOGITS.copy()]), [draft])[0]
        counts[token] += 1
    assert chi_square(counts, target * draws) < CHI2_DF6_P001
    assert counts[target == 0].sum() == 0


@pytest.mark.parametrize("params", [{"temperature": 1.0}, {"temperature": 0.8, "top_p": 0.9, "top_k": 5},
                                    {"temperature": 1.2, "presence_penalty": 1.5}])
def test_a_seeded_check_draws_as_decoding_without_drafts(params):
    """A check takes the same tokens, with the same draws, as the same positions decoded one at a time: with a
    draft kept whole, and with one refused midway (the refused position gives the token decoding gives there)."""
    rng = np.random.default_rng(7)
    for seed in range(40):
        rows = np.stack([LOGITS + rng.normal(0, 0.5, LOGITS.size).astype(np.float32) for _ in range(4)])

        def sampler(seed: int = seed) -> Sampler:
            return Sampler(SamplingParams(max_tokens=8, seed=seed, **params), np.array([], dtype=np.int32),
                           frozenset({EOS}))

        plain = sampler()
        decoded = [plain.choose(row.copy())[0] for row in rows]
        whole = [token for token, _ in sampler().verify(rows.copy(), decoded[:3])]
        assert whole == decoded
        wrong = (decoded[1] + 1) % LOGITS.size
        refused = [token for token, _ in sampler().verify(rows.copy(), [decoded[0], wrong, decoded[2]])]
        assert refused == decoded[:2]


def test_a_whole_accepted_draft_ends_with_a_token_of_the_model_s_own():
    sampler = Sampler(SamplingParams(max_tokens=8, temperature=0), np.array([], dtype=np.int32), frozenset({EOS}))
    rows = np.stack([LOGITS.copy() for _ in range(3)])
    chosen = [token for token, _ in sampler.verify(rows, [0, 0])]
    assert chosen == [0, 0, 0]  # two kept, and the model's own after them
    assert [token for token, _ in sampler.verify(rows.copy(), [0, 3])] == [0, 0]  # the second refused


def test_the_drafter_matches_the_last_n_gram_and_backs_off():
    drafter = Drafter([1, 2, 3, 4, 5, 1, 2], max_tokens=4)
    assert drafter.propose(8) == [3, 4, 5, 1]
    assert drafter.propose(2) == [3, 4]
    drafter.extend([9])
    assert drafter.propose(8) == []  # "2 9" and "1 2 9" never came before
    for _ in range(2):
        drafter.record(4, 0)
    drafter.extend([1, 2])
    assert [drafter.propose(8) for _ in range(4)] == [[]] * 4  # paused after two failures
    # then tried again, one token (the last draft kept nothing), from the latest earlier "1 2"
    assert drafter.propose(8) == [9]


def test_a_loop_at_the_sequence_s_end_is_drafted_as_it_goes_on():
    drafter = Drafter([9, 4, 7, 4, 7, 4, 7], max_tokens=8)
    assert drafter.propose(8) == [4, 7, 4, 7, 4, 7, 4, 7]  # "4 7" last came just behind the end: it repeats
    assert drafter.propose(3) == [4, 7, 4]
    drafter = Drafter([5, 5, 5, 5], max_tokens=6)
    assert drafter.propose(8) == [5] * 6


def test_a_draft_cut_short_limits_the_next_and_one_kept_whole_doubles_it():
    drafter = Drafter(list(range(40)) + [0, 1, 2], max_tokens=8)
    assert len(drafter.propose(64)) == 8
    drafter.record(8, 2)
    assert len(drafter.propose(64)) == 3  # one more than were kept
    drafter.record(3, 3)
    assert len(drafter.propose(64)) == 6  # kept whole: twice as long
    drafter.record(6, 6)
    assert len(drafter.propose(64)) == 8  # never past max_tokens


def test_a_copy_resumes_past_a_token_the_model_changed():
    text = list(range(100, 130))
    drafter = Drafter(text + [100, 101, 102], max_tokens=8)
    assert drafter.propose(64) == list(range(103, 111))
    drafter.record(8, 2)  # 103 and 104 kept; the model wrote 999 where the text has 105
    drafter.extend([103, 104, 999])
    assert drafter.propose(64) == []  # "104 999" never came before, nor 999 near the copy
    drafter.extend([106])  # the copy goes on after the changed token
    assert drafter.propose(64) == [107, 108, 109]  # one more than the last draft kept
    drafter = Drafter(text + [100, 101, 102], max_tokens=8)
    drafter.extend([103, 104, 999, 106])  # the same tokens with no copy checked: nothing to resume
    assert drafter.propose(64) == []


def test_a_copy_resumed_is_drafted_from_its_own_place_and_goes_stale():
    prompt = [40, 41, 42, 43, 1, 2, 44, 45, 46, 90, 91, 1, 2, 77, 78, 80]
    drafter = Drafter(prompt + [40, 41, 42], max_tokens=8)
    assert drafter.propose(64)[:3] == [43, 1, 2]
    drafter.record(8, 1)  # 43 kept; the model wrote 99 where the text has 1
    drafter.extend([43, 99, 1, 2])
    assert drafter.propose(64) == [44, 45]  # "1 2" of the copy, not its latest (two: one more than kept)
    drafter.extend(range(500, 517))  # 17 tokens with no check: the copy is over
    drafter.extend([1, 2])
    assert drafter.propose(64) == [500, 501]  # the latest "1 2" again (the copy's would be 44)


def test_a_declined_draft_is_scored_against_the_tokens_that_come():
    drafter = Drafter([5, 6, 7, 8, 9, 10, 5, 6], max_tokens=4)
    assert drafter.propose(8) == [7, 8, 9, 10]
    drafter.decline([7, 8, 9, 10])
    drafter.extend([7, 8, 1])  # two came true, then another token
    assert drafter.expected == pytest.approx(4 + 0.5 * (2 - 4))
    assert drafter.checks == drafter.drafted == 0  # nothing was checked: the counters are the checks'
    assert drafter.propose(8) == []  # "8 1" never came before
    drafter.extend([5, 6])
    assert len(drafter.propose(8)) == 3  # the declined draft, cut short, limits the next


def test_step_costs_check_a_draft_only_where_and_as_far_as_it_beats_the_batched_step():
    costs = StepCosts()
    assert costs.check_length(4, 3.0, 2) == 0  # no step of two rows timed yet: that is the price to beat
    costs.observe_step(2, 0.010)
    assert costs.check_length(4, 3.0, 2) == 4  # a check of 4 not timed yet: tried
    costs.observe_check(4, 0.015)
    assert costs.check_length(4, 3.0, 2) == 4  # 4 tokens in 15 ms against 2 in 10 ms
    assert costs.check_length(4, 1.5, 2) == 0  # 2.5 tokens in 15 ms
    costs.observe_check(2, 0.011)
    assert costs.check_length(4, 1.5, 2) == 2  # 2.5 tokens at most in 11 ms: the draft's first two only
    costs.observe_step(8, 0.025)
    assert costs.check_length(4, 2.0, 8) == 0  # 3 tokens in 11 or 15 ms against 8 in 25 ms
    assert costs.check_length(4, 4.0, 8) == 4  # 5 tokens in 15 ms
    costs.observe_step(16, 0.040)
    assert costs.check_length(4, 10.0, 16) == 0  # 5 tokens at most (not 11) in 15 ms against 16 in 40 ms
    costs.observe_check(4, 0.012)
    assert costs.checks[4] == pytest.approx(0.015 + 0.2 * (0.012 - 0.015))  # a running average


def test_checks_that_cost_more_than_the_steps_they_save_are_not_made():
    script = list(range(1, 61))
    engine = fake_engine(script, text_pieces(*[f" w{token}".encode() for token in script]), draft_max=8,
                         prefill_chunk=64)  # each prompt in one step: both rows soon decode together
    engine.model.script.check_token_seconds = 0.0125  # a check of k tokens costs more than k + 1 steps
    engine.model.script.gate = threading.Semaphore(0)  # no step until both requests are in
    choice = SamplingParams(max_tokens=50, temperature=0)
    try:  # two requests: the rows of a request alone always check their drafts
        generations = [engine.submit(np.array([70 + index, 71, *script], dtype=np.int32), choice)
                       for index in range(2)]
        engine.model.script.gate.release(10_000)
        finished = [collect(generation)[1] for generation in generations]
    finally:
        engine.stop()
    assert [(end.reason, end.completion_tokens) for end in finished] == [("length", 50)] * 2
    steps = engine.model.script.steps
    last = len(steps) - 1 - steps[::-1].index("decode:2")
    together = steps[steps.index("decode:2"):last]  # while both rows ran (a row alone always checks)
    checks = [step for step in together if step.startswith("check:")]
    assert len(checks) == len(set(checks))  # each draft length tried once, its price seen, then declined
    assert together.count("decode:2") >= 25  # plain batched steps


def test_what_a_check_costs_includes_the_choice_of_its_tokens(monkeypatch):
    """A check whose model step is cheap but whose choices are not (a sampled row draws at every position, with its
    penalties: on a small model, a good part of the price) is declined among other rows as a slow step is."""
    script = list(range(1, 61))
    engine = fake_engine(script, text_pieces(*[f" w{token}".encode() for token in script]), draft_max=8,
                         prefill_chunk=64)
    fake = engine.model.script
    verify = Sampler.verify

    def slow_verify(self, rows, drafts):
        fake.now += 0.0125 * len(drafts)  # the choices of a check's tokens cost more than the steps it saves
        return verify(self, rows, drafts)

    monkeypatch.setattr(Sampler, "verify", slow_verify)
    fake.gate = threading.Semaphore(0)  # no step until both requests are in
    choice = SamplingParams(max_tokens=50, temperature=0)
    try:
        generations = [engine.submit(np.array([70 + index, 71, *script], dtype=np.int32), choice)
                       for index in range(2)]
        fake.gate.release(10_000)
        finished = [collect(generation)[1] for generation in generations]
    finally:
        engine.stop()
    assert [(end.reason, end.completion_tokens) for end in finished] == [("length", 50)] * 2
    steps = fake.steps
    last = len(steps) - 1 - steps[::-1].index("decode:2")
    together = steps[steps.index("decode:2"):last]
    checks = [step for step in together if step.startswith("check:")]
    assert len(checks) == len(set(checks)) and together.count("decode:2") >= 25  # tried once each, then declined


@pytest.mark.parametrize("row_wise", [False, True])
def test_batch_invariant_checks_every_draft_unless_checks_are_exact(row_wise):
    """Batch-invariant, rows among others check their drafts as alone, whatever they cost; where a check gives
    one-token steps' bits, whether it is made changes no answer, and the costs decide as without the invariance."""
    script = list(range(1, 61))
    engine = fake_engine(script, text_pieces(*[f" w{token}".encode() for token in script]), draft_max=8,
                         prefill_chunk=64, batch_invariant=True, row_wise=row_wise)
    engine.model.script.check_token_seconds = 0.0125  # a check of k tokens costs more than k + 1 steps
    engine.model.script.gate = threading.Semaphore(0)  # no step until both requests are in
    choice = SamplingParams(max_tokens=50, temperature=0)
    try:
        generations = [engine.submit(np.array([70 + index, 71, *script], dtype=np.int32), choice)
                       for index in range(2)]
        engine.model.script.gate.release(10_000)
        finished = [collect(generation) for generation in generations]
    finally:
        engine.stop()
    assert [(end.reason, end.completion_tokens) for _, end in finished] == [("length", 50)] * 2
    checks = sum(step.startswith("check:") for step in engine.model.script.steps)
    assert checks <= 4 if row_wise else checks >= 8


def test_the_rows_of_a_request_alone_check_every_draft_whatever_the_costs():
    script = list(range(1, 61))
    engine = fake_engine(script, text_pieces(*[f" w{token}".encode() for token in script]), draft_max=8)
    engine.model.script.check_token_seconds = 0.0125  # checks that do not pay among other requests' rows
    choice = SamplingParams(max_tokens=50, temperature=0)
    try:  # two choices of one request: the same steps every time, whatever the timings
        generation = engine.submit(np.array([70, 71, *script], dtype=np.int32), [choice, choice])
        for _ in generation.events():
            pass
        generation.close()
    finally:
        engine.stop()
    steps = engine.model.script.steps
    assert steps.count("check:9") >= 8 and steps.count("decode:2") <= 2  # every draft checked
