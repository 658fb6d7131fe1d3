"""Client quotas: which configured quota applies to a client (kafka_wire/quotas/entities.py),
Kafka's eight levels of KIP-55 precedence and the sensor each level measures by."""

from __future__ import annotations

import pytest

from kafka_wire.quotas.entities import (
    ANONYMOUS,
    CONSUMER_BYTE_RATE,
    DEFAULT,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    QuotaEntity,
    SensorKey,
    precedence,
    resolve,
    resolve_key,
)


def levels(user: str, client_id: str) -> list[tuple[QuotaEntity, SensorKey]]:
    """The eight levels, most specific first, with the sensor Kafka measures each by."""
    both = SensorKey(user, client_id)
    return [
        (QuotaEntity(user, client_id), both),  # users/<user>/clients/<client-id>
        (QuotaEntity(user, DEFAULT), both),  # users/<user>/clients/<default>
        (QuotaEntity(user), SensorKey(user, None)),  # users/<user>
        (QuotaEntity(DEFAULT, client_id), both),  # users/<default>/clients/<client-id>
        (QuotaEntity(DEFAULT, DEFAULT), both),  # users/<default>/clients/<default>
        (QuotaEntity(DEFAULT), SensorKey(user, None)),  # users/<default>
        (QuotaEntity(None, client_id), SensorKey(None, client_id)),  # clients/<client-id>
        (QuotaEntity(None, DEFAULT), SensorKey(None, client_id)),  # clients/<default>
    ]


def test_precedence_lists_the_eight_levels_in_kafkas_order() -> None:
    assert list(precedence("alice", "app")) == [entity for entity, _ in levels("alice", "app")]
    assert [str(entity) for entity in precedence("alice", "app")] == [
        "users/alice/clients/app",
        "users/alice/clients/<default>",
        "users/alice",
        "users/<default>/clients/app",
        "users/<default>/clients/<default>",
        "users/<default>",
        "clients/app",
        "clients/<default>",
    ]


@pytest.mark.parametrize("user", ["alice", None], ids=["authenticated", "anonymous"])
@pytest.mark.parametrize("level", range(8))
def test_the_most_specific_configured_level_applies(user: str | None, level: int) -> None:
    # Levels `level`..8 are configured, each with its own value: the first one wins.
    name = ANONYMOUS if user is None else user
    table = levels(name, "app")
    quotas = {entity: {PRODUCER_BYTE_RATE: 1000.0 * (i + 1)} for i, (entity, _) in enumerate(table)}
    for entity, _ in table[:level]:
        del quotas[entity]
    resolved = resolve_key(quotas, PRODUCER_BYTE_RATE, user, "app")
    assert resolved.value == 1000.0 * (level + 1)
    assert resolved.entity == table[level][0]
    assert resolved.sensor == table[level][1]


def test_other_users_and_client_ids_do_not_match() -> None:
    quotas = {
        QuotaEntity("bob", "app"): {PRODUCER_BYTE_RATE: 1.0},
        QuotaEntity("bob"): {PRODUCER_BYTE_RATE: 2.0},
        QuotaEntity(None, "other"): {PRODUCER_BYTE_RATE: 3.0},
        QuotaEntity(DEFAULT, "other"): {PRODUCER_BYTE_RATE: 4.0},
    }
    resolved = resolve_key(quotas, PRODUCER_BYTE_RATE, "alice", "app")
    assert resolved.value is None and resolved.entity is None
    assert resolved.sensor == SensorKey(None, "app")


def test_an_unauthenticated_client_is_the_user_anonymous() -> None:
    quotas = {
        QuotaEntity(ANONYMOUS): {PRODUCER_BYTE_RATE: 10.0},
        QuotaEntity(DEFAULT): {PRODUCER_BYTE_RATE: 20.0},
    }
    anonymous = resolve_key(quotas, PRODUCER_BYTE_RATE, None, "app")
    assert (anonymous.value, anonymous.entity) == (10.0, QuotaEntity(ANONYMOUS))
    assert anonymous.sensor == SensorKey(ANONYMOUS, None)
    # The user default covers ANONYMOUS too.
    del quotas[QuotaEntity(ANONYMOUS)]
    assert resolve_key(quotas, PRODUCER_BYTE_RATE, None, "app").entity == QuotaEntity(DEFAULT)


def test_each_key_is_resolved_on_its_own() -> None:
    quotas = {
        QuotaEntity("alice"): {PRODUCER_BYTE_RATE: 1000.0},
        QuotaEntity("alice", "app"): {REQUEST_PERCENTAGE: 25.0},
        QuotaEntity(None, DEFAULT): {CONSUMER_BYTE_RATE: 5000.0, PRODUCER_BYTE_RATE: 9.0},
    }
    resolved = resolve(quotas, "alice", "app")
    assert resolved[PRODUCER_BYTE_RATE].entity == QuotaEntity("alice")
    assert resolved[PRODUCER_BYTE_RATE].value == 1000.0
    assert resolved[REQUEST_PERCENTAGE].entity == QuotaEntity("alice", "app")
    assert resolved[REQUEST_PERCENTAGE].sensor == SensorKey("alice", "app")
    assert resolved[CONSUMER_BYTE_RATE].entity == QuotaEntity(None, DEFAULT)
    assert resolved[CONSUMER_BYTE_RATE].sensor == SensorKey(None, "app")


@pytest.mark.parametrize("client_id", ["", None])
def test_an_empty_client_id_takes_only_the_user_levels(client_id: str | None) -> None:
    # As in Kafka: no level that names a client id applies, <default> ones included.
    assert precedence("alice", client_id) == (QuotaEntity("alice"), QuotaEntity(DEFAULT))
    client_levels = {
        QuotaEntity("alice", DEFAULT): {PRODUCER_BYTE_RATE: 1.0},
        QuotaEntity(DEFAULT, DEFAULT): {PRODUCER_BYTE_RATE: 2.0},
        QuotaEntity(None, DEFAULT): {PRODUCER_BYTE_RATE: 3.0},
    }
    assert resolve_key(client_levels, PRODUCER_BYTE_RATE, "alice", client_id).value is None
    with_user = {**client_levels, QuotaEntity(DEFAULT): {PRODUCER_BYTE_RATE: 4.0}}
    resolved = resolve_key(with_user, PRODUCER_BYTE_RATE, "alice", client_id)
    assert (resolved.value, resolved.sensor) == (4.0, SensorKey("alice", None))


def test_entities_convert_to_and_from_kafkas_form() -> None:
    entity = QuotaEntity("alice", DEFAULT)
    assert entity.to_kafka() == {"user": "alice", "client-id": None}
    assert QuotaEntity.from_kafka({"client-id": None, "user": "alice"}) == entity
    assert QuotaEntity.from_kafka({"ip": "10.0.0.1"}) == QuotaEntity(ip="10.0.0.1")
    assert str(QuotaEntity(ip=DEFAULT)) == "ips/<default>"
    # A user literally named "<default>" is not the default entry.
    assert QuotaEntity("<default>") != QuotaEntity(DEFAULT)
    with pytest.raises(ValueError, match="group"):
        QuotaEntity.from_kafka({"group": "g"})
