"""``bench loops``: what counts as an answer that ran to its limit in a loop."""

from __future__ import annotations

from phi_api.bench.loops import configurations, looping

POEM = "Leaves fall slowly down,\nGolden light on quiet paths,\nAutumn breathes its last.\n"


def test_a_repeated_line_to_the_limit_is_a_loop():
    assert looping(POEM + "A moment to not know,\n" * 40, "length")


def test_a_numbered_list_that_repeats_itself_is_a_loop():
    text = POEM + "".join(f"{n}. Apples are red.\n{n + 1}. Pears are green.\n" for n in range(1, 40, 2))
    assert looping(text, "length")


def test_an_answer_that_stopped_is_no_loop_however_it_ends():
    assert not looping(POEM + "A moment to not know,\n" * 40, "stop")


def test_varied_text_cut_at_the_limit_is_no_loop():
    text = " ".join(f"word{n} follows word{n - 1} in sentence {n * 7 % 13}." for n in range(200))
    assert not looping(text, "length")
    assert not looping(POEM, "length")


def test_configurations_name_the_servers_settings():
    chosen = configurations(["before", 'low={"temperature": 0.2}'])
    assert chosen == {"before": {"GENERATION_CONFIG": "off"},
                      "low": {"GENERATION_CONFIG": "off", "SAMPLING_DEFAULTS": '{"temperature": 0.2}'}}
    assert list(configurations([])) == ["before", "folder"]
