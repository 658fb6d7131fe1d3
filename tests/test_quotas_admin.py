"""Client quotas: AlterClientQuotas checks and DescribeClientQuotas filters
(kafka_wire/quotas/admin.py), with the codes and messages of Kafka 4.x's
ClientQuotaControlManager and ClientQuotasImage."""

from __future__ import annotations

import math

import pytest

from kafka_wire.errors import ErrorCode
from kafka_wire.quotas.admin import (
    FilterComponent,
    InvalidQuotaFilter,
    MatchType,
    QuotaAlteration,
    QuotaFilter,
    QuotaOp,
    alter_client_quotas,
    describe_client_quotas,
    validate_alteration,
)
from kafka_wire.quotas.entities import DEFAULT, QuotaEntity

OK = (ErrorCode.none, None)
USER_CLIENT_KEYS = (
    "producer_byte_rate",
    "consumer_byte_rate",
    "request_percentage",
    "controller_mutation_rate",
)


def check(entity: dict[str, str | None], *ops: QuotaOp) -> tuple[ErrorCode, str | None]:
    return validate_alteration(QuotaAlteration(entity, ops))


def invalid(message: str) -> tuple[ErrorCode, str | None]:
    return ErrorCode.invalid_request, message


@pytest.mark.parametrize(
    "entity",
    [
        {"user": "alice"},
        {"user": None},
        {"client-id": "app"},
        {"client-id": None},
        {"user": "alice", "client-id": "app"},
        {"user": None, "client-id": "app"},
        {"user": "alice", "client-id": None},
        {"user": None, "client-id": None},
    ],
)
def test_user_and_client_id_entities_take_the_four_client_keys(
    entity: dict[str, str | None],
) -> None:
    for key in USER_CLIENT_KEYS:
        assert check(entity, QuotaOp(key, 1000.0)) == OK
    assert check(entity, QuotaOp("connection_creation_rate", 10.0)) == invalid(
        "Invalid configuration key connection_creation_rate"
    )


@pytest.mark.parametrize("ip", ["10.0.0.1", "::1", None])
def test_an_ip_entity_takes_only_the_connection_rate(ip: str | None) -> None:
    assert check({"ip": ip}, QuotaOp("connection_creation_rate", 10.0)) == OK
    assert check({"ip": ip}, QuotaOp("producer_byte_rate", 10.0)) == invalid(
        "Invalid configuration key producer_byte_rate"
    )


def test_an_ip_must_be_an_address_or_a_host_that_resolves() -> None:
    op = QuotaOp("connection_creation_rate", 10.0)
    assert check({"ip": "broker.local"}, op) == invalid(
        "broker.local is not a valid IP or resolvable host."
    )
    alteration = QuotaAlteration({"ip": "broker.local"}, (op,))
    assert validate_alteration(alteration, resolves_host=lambda h: h == "broker.local") == OK


def test_entity_types_and_combinations() -> None:
    op = QuotaOp("producer_byte_rate", 10.0)
    assert check({}, op) == invalid("Invalid empty client quota entity")
    assert check({"group": "g"}, op) == invalid("Unhandled client quota entity type: group")
    assert check({"user": "alice", "group": "g"}, op) == invalid(
        "Unhandled client quota entity type: group"
    )
    assert check({"user": ""}, op) == invalid("Empty user not supported")
    assert check({"client-id": ""}, op) == invalid("Empty client-id not supported")
    combination = invalid(
        "Invalid quota entity combination, IP entity shouldnot be combined with User or ClientId"
    )
    assert check({"user": "alice", "ip": "10.0.0.1"}, op) == combination
    assert check({"client-id": "app", "ip": None}, op) == combination


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("producer_byte_rate", 0.0, "Quota producer_byte_rate must be greater than 0"),
        ("consumer_byte_rate", -5.0, "Quota consumer_byte_rate must be greater than 0"),
        ("request_percentage", math.nan, "Quota request_percentage must be greater than 0"),
        ("producer_byte_rate", 10.5, "producer_byte_rate cannot be a fractional value."),
        (
            "producer_byte_rate",
            2.0**64,
            "Proposed value for producer_byte_rate is too large for a LONG.",
        ),
        ("not.a.quota.key", 1.0, "Invalid configuration key not.a.quota.key"),
    ],
)
def test_bad_values(key: str, value: float, message: str) -> None:
    assert check({"user": "alice"}, QuotaOp(key, value)) == invalid(message)


def test_value_types() -> None:
    assert check({"user": "alice"}, QuotaOp("request_percentage", 12.5)) == OK
    assert check({"user": "alice"}, QuotaOp("producer_byte_rate", 2.0**63)) == OK
    assert check({"user": "alice"}, QuotaOp("producer_byte_rate", 1000.0000001)) == OK
    ip_rate = QuotaOp("connection_creation_rate", 2.0**31)
    assert check({"ip": None}, ip_rate) == invalid(
        "Proposed value for connection_creation_rate is too large for an INT."
    )
    assert check({"ip": None}, QuotaOp("connection_creation_rate", 2.0**31 - 1)) == OK


def test_a_removal_is_not_checked() -> None:
    op = QuotaOp.from_wire("not.a.quota.key", -1.0, remove=True)
    assert op.value is None
    assert check({"user": "alice"}, op) == OK


def test_a_key_named_twice() -> None:
    ops = (QuotaOp("producer_byte_rate", 10.0), QuotaOp("producer_byte_rate", 20.0))
    assert check({"user": "alice"}, *ops) == invalid(
        "Duplicate quota key producer_byte_rate not updating quota for this entity "
        "ClientQuotaEntity(entries={user=alice})"
    )


def test_alter_applies_what_passes_and_drops_emptied_entities() -> None:
    alice = QuotaEntity("alice")
    current = {alice: {"producer_byte_rate": 1000.0, "consumer_byte_rate": 2000.0}}
    outcome = alter_client_quotas(
        current,
        [
            QuotaAlteration(
                {"user": "alice"},
                (QuotaOp("producer_byte_rate", None), QuotaOp("request_percentage", 50.0)),
            ),
            QuotaAlteration({"user": None, "client-id": None}, (QuotaOp("producer_byte_rate", 0),)),
            QuotaAlteration({"client-id": None}, (QuotaOp("consumer_byte_rate", 500.0),)),
        ],
    )
    assert [(r.error_code, r.error_message) for r in outcome.results] == [
        OK,
        invalid("Quota producer_byte_rate must be greater than 0"),
        OK,
    ]
    assert outcome.quotas == {
        alice: {"consumer_byte_rate": 2000.0, "request_percentage": 50.0},
        QuotaEntity(None, DEFAULT): {"consumer_byte_rate": 500.0},
    }
    assert current == {alice: {"producer_byte_rate": 1000.0, "consumer_byte_rate": 2000.0}}
    removed = alter_client_quotas(
        outcome.quotas,
        [QuotaAlteration({"client-id": None}, (QuotaOp("consumer_byte_rate", None),))],
    )
    assert QuotaEntity(None, DEFAULT) not in removed.quotas
    assert removed.quotas[alice] == outcome.quotas[alice]


def test_an_entity_named_twice_is_refused_whole() -> None:
    outcome = alter_client_quotas(
        {},
        [
            QuotaAlteration({"user": "alice"}, (QuotaOp("producer_byte_rate", 10.0),)),
            QuotaAlteration({"user": "alice"}, (QuotaOp("consumer_byte_rate", 10.0),)),
        ],
    )
    assert len(outcome.results) == 1
    result = outcome.results[0]
    assert (result.error_code, result.error_message) == invalid(
        "Ignoring duplicate entity ClientQuotaEntity(entries={user=alice})"
    )
    assert outcome.quotas == {}


QUOTAS = {
    QuotaEntity("alice"): {"producer_byte_rate": 1.0},
    QuotaEntity(DEFAULT): {"producer_byte_rate": 2.0},
    QuotaEntity(None, "app"): {"producer_byte_rate": 3.0},
    QuotaEntity("alice", "app"): {"producer_byte_rate": 4.0},
    QuotaEntity(DEFAULT, DEFAULT): {"producer_byte_rate": 5.0},
    QuotaEntity(ip="10.0.0.1"): {"connection_creation_rate": 6.0},
    QuotaEntity(ip=DEFAULT): {"connection_creation_rate": 7.0},
}


def described(strict: bool, *components: FilterComponent) -> list[str]:
    quota_filter = QuotaFilter.parse(components, strict)
    return sorted(str(entity) for entity, _ in describe_client_quotas(QUOTAS, quota_filter))


@pytest.mark.parametrize(
    ("strict", "components", "expected"),
    [
        (
            False,
            [FilterComponent("user", MatchType.EXACT, "alice")],
            ["users/alice", "users/alice/clients/app"],
        ),
        (True, [FilterComponent("user", MatchType.EXACT, "alice")], ["users/alice"]),
        (
            False,
            [FilterComponent("user", MatchType.DEFAULT)],
            ["users/<default>", "users/<default>/clients/<default>"],
        ),
        (True, [FilterComponent("user", MatchType.DEFAULT)], ["users/<default>"]),
        (True, [FilterComponent("user", MatchType.SPECIFIED)], ["users/<default>", "users/alice"]),
        (
            False,
            [FilterComponent("client-id", MatchType.SPECIFIED)],
            ["clients/app", "users/<default>/clients/<default>", "users/alice/clients/app"],
        ),
        (
            True,
            [
                FilterComponent("user", MatchType.SPECIFIED),
                FilterComponent("client-id", MatchType.EXACT, "app"),
            ],
            ["users/alice/clients/app"],
        ),
        (False, [FilterComponent("ip", MatchType.SPECIFIED)], ["ips/10.0.0.1", "ips/<default>"]),
        (False, [FilterComponent("ip", MatchType.EXACT, "10.0.0.1")], ["ips/10.0.0.1"]),
        (False, [], sorted(str(entity) for entity in QUOTAS)),
        (True, [], []),
    ],
)
def test_describe_filters(
    strict: bool, components: list[FilterComponent], expected: list[str]
) -> None:
    assert described(strict, *components) == expected


def test_describe_answers_all_the_keys_of_a_matched_entity() -> None:
    quotas = {QuotaEntity("bob"): {"producer_byte_rate": 1.0, "request_percentage": 20.0}}
    quota_filter = QuotaFilter.parse([FilterComponent("user", MatchType.EXACT, "bob")], False)
    assert describe_client_quotas(quotas, quota_filter) == [
        (QuotaEntity("bob"), {"producer_byte_rate": 1.0, "request_percentage": 20.0})
    ]


@pytest.mark.parametrize(
    ("components", "code", "message"),
    [
        (
            [FilterComponent("", MatchType.SPECIFIED)],
            ErrorCode.invalid_request,
            "Invalid empty entity type.",
        ),
        (
            [
                FilterComponent("user", MatchType.SPECIFIED),
                FilterComponent("user", MatchType.DEFAULT),
            ],
            ErrorCode.invalid_request,
            "Entity type user cannot appear more than once in the filter.",
        ),
        (
            [FilterComponent("group", MatchType.SPECIFIED)],
            ErrorCode.unsupported_version,
            "Unsupported entity type group",
        ),
        (
            [FilterComponent("user", MatchType.EXACT)],
            ErrorCode.invalid_request,
            "Request specified MATCH_TYPE_EXACT, but set match string to null.",
        ),
        (
            [FilterComponent("user", MatchType.DEFAULT, "x")],
            ErrorCode.invalid_request,
            "Request specified MATCH_TYPE_DEFAULT, but also specified a match string.",
        ),
        (
            [FilterComponent("user", MatchType.SPECIFIED, "x")],
            ErrorCode.invalid_request,
            "Request specified MATCH_TYPE_SPECIFIED, but also specified a match string.",
        ),
        ([FilterComponent("user", 7)], ErrorCode.invalid_request, "Unknown match type 7"),
        (
            [
                FilterComponent("ip", MatchType.SPECIFIED),
                FilterComponent("client-id", MatchType.DEFAULT),
            ],
            ErrorCode.invalid_request,
            "Invalid entity filter component combination. IP filter component should not be used "
            "with user or clientId filter component.",
        ),
    ],
)
def test_refused_describe_filters(
    components: list[FilterComponent], code: ErrorCode, message: str
) -> None:
    with pytest.raises(InvalidQuotaFilter) as refused:
        QuotaFilter.parse(components, strict=False)
    assert (refused.value.error_code, refused.value.message) == (code, message)
