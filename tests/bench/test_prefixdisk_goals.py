"""phi-api bench disk reports the prompts-on-disk issue's goals, met or not, for what it measured."""

from phi_api.bench.prefixdisk import goals


def test_goals_are_reported_met_or_not_for_what_was_measured():
    lines = goals({"across_restart": {"ratio": 0.049}, "decoding_while_writing": {"ratio": 0.96}})
    assert lines == ["[    met] after a restart: first token <= 0.10x cold: 0.049x",
                     "[NOT met] decoding while the tier writes >= 0.97x without it: 0.960x"]
