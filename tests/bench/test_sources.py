"""phi-api bench sources: its workloads' requests and its table."""

from __future__ import annotations

from phi_api.bench.sources import agent_requests, json_requests, predicted_requests, table


def test_the_workloads_are_one_key_s_repeated_requests():
    extractions = json_requests()
    assert len(extractions) == 12 and len({body["messages"][0]["content"] for body in extractions}) == 12
    steps = agent_requests()
    assert [len(body["messages"]) for body in steps] == [1 + 2 * step for step in range(10)]  # each holds the last
    assert steps[-1]["messages"][-2]["tool_calls"][0]["function"]["name"] == "get_weather"
    edits = predicted_requests()
    assert all(body["prediction"]["content"].startswith("def order_summary") for body in edits)


def test_the_table_gives_each_server_s_speed_up_and_the_kept_drafts_by_source():
    report = {"batch_invariant": True, "workloads": {
        "json": {"off": {"speedup": 1.0, "drafts": {}}, "prompt": {"speedup": 1.25, "drafts": {}},
                 "history": {"speedup": 1.5, "drafts": {"prompt_checked": 40.0, "prompt_kept": 10.0,
                                                        "history_checked": 30.0, "history_kept": 24.0}}}}}
    assert table(report).splitlines()[-1] == "| json | 1.25x | 1.50x | prompt 10/40, history 24/30 |"
