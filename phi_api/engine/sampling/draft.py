"""Drafts from the prompt (prompt-lookup decoding), and from a text given beside it: the next tokens guessed by
matching the last n-gram.

Many answers copy long stretches of their prompt (an edited document or block
of code, a passage answered from, a reformatted table). A sequence's tokens so
far (prompt, then answer) are indexed by their n-grams; the tokens that
followed the latest earlier occurrence of the sequence's last n-gram are a
draft of what comes next. One model step then checks the whole draft
(:meth:`engine.sampling.logits.Sampler.verify`), and keeps the longest accepted run.

:class:`Drafter` decides, per sequence, whether to draft and how far: only when
an n-gram matches; up to ``max_tokens`` tokens: one more than the last draft
kept when it was cut short, twice as many after a draft kept whole (a copy
resumes after the one word an edit changed: from the copied text's own place, found by an n-gram or, where none
matches, by the last token alone within a few tokens past it); and not at all for a while after
drafts keep failing, longer each time, so that text that copies nothing (free
chat) is not slowed down. Beside the sequence's own tokens it drafts from the answer the request expects (OpenAI's
predicted outputs), first, and from its key's earlier answers (:mod:`engine.sampling.lookup`); what each source
drafted and had kept is counted apart (:attr:`Drafter.sources`). It also tells what a check is worth
(:attr:`Drafter.expected`), learnt from the drafts checked and from those that
were not (:meth:`Drafter.decline`), scored against the tokens that came.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

from phi_api.engine.sampling.lookup import NGRAM_SIZES, Index, Lookup, nearest

_FAIL_LIMIT = 2  # drafts in a row that each accepted nothing before drafting pauses
_PAUSE_STEPS = 4  # first pause, in steps; doubles with every further pause, up to _PAUSE_MAX
_PAUSE_MAX = 256
# A copy resumed: where a draft from the sequence's own tokens was cut short, the copied text goes on a little past
# the token the model replaced (an edit changes a word, a tool call a value): an n-gram that occurs within this many
# tokens past that place is drafted from there rather than from its latest occurrence, and where no n-gram matches,
# the sequence's last token alone found there resumes the copy.
_COPY_WINDOW = 32
_COPY_STALE = 16  # tokens written since the copy's last check past which it is not resumed


class ModelRow(Protocol):
    """A sequence's place in a draft model (:mod:`engine.sched.drafts`)."""

    def propose(self, tokens: list[int], limit: int) -> list[int]: ...

    def close(self) -> None: ...


class DraftModelSource(Protocol):
    """A draft model, which gives a sequence its row (None: none free now)."""

    def open(self) -> ModelRow | None: ...


@dataclasses.dataclass
class Counted:
    """One source's draft tokens: checked, and kept of those."""

    checked: int = 0
    kept: int = 0


class Drafter:
    """One sequence's draft sources and how much it drafts (``max_tokens`` 0: never); ``prediction``: the tokens of
    the answer the request expects, drafted from first; ``history``: its key's earlier answers, drafted from where
    an n-gram of the sequence's own tokens is no longer than one of the history's; ``model``: a draft model, drafting
    where no n-gram matches, or where its drafts are expected to give more tokens for their time than the n-gram's
    (the row it gives is held from the first such draft to :meth:`close`)."""

    def __init__(self, tokens: list[int], max_tokens: int, prediction: Index | None = None,
                 history: Index | None = None, min_tokens: int = 0, model: DraftModelSource | None = None) -> None:
        self.max_tokens = max_tokens
        self.min_tokens = min_tokens  # a shorter draft is not worth a check (llama.cpp's n_min)
        self._prediction: Lookup | None = None
        self._history = Lookup(history, in_order=False) if history is not None else None
        self._model = model
        self._model_row: ModelRow | None = None  # this sequence's row of the draft model, once taken
        self._source = "prompt"  # where the last draft came from
        self._start = 0  # where the last draft from the sequence's own tokens starts in them
        self._copy: int | None = None  # where a copy from its own tokens goes on (see _COPY_WINDOW), and
        self._copy_at = 0  # the sequence's length when the copy was last checked
        self.sources: dict[str, Counted] = {}  # what each source drafted and had kept
        self._own = Index()  # the sequence's tokens so far
        self._tokens = self._own.tokens
        self.expected = float(max_tokens)  # draft tokens kept per draft, a running average
        self._limit = max_tokens  # the next draft's length, at most
        self._declined: list[int] = []  # the rest of a draft that was not checked, to score against what comes
        self._declined_kept = 0
        self._failures = 0
        self._pause = 0
        self._next_pause = _PAUSE_STEPS
        self.drafted = 0
        self.accepted = 0
        self.checks = 0  # drafts checked (each in one step)
        self.checks_beside = 0  # of those, in a batched step beside other rows
        self.extend(tokens)
        # The prediction's tokens the checks may refuse, in all: the key is charged for them (as OpenAI bills them)
        # and they are reserved from its budget before the work, so they are bounded by the prediction's length.
        self.prediction_room = 0
        if prediction is not None and prediction.tokens:
            self._prediction = Lookup(prediction, in_order=True)  # after the prompt: it follows the answer
            self.prediction_room = len(prediction.tokens)

    def extend(self, tokens: list[int]) -> None:
        """Index the sequence's tokens as they come: its prompt, then each token chosen (the pending one too)."""
        for token in tokens:
            if self._prediction is not None:
                self._prediction.follow(int(token))
            self._score_declined(int(token))
            self._own.add((token,))

    def propose(self, room: int, model_cost: float | None = None) -> list[int]:
        """A draft of at most ``room`` tokens and at least ``min_tokens`` (none when nothing matches, while paused, or
        when off); ``model_cost``: what the draft model's draft would cost, in checks (None: it may not draft: the
        caller's cost decision)."""
        draft = self._propose(room, model_cost)
        return draft if len(draft) >= max(1, self.min_tokens) else []

    def _propose(self, room: int, model_cost: float | None) -> list[int]:
        if self.max_tokens <= 0 or room <= 0:
            return []
        if self._pause:
            self._pause -= 1
            return []
        limit = min(room, max(self._limit, min(self.min_tokens, self.max_tokens)))
        if self._prediction is not None and self.prediction_room > 0:
            draft = self._prediction.propose(self._tokens, min(limit, self.prediction_room))
            if draft:
                self._source = "prediction"
                return draft
        draft = self._matched(limit)
        if model_cost is not None and self._model is not None and (
                not draft or self._kept("model", limit) / (1 + model_cost) > self._kept(self._source, len(draft))):
            return self._from_model(limit) or draft
        return draft

    @property
    def limit(self) -> int:
        """The next draft's length, at most."""
        return self._limit

    def _matched(self, limit: int) -> list[int]:
        """A draft from the longest n-gram of the sequence's end found in its own tokens or its key's history; else
        from its last token where a copy from its own tokens stood a moment ago (:data:`_COPY_WINDOW`)."""
        copying = self._copy is not None and len(self._tokens) - self._copy_at <= _COPY_STALE
        for size in NGRAM_SIZES:
            if len(self._tokens) < size:
                continue
            ngram = tuple(self._tokens[-size:])
            places = self._own.places(ngram)
            if places:
                self._source = "prompt"
                return self._repeated(self._nearest(places) if copying else places[-1], limit)
            draft = self._history.match(ngram, limit) if self._history is not None else []
            if draft:
                self._source = "history"
                return draft
        return self._resumed(limit) if copying else []

    def _nearest(self, places: list[int]) -> int:
        """Of an n-gram's followers, the first within the copy's window; else its latest occurrence (what the
        sequence wrote last is likeliest again)."""
        assert self._copy is not None
        return nearest(places, self._copy, _COPY_WINDOW, places[-1])

    def _resumed(self, limit: int) -> list[int]:
        """The copy resumed after the first occurrence of the sequence's last token within its window (none there:
        no draft)."""
        assert self._copy is not None
        last, tokens = self._tokens[-1], self._tokens
        for place in range(self._copy, min(self._copy + _COPY_WINDOW, len(tokens) - 1)):
            if tokens[place] == last:
                self._source = "prompt"
                return self._repeated(place + 1, limit)
        return []

    def _kept(self, source: str, length: int) -> float:
        """Tokens a check of ``source``'s draft of ``length`` tokens is expected to give, its model's token included:
        by the share of its checked tokens kept so far (all of them before any: worth a try)."""
        counted = self.sources.get(source)
        return 1 + length * (counted.kept / counted.checked if counted and counted.checked else 1.0)

    def _from_model(self, limit: int) -> list[int]:
        """The draft model's draft (none when it has no row for this sequence)."""
        if self._model_row is None:
            assert self._model is not None
            self._model_row = self._model.open()
            if self._model_row is None:
                return []
        self._source = "model"
        return self._model_row.propose(self._tokens, limit)

    def close(self) -> None:
        """The sequence has ended: its row of the draft model goes back."""
        if self._model_row is not None:
            self._model_row.close()
            self._model_row = None

    def _repeated(self, start: int, limit: int) -> list[int]:
        """The sequence's tokens from ``start`` on, at most ``limit``; where they reach its end, their repeat: an
        occurrence just behind the end is a loop (a repeated word, a rule of dashes), which goes on as it went."""
        self._start = start
        draft = self._tokens[start:start + limit]
        period = len(self._tokens) - start
        while len(draft) < limit:
            draft.append(draft[len(draft) - period])
        return draft

    def record(self, drafted: int, accepted: int) -> None:
        """A draft of ``drafted`` tokens had its first ``accepted`` kept."""
        self.drafted += drafted
        self.accepted += accepted
        self.checks += 1
        counted = self.sources.setdefault(self._source, Counted())
        counted.checked += drafted
        counted.kept += accepted
        if self._source == "prediction":
            self.prediction_room -= drafted - accepted
        lookup = {"prediction": self._prediction, "history": self._history}.get(self._source)
        if lookup is not None:
            lookup.kept(accepted)
        if self._source == "prompt" and accepted:  # a copy: the model's own token after the kept ones stands for
            # the copied text's next one (a draft that kept nothing leaves the copy where it stood)
            self._copy, self._copy_at = self._start + accepted + 1, len(self._tokens) + accepted + 1
        self._learn(drafted, accepted)
        if accepted:
            self._failures = 0
            self._next_pause = _PAUSE_STEPS
            return
        self._failures += 1
        if self._failures >= _FAIL_LIMIT:  # back off: copying has stopped, for now
            self._pause, self._failures = self._next_pause, 0
            self._next_pause = min(2 * self._next_pause, _PAUSE_MAX)

    def decline(self, draft: list[int]) -> None:
        """``draft`` was not checked (it did not pay): score it against the tokens that come instead."""
        if not self._declined:
            self._declined, self._declined_kept = list(draft), 0

    def _score_declined(self, token: int) -> None:
        if not self._declined:
            return
        if token == self._declined[0]:
            self._declined.pop(0)
            self._declined_kept += 1
            if self._declined:
                return
        self._learn(self._declined_kept + len(self._declined), self._declined_kept)
        self._declined = []

    def _learn(self, drafted: int, accepted: int) -> None:
        self.expected += 0.5 * (accepted - self.expected)
        if accepted == drafted:  # kept whole: the copy goes on
            self._limit = min(self.max_tokens, max(self._limit, 2 * drafted))
        else:
            self._limit = accepted + 1
