"""Draft sources beside a sequence's own tokens: an indexed text read in order (a prediction) or latest first (a
history), and each key's history bounded and kept apart."""

from __future__ import annotations

from phi_api.engine.sampling.lookup import HISTORY_OWNERS, Histories, Index, Lookup, nearest


def test_an_in_order_text_drafts_its_start_while_the_answer_follows_it_then_from_its_place():
    lookup = Lookup(Index([5, 6, 7, 8, 5, 6, 7, 9]), in_order=True)
    lookup.follow(5)
    assert lookup.propose([1, 2, 5], 3) == [6, 7, 8]  # no n-gram of the answer needed
    lookup.kept(3)
    for token in (6, 7, 8, 4):  # the answer parts from the text: n-grams from here on
        lookup.follow(token)
    assert lookup.propose([8, 4, 5, 6], 8) == [7, 9]  # the "5 6" past the kept draft, not the first
    lookup.cursor = 99
    assert lookup.propose([8, 4, 5, 6], 8) == [7, 8, 5, 6, 7, 9]  # none past its place: the first


def test_a_history_drafts_its_latest_occurrence_unless_a_kept_draft_goes_on_where_it_ended():
    lookup = Lookup(Index([1, 2, 3, 1, 2, 4, 4, 4]), in_order=False)
    assert lookup.propose([9, 1, 2], 2) == [4, 4]  # the latest "1 2"
    lookup.cursor = 2  # a kept draft ended just after the first "1 2"
    assert lookup.propose([9, 1, 2], 2) == [3, 1]


def test_each_owner_has_its_own_bounded_history_and_the_least_recent_owner_goes_first():
    histories = Histories(tokens=10)
    histories.add("a", [1, 2, 3])
    assert histories.of("b") is None and histories.of("a").tokens == [1, 2, 3]
    histories.add("a", list(range(20, 29)))  # 12 tokens would pass the bound: the older ones go
    assert histories.of("a").tokens == [3, *range(20, 29)][-10:]
    histories.add("a", list(range(40, 60)))  # longer than the bound itself: its last 10
    assert histories.of("a").tokens == list(range(50, 60))
    for owner in range(HISTORY_OWNERS):
        histories.add(f"k{owner}", [owner])
    assert histories.of("a") is None and histories.of("k0").tokens == [0]  # "a" was the least recently used
    off = Histories(tokens=0)
    off.add("a", [1, 2, 3])
    assert off.of("a") is None


def test_nearest_takes_the_first_place_within_the_window_past_the_cursor():
    places = [3, 10, 17, 40]
    assert nearest(places, 10, 1, -1) == 10  # a history's rule: exactly where the last kept draft ended
    assert nearest(places, 11, 1, -1) == -1
    assert nearest(places, 11, 7, -1) == 17  # within [11, 18)
    assert nearest(places, 11, 6, -1) == -1  # 17 is past [11, 17)
    assert nearest(places, 41, 100, 3) == 3  # nothing at or after the cursor
