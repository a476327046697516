"""`tidalmq local top`'s arithmetic: rates between two scrapes, the lag rows."""

from __future__ import annotations

from tidalmq_broker.local.top import parse, rates, render

BEFORE = """# TYPE tidalmq_topic_bytes_in_total counter
tidalmq_topic_bytes_in_total{broker="0",topic="a"} 1000.0
tidalmq_topic_bytes_in_total{broker="0",topic="b"} 1000.0
tidalmq_topic_records_out_total{broker="0",topic="a"} 10.0
# TYPE tidalmq_connections gauge
tidalmq_connections{broker="0"} 3.0
"""
AFTER = """# TYPE tidalmq_topic_bytes_in_total counter
tidalmq_topic_bytes_in_total{broker="0",topic="a"} 3048.0
tidalmq_topic_bytes_in_total{broker="0",topic="b"} 1000.0
tidalmq_topic_records_out_total{broker="0",topic="a"} 30.0
# TYPE tidalmq_connections gauge
tidalmq_connections{broker="0"} 4.0
# TYPE tidalmq_consumer_group_lag_sum_records gauge
tidalmq_consumer_group_lag_sum_records{group="g",topic="a"} 42.0
tidalmq_consumer_group_lag_sum_records{group="h",topic="a"} 7.0
# TYPE tidalmq_consumer_group_lag_seconds gauge
tidalmq_consumer_group_lag_seconds{group="g",topic="a"} 12.0
"""


def test_rates_and_frame() -> None:
    before, after = parse(BEFORE, 10.0), parse(AFTER, 12.0)
    r = rates(before, after)
    assert r["bytes_in"] == 1024.0 and r["records_out"] == 10.0 and r["bytes_out"] == 0.0
    assert rates(None, after)["bytes_in"] == 0.0
    restarted = parse(BEFORE, 14.0)  # counters went down: the broker restarted
    assert rates(after, restarted)["bytes_in"] == 1000.0
    status = {
        "bootstrap": "127.0.0.1:9092",
        "moves_in_flight": 2,
        "moves_done": 5,
        "brokers": [{"broker": 0, "state": "alive", "partitions": 6, "moves_in": 1}],
    }
    frame = render(status, {0: after}, {0: before})
    assert "moves in flight 2   moves done 5" in frame
    broker_row = frame.splitlines()[3].split()
    assert broker_row[:4] == ["0", "alive", "6", "4"] and broker_row[4:6] == ["1.0", "KiB"]
    lag_rows = [line.split() for line in frame.splitlines()[-2:]]
    assert lag_rows == [["g", "a", "42", "12s"], ["h", "a", "7", "0s"]]  # most lagging first
