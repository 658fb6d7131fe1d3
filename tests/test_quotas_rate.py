"""Client quotas: Kafka's sampled rate and throttle time and the usage bucket that throttles
(kafka_wire/quotas/rate.py), and the manager that keeps a rate and a bucket per quota type
and sensor (kafka_wire/quotas/manager.py).

The sampled rate's numbers are worked by hand from Kafka's Rate.windowSize and
QuotaUtils.throttleTime: with 11 samples of 1 s, the span W is at least 10 s, and a client
over its quota waits X = (rate - quota) / quota * W, which is (bytes in the span - quota *
W) / quota. The bucket's burst is the same 10 windows of quota, so a new client's first
throttle is the same; after that its usage drains at the quota."""

from __future__ import annotations

import pytest

from kafka_wire.quotas.entities import (
    CONSUMER_BYTE_RATE,
    DEFAULT,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    QuotaEntity,
    SensorKey,
)
from kafka_wire.quotas.manager import ClientQuotaManager, QuotaType
from kafka_wire.quotas.rate import MAX_THROTTLE_MS, QuotaWindow, Rate, throttle_time_ms


def test_a_new_client_may_send_ten_windows_of_quota_at_once() -> None:
    # W is padded to samples - 1 = 10 whole windows: 10,000 bytes at 1,000 B/s is the rate.
    rate = Rate(QuotaWindow())
    rate.record(10_000, 0.0)
    assert rate.span_ms(0.0) == 10_000
    assert rate.measure(0.0) == 1000.0
    assert rate.throttle_ms(1000.0, 0.0) == 0
    rate.record(1, 0.0)  # 1000.1 B/s: 0.1 / 1000 * 10,000 ms
    assert rate.throttle_ms(1000.0, 0.0) == 1


def test_a_producer_at_twice_its_quota() -> None:
    # 200 bytes every 100 ms (2,000 B/s) against producer_byte_rate 1,000, never waiting:
    # its usage drains at 1,000 B/s, so at t it holds 200 * (10t + 1) - 1,000t bytes, and
    # the burst is 10 windows of quota (10,000 B).
    manager = ClientQuotaManager({QuotaEntity("alice"): {PRODUCER_BYTE_RATE: 1000.0}})
    throttles = [
        manager.record_and_throttle_ms(QuotaType.PRODUCE, "alice", "app", 200, step / 10)
        for step in range(120)
    ]
    # Up to 9.8 s: 19,800 - 9,800 = 10,000 B, the burst exactly.
    assert throttles[:99] == [0] * 99
    # At 9.9 s: 20,000 - 9,900 = 10,100 B, 100 B over: 100 ms at 1,000 B/s.
    assert throttles[99] == 100
    # At 11.9 s: 24,000 - 11,900 = 12,100 B, 2,100 ms.
    assert throttles[119] == 2100
    # Measured by Kafka's sampled rate all along (metrics): 22,000 B over 10.9 s at 11.9 s,
    # the first sample (last record at 0.9 s) dropped.
    measured = manager.measured(QuotaType.PRODUCE, SensorKey("alice", None), 11.9)
    assert measured == pytest.approx(22_000 / 10.9)


def test_a_client_that_waits_its_throttles_gets_its_quota() -> None:
    # A producer that sends 64 KiB as fast as a 20 MB/s link allows, and waits each throttle
    # it is told, against 512 KiB/s: from its first throttle on it gets the quota (2 %, one
    # 64 KiB batch in 10 s),
    # where Kafka's sampled rate lets it alternate bursts and waits.
    quota = 512 * 1024
    manager = ClientQuotaManager({QuotaEntity(None, "greedy"): {PRODUCER_BYTE_RATE: quota}})
    now, sent, first_throttle = 0.0, [], None
    while now < 120:
        throttle = manager.record_and_throttle_ms(QuotaType.PRODUCE, None, "greedy", 65536, now)
        sent.append(now)
        if throttle and first_throttle is None:
            first_throttle = now
        now += 65536 / 20e6 + throttle / 1000
    assert first_throttle is not None and first_throttle < 1  # the 10 s burst, at 20 MB/s
    for span in (10, 30, 100):
        count = sum(1 for t in sent if first_throttle <= t < first_throttle + span)
        assert count * 65536 / span == pytest.approx(quota, rel=0.02)


def test_under_its_quota_a_client_is_never_throttled() -> None:
    manager = ClientQuotaManager({QuotaEntity(None, DEFAULT): {PRODUCER_BYTE_RATE: 1000.0}})
    assert all(
        manager.record_and_throttle_ms(QuotaType.PRODUCE, None, "app", 99, step / 10) == 0
        for step in range(300)
    )


def test_samples_roll_over_and_empty_after_an_idle_span() -> None:
    rate = Rate(QuotaWindow(samples=2, size_seconds=1))
    rate.record(100, 0.0)
    rate.record(100, 1.0)
    assert rate.total(1.0) == 200 and rate.span_ms(1.0) == 1000
    rate.record(100, 2.0)  # the third slot; the first sample (last record at 0 s) is 2 s old
    assert rate.total(2.0) == 200 and rate.span_ms(2.0) == 1000
    rate.record(100, 3.0)  # reuses the first slot
    assert rate.total(3.0) == 200 and rate.measure(3.0) == 200.0
    assert rate.total(5.0) == 0 and rate.measure(5.0) == 0.0


def test_throttle_time_formula_and_cap() -> None:
    assert throttle_time_ms(2000.0, 1000.0, 10_000) == 10_000
    assert throttle_time_ms(1000.0, 1000.0, 10_000) == 0
    # Half a millisecond rounds up, as Java's Math.round (Python's round would give 0 and 2).
    assert throttle_time_ms(3.0, 2.0, 1) == 1
    assert throttle_time_ms(7.0, 2.0, 1) == 3
    assert throttle_time_ms(1e12, 1.0, 10_000) == MAX_THROTTLE_MS


def test_a_byte_rate_throttle_is_not_capped() -> None:
    manager = ClientQuotaManager({QuotaEntity(None, "app"): {PRODUCER_BYTE_RATE: 1000.0}})
    # 1,000,000 B over 10 s: (100,000 - 1,000) / 1,000 * 10,000 ms.
    assert manager.record_and_throttle_ms(QuotaType.PRODUCE, None, "app", 1e6, 0.0) == 990_000


def test_request_time_is_a_percentage_and_its_throttle_is_at_most_one_window() -> None:
    manager = ClientQuotaManager({QuotaEntity("alice"): {REQUEST_PERCENTAGE: 50.0}})
    # 5.2 s of handling time over 10 s is 52 %: (52 - 50) / 50 * 10,000 ms.
    assert manager.record_and_throttle_ms(QuotaType.REQUEST, "alice", "a", 5.2e9, 0.0) == 400
    assert manager.measured(QuotaType.REQUEST, SensorKey("alice", None), 0.0) == pytest.approx(52)
    # 1 s more: 62 %, 2,400 ms by the formula, capped at the 1 s window.
    assert manager.record_and_throttle_ms(QuotaType.REQUEST, "alice", "a", 1e9, 0.0) == 1000


def test_a_default_quota_is_a_budget_per_user_or_client_id() -> None:
    manager = ClientQuotaManager({QuotaEntity(None, DEFAULT): {PRODUCER_BYTE_RATE: 1000.0}})
    produce = QuotaType.PRODUCE
    assert manager.record_and_throttle_ms(produce, "alice", "a", 10_000, 0.0) == 0
    # Another client id has its own budget under clients/<default>...
    assert manager.record_and_throttle_ms(produce, "alice", "b", 10_000, 0.0) == 0
    # ...and every user with the same client id shares one (Kafka's sensor has no user).
    assert manager.record_and_throttle_ms(produce, "bob", "a", 1, 0.0) == 1
    assert manager.sensor_count() == 2

    by_user = ClientQuotaManager({QuotaEntity(DEFAULT): {PRODUCER_BYTE_RATE: 1000.0}})
    assert by_user.record_and_throttle_ms(produce, "alice", "a", 10_000, 0.0) == 0
    assert by_user.record_and_throttle_ms(produce, "alice", "b", 1, 0.0) == 1  # one per user
    assert by_user.record_and_throttle_ms(produce, "bob", "a", 10_000, 0.0) == 0

    pairs = ClientQuotaManager({QuotaEntity(DEFAULT, DEFAULT): {PRODUCER_BYTE_RATE: 1000.0}})
    assert pairs.record_and_throttle_ms(produce, "alice", "a", 10_000, 0.0) == 0
    assert pairs.record_and_throttle_ms(produce, "alice", "b", 10_000, 0.0) == 0
    assert pairs.record_and_throttle_ms(produce, "alice", "a", 1, 0.0) == 1


def test_idle_rates_expire_after_an_hour() -> None:
    manager = ClientQuotaManager({QuotaEntity("alice"): {PRODUCER_BYTE_RATE: 1000.0}})
    assert manager.record_and_throttle_ms(QuotaType.PRODUCE, "alice", "a", 20_000, 0.0) > 0
    assert manager.expire(3600.0) == 0  # idle for exactly the hour: kept, as in Kafka
    assert manager.sensor_count() == 1
    assert manager.expire(3600.001) == 1
    assert manager.sensor_count() == 0
    assert manager.measured(QuotaType.PRODUCE, SensorKey("alice", None), 3600.001) is None
    # A new rate starts from nothing.
    assert manager.record_and_throttle_ms(QuotaType.PRODUCE, "alice", "a", 100, 3601.0) == 0


def test_new_quotas_apply_to_later_records_and_keep_the_usage() -> None:
    entity = QuotaEntity("alice")
    manager = ClientQuotaManager({entity: {PRODUCER_BYTE_RATE: 2000.0}})
    # 15,000 B over 10 s is 1,500 B/s: within 2,000.
    assert manager.record_and_throttle_ms(QuotaType.PRODUCE, "alice", "a", 15_000, 0.0) == 0
    manager.set_quotas({entity: {PRODUCER_BYTE_RATE: 1000.0}})
    # Within 1,000 no more: (1,500 - 1,000) / 1,000 * 10,000 ms.
    assert manager.record_and_throttle_ms(QuotaType.PRODUCE, "alice", "a", 0, 0.0) == 5000
    manager.set_quotas({entity: {CONSUMER_BYTE_RATE: 1000.0}})
    assert manager.record_and_throttle_ms(QuotaType.PRODUCE, "alice", "a", 1e9, 0.0) == 0
    with pytest.raises(ValueError, match="must be > 0"):
        manager.set_quotas({entity: {PRODUCER_BYTE_RATE: 0.0}})


def test_a_type_with_no_quota_anywhere_measures_nothing() -> None:
    manager = ClientQuotaManager({QuotaEntity("alice"): {CONSUMER_BYTE_RATE: 1000.0}})
    assert manager.record_and_throttle_ms(QuotaType.PRODUCE, "alice", "a", 1e9, 0.0) == 0
    assert manager.sensor_count() == 0
    # A client no level covers is measured, by its client id, but never throttled.
    assert manager.record_and_throttle_ms(QuotaType.FETCH, "bob", "b", 1e9, 0.0) == 0
    assert manager.measured(QuotaType.FETCH, SensorKey(None, "b"), 0.0) == 1e8


def test_a_throttled_fetch_takes_its_bytes_back() -> None:
    manager = ClientQuotaManager({QuotaEntity("alice"): {CONSUMER_BYTE_RATE: 1000.0}})
    assert manager.record_and_throttle_ms(QuotaType.FETCH, "alice", "c", 20_000, 0.0) == 10_000
    manager.unrecord(QuotaType.FETCH, "alice", "c", 20_000, 0.0)
    assert manager.measured(QuotaType.FETCH, SensorKey("alice", None), 0.0) == 0.0
    # record() adds without a check; the next request pays for it.
    manager.record(QuotaType.FETCH, "alice", "c", 20_000, 0.0)
    assert manager.record_and_throttle_ms(QuotaType.FETCH, "alice", "c", 0, 0.0) == 10_000


def test_max_value_in_window() -> None:
    manager = ClientQuotaManager(
        {QuotaEntity("alice"): {CONSUMER_BYTE_RATE: 1000.0}},
        QuotaWindow(samples=11, size_seconds=2),
    )
    assert manager.max_value_in_window(QuotaType.FETCH, "alice", "c") == 1000.0 * 10 * 2
    assert manager.max_value_in_window(QuotaType.FETCH, "bob", "c") is None
