"""phi-api bench draft: its table."""

from __future__ import annotations

from phi_api.bench.draftmodel import table


def test_the_table_gives_each_case_s_ratio_and_each_source_s_kept_draft_tokens():
    report = {"cases": {"chat": {"ratio": 0.9, "pairs": 18, "by_source": {"model_checked": 185.0, "model_kept": 137.0,
                                                                          "prompt_checked": 76.0, "prompt_kept": 9.0}},
                        "copying": {"ratio": 1.0, "pairs": 18, "by_source": {}}}}
    assert table(report).splitlines()[2:] == ["| chat | 0.90x (18 pairs) | model 137/185, prompt 9/76 |",
                                              "| copying | 1.00x (18 pairs) | none |"]
