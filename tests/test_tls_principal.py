"""kafka_wire.tls.principal and .dn: Kafka's ssl.principal.mapping.rules, and subjects printed
as Java's X500Principal.getName() prints them (the expected strings were printed by JDK 17)."""

from __future__ import annotations

import re
import ssl

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.name import _ASN1Type
from cryptography.x509.oid import NameOID, ObjectIdentifier

from fleet.certs import generate_ca, issue_certificate
from kafka_wire.tls import (
    MappingRule,
    NoMatchingRule,
    PrincipalMappingError,
    SslPrincipalMapper,
    parse_rules,
    ssl_principal,
    subject_dn,
    subject_dn_der,
)

# Kafka's SslPrincipalMapperTest and the rules of its security documentation.
KAFKA_RULES = ", ".join(
    [
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L",
        "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L",
        "RULE:^cn=(.*?),ou=(.*?),dc=(.*?),dc=(.*?)$/$1@$2/U",
        "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U",
        "DEFAULT",
    ]
)


@pytest.mark.parametrize(
    ("dn", "name"),
    [
        ("CN=Duke,OU=ServiceUsers,O=Org,C=US", "duke"),
        ("CN=Duke,OU=SME,O=mycp,L=Fulton,ST=MD,C=US", "duke@sme"),
        ("cn=duke,ou=sme,dc=mycp,dc=com", "DUKE@SME"),
        ("cN=duke,OU=JavaSoft,O=Sun Microsystems", "DUKE"),
        ("OU=JavaSoft,O=Sun Microsystems,C=US", "OU=JavaSoft,O=Sun Microsystems,C=US"),
        ("CN=serviceuser,OU=ServiceUsers,O=Unknown,L=Unknown,ST=Unknown,C=Unknown", "serviceuser"),
        ("CN=adminUser,OU=Admin,O=Unknown,L=Unknown,ST=Unknown,C=Unknown", "adminuser@admin"),
    ],
)
def test_kafka_examples(dn: str, name: str) -> None:
    assert SslPrincipalMapper.from_rules(KAFKA_RULES).name(dn) == name


def test_the_rules_of_the_brief() -> None:
    mapper = SslPrincipalMapper.from_rules(
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,"
        "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L,DEFAULT"
    )
    assert mapper.name("CN=Svc,OU=ServiceUsers,O=zf,C=US") == "Svc"
    assert mapper.name("CN=Alice,OU=Eng,O=zf,L=X,ST=Y,C=US") == "alice@eng"
    assert mapper.name("CN=alice,OU=eng,O=zf,C=US") == "CN=alice,OU=eng,O=zf,C=US"


@pytest.mark.parametrize(
    "rules",
    [
        "DEFAULT",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L, DEFAULT",
        "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/",
        "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L",
        "RULE:^cn=(.?),ou=(.?),dc=(.?),dc=(.?)$/$1@$2/U",
        "RULE:^CN=([^,ADEFLTU,]+)(,.*|$)/$1/",
        "RULE:^CN=([^,DEFAULT,]+)(,.*|$)/$1/",
    ],
)
def test_valid_rules(rules: str) -> None:
    assert parse_rules(rules)


@pytest.mark.parametrize(
    "rules",
    [
        "default",
        "DEFAUL",
        "DEFAULT/L",
        "DEFAULT/U",
        "RULE:CN=(.*?),OU=ServiceUsers.*/$1",
        "rule:^CN=(.*?),OU=ServiceUsers.*$/$1/",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L/U",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/L",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/U",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/LU",
        # Kafka accepts these and then fails every authentication; refused up front here.
        "RULE:^CN=.*$/$1/",
        "RULE:^CN=(.*)$/$x/",
        "RULE:^CN=(.*$/$1/",
    ],
)
def test_invalid_rules(rules: str) -> None:
    with pytest.raises(PrincipalMappingError, match="Invalid rule"):
        SslPrincipalMapper.from_rules(rules)


@pytest.mark.parametrize(
    ("rules", "printed"),
    [
        ("", "[]"),
        ("DEFAULT", "[DEFAULT]"),
        ("RULE://", "[RULE:/]"),
        ("RULE:/.*/", "[RULE:/.*]"),
        ("RULE:/.*/L", "[RULE:/.*/L]"),
        ("RULE://,DEFAULT", "[RULE:/, DEFAULT]"),
        ("  RULE:// ,  DEFAULT  ", "[RULE:/, DEFAULT]"),
        ("  RULE:   /     / ,  DEFAULT  ", "[RULE:   /     , DEFAULT]"),
        ("  RULE:  /     /U   ,DEFAULT  ", "[RULE:  /     /U, DEFAULT]"),
        (
            "  RULE:([A-Z]*)/$1/U   ,RULE:([a-z]+)/$1/,   DEFAULT  ",
            "[RULE:([A-Z]*)/$1/U, RULE:([a-z]+)/$1, DEFAULT]",
        ),
        # empty rules are ignored
        (",   , , ,      , , ,   ", "[]"),
        (",,RULE://,,,DEFAULT,,", "[RULE:/, DEFAULT]"),
        (",  , RULE: /   /    ,,,   DEFAULT, ,   ", "[RULE: /   , DEFAULT]"),
        ("     ,  , RULE:   /  /U    ,,  ,DEFAULT, ,", "[RULE:   /  /U, DEFAULT]"),
        # escape sequences
        (r"RULE:\/\\\(\)\n\t/\/\//", r"[RULE:\/\\\(\)\n\t/\/\/]"),
        (r"RULE:\**\/+/*/L,RULE:\/*\**/**/", r"[RULE:\**\/+/*/L, RULE:\/*\**/**]"),
        # commas inside rules
        (
            r"RULE:,RULE:,/,RULE:,\//U,RULE:,/RULE:,/,RULE:,RULE:,/L,RULE:,/L,RULE:, DEFAULT, "
            r"/DEFAULT/,DEFAULT",
            r"[RULE:,RULE:,/,RULE:,\//U, RULE:,/RULE:,, RULE:,RULE:,/L,RULE:,/L, "
            r"RULE:, DEFAULT, /DEFAULT, DEFAULT]",
        ),
    ],
)
def test_rules_splitting(rules: str, printed: str) -> None:
    assert str(SslPrincipalMapper.from_rules(rules)) == f"SslPrincipalMapper(rules = {printed})"


def test_no_rules_means_default_and_empty_means_none() -> None:
    assert SslPrincipalMapper.from_rules(None).name("CN=a,O=b") == "CN=a,O=b"
    with pytest.raises(NoMatchingRule, match=r"^No rules apply to CN=a,O=b, rules \[\]$"):
        SslPrincipalMapper.from_rules("").name("CN=a,O=b")


def test_no_matching_rule_message_is_kafkas() -> None:
    mapper = SslPrincipalMapper.from_rules("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L")
    with pytest.raises(NoMatchingRule) as e:
        mapper.name("CN=bob,OU=eng")
    assert str(e.value) == (
        "No rules apply to CN=bob,OU=eng, rules [RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L]"
    )


def test_escaped_comma_in_a_cn() -> None:
    mapper = SslPrincipalMapper.from_rules(r"RULE:^CN=((\\, *|\w)+)(,.*|$)/$1/,DEFAULT")
    assert mapper.name(r"CN=Tkac\, Adam,OU=ITZ,DC=geodis,DC=cz") == r"Tkac\, Adam"


@pytest.mark.parametrize(
    ("rules", "dn", "name"),
    [
        # a reference past the last group stays text, as Kafka reads it
        ("RULE:^CN=(.*?),OU=(.*?),O=(.*)$/$1@$4/", "CN=a,OU=b,O=c", "a@$4"),
        ("RULE:^CN=(.*?),OU=(.*?),O=(.*)$/$1$45/", "CN=a,OU=b,O=c", "a$45"),
        # Java reads as many digits as still name a group: $12 is group 1 then "2"
        ("RULE:^CN=(.*?),OU=(.*)$/$12/", "CN=a,OU=b", "a2"),
        ("RULE:^CN=(.*?),OU=(.*)$/$0/U", "CN=a,OU=b", "CN=A,OU=B"),
        (r"RULE:^CN=(.*?),OU=(.*)$/\$1\/$2/", "CN=a,OU=b", "$1/b"),
        ("RULE:^CN=(?P<user>[^,]*).*$/${user}/", "CN=a,OU=b", "a"),
        # every match in the DN is replaced (Java's replaceAll), empty ones too
        ("RULE:(.*?)/-$1/", "ab", "-a-b-"),
        # an optional group that did not take part gives nothing
        ("RULE:^CN=([^,]*)(,OU=(.*))?$/$1:$3/", "CN=a", "a:"),
        # matching is ASCII, as Java's \w
        (r"RULE:^CN=(\w+)$/$1/,DEFAULT", "CN=Zoë", "CN=Zoë"),
    ],
)
def test_replacements(rules: str, dn: str, name: str) -> None:
    assert SslPrincipalMapper.from_rules(rules).name(dn) == name


# Subjects as JDK 17's X500Principal.getName() printed them for the same certificates.

A = x509.NameAttribute
SUBJECTS: list[tuple[str, list[x509.NameAttribute], str]] = [
    (
        "plain",
        [
            A(NameOID.COUNTRY_NAME, "US"),
            A(NameOID.ORGANIZATION_NAME, "zf"),
            A(NameOID.ORGANIZATIONAL_UNIT_NAME, "eng"),
        ],
        "CN=alice,OU=eng,O=zf,C=US",
    ),
    (
        "special characters",
        [
            A(NameOID.ORGANIZATION_NAME, 'a,b+c"d\\e<f>g;h=i#j'),
            A(NameOID.ORGANIZATIONAL_UNIT_NAME, "#lead"),
            A(NameOID.LOCALITY_NAME, "  two lead and trail  "),
        ],
        r"CN=alice,L=\ \ two lead and trail\ \ ,OU=\#lead,O=a\,b\+c\"d\\e\<f\>g\;h\=i\#j",
    ),
    (
        "attributes without an RFC 2253 keyword",
        [
            A(NameOID.EMAIL_ADDRESS, "alice@example.com"),
            A(NameOID.SERIAL_NUMBER, "42"),
            A(NameOID.TITLE, "boss"),
            A(NameOID.STATE_OR_PROVINCE_NAME, "MD"),
            A(NameOID.STREET_ADDRESS, "1 Main"),
            A(NameOID.DOMAIN_COMPONENT, "com"),
            A(NameOID.USER_ID, "u1"),
        ],
        "CN=alice,UID=u1,DC=com,STREET=1 Main,ST=MD,2.5.4.12=#0c04626f7373,2.5.4.5=#13023432,"
        "1.2.840.113549.1.9.1=#1611616c696365406578616d706c652e636f6d",
    ),
    (
        "unicode, control characters, an unknown OID",
        [
            A(NameOID.ORGANIZATION_NAME, "Zürich ✓"),
            A(NameOID.ORGANIZATIONAL_UNIT_NAME, "tab\there\rcr"),
            A(ObjectIdentifier("1.2.3.4"), "custom"),
        ],
        "CN=alice,1.2.3.4=#0c06637573746f6d,OU=tab\there\rcr,O=Zürich ✓",
    ),
]


@pytest.fixture(scope="module")
def ca() -> tuple[object, x509.Certificate]:
    return generate_ca("principal test CA")


def _der(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.DER)


def _peercert_dict(cert: x509.Certificate, tmp_path: object) -> dict[str, object]:
    """What getpeercert() returns for `cert`, without a handshake."""
    path = f"{tmp_path}/peer.pem"
    with open(path, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    return ssl._ssl._test_decode_cert(path)  # type: ignore[attr-defined,no-any-return]


@pytest.mark.parametrize(("label", "prefix", "java"), SUBJECTS, ids=[s[0] for s in SUBJECTS])
def test_subject_as_java_prints_it(
    ca: tuple[object, x509.Certificate],
    tmp_path: object,
    label: str,
    prefix: list[x509.NameAttribute],
    java: str,
) -> None:
    _, cert = issue_certificate(ca[0], ca[1], "alice", subject_prefix=prefix)  # type: ignore[arg-type]
    assert subject_dn_der(_der(cert)) == java
    assert subject_dn(_peercert_dict(cert, tmp_path)) == java


def _with_subject(ca: tuple[object, x509.Certificate], name: x509.Name) -> x509.Certificate:
    key, leaf = issue_certificate(ca[0], ca[1], "x")  # type: ignore[arg-type]
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(ca[1].subject)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(leaf.not_valid_before_utc)
        .not_valid_after(leaf.not_valid_after_utc)
        .sign(ca[0], hashes.SHA256())  # type: ignore[arg-type]
    )


def test_string_types_only_the_der_knows(ca: tuple[object, x509.Certificate]) -> None:
    # Java prints non-directory strings in hex and reads every value's bytes as UTF-8, which
    # makes a BMPString's zero bytes NULs; getpeercert()'s dict has lost the types.
    name = x509.Name(
        [
            A(NameOID.ORGANIZATION_NAME, "printable", _ASN1Type.PrintableString),
            A(NameOID.ORGANIZATIONAL_UNIT_NAME, "bmp", _ASN1Type.BMPString),
            A(NameOID.LOCALITY_NAME, "univ", _ASN1Type.UniversalString),
            A(NameOID.STATE_OR_PROVINCE_NAME, "ia5", _ASN1Type.IA5String),
            A(NameOID.STREET_ADDRESS, "t61", _ASN1Type.T61String),
            A(NameOID.TITLE, "t", _ASN1Type.PrintableString),
            A(NameOID.COMMON_NAME, "alice"),
        ]
    )
    assert subject_dn_der(_der(_with_subject(ca, name))) == (
        "CN=alice,2.5.4.12=#130174,STREET=t61,ST=ia5,"
        r"L=#1c10000000750000006e0000006900000076,OU=\00b\00m\00p,O=printable"
    )


def test_multi_valued_rdn(ca: tuple[object, x509.Certificate], tmp_path: object) -> None:
    name = x509.Name(
        [
            x509.RelativeDistinguishedName(
                [A(NameOID.COMMON_NAME, "bob"), A(NameOID.USER_ID, "b1")]
            ),
            x509.RelativeDistinguishedName([A(NameOID.ORGANIZATION_NAME, "zf")]),
        ]
    )
    cert = _with_subject(ca, name)
    assert subject_dn_der(_der(cert)) == "O=zf,CN=bob+UID=b1"
    assert subject_dn(_peercert_dict(cert, tmp_path)) == "O=zf,CN=bob+UID=b1"


@pytest.mark.parametrize(
    ("value", "escaped"),
    [
        (" lead", r"\ lead"),
        ("trail ", r"trail\ "),
        ("   ", r"\ \ \ "),
        ("#x", r"\#x"),
        ("a\0b", r"a\00b"),
        ("in ner", "in ner"),
        ("a+b=c", r"a\+b\=c"),
    ],
)
def test_value_escaping(value: str, escaped: str) -> None:
    assert subject_dn({"subject": ((("commonName", value),),)}) == f"CN={escaped}"


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="no subject"):
        subject_dn({})
    with pytest.raises(ValueError, match=r"not a DER X\.509 certificate"):
        subject_dn_der(b"\x30\x03\x02\x01")


def test_principal_of_a_certificate(ca: tuple[object, x509.Certificate]) -> None:
    _, cert = issue_certificate(
        ca[0],  # type: ignore[arg-type]
        ca[1],
        "Duke",
        subject_prefix=[
            A(NameOID.ORGANIZATION_NAME, "Org"),
            A(NameOID.ORGANIZATIONAL_UNIT_NAME, "ServiceUsers"),
        ],
        client=True,
    )
    mapper = SslPrincipalMapper.from_rules(KAFKA_RULES)
    assert ssl_principal(mapper, _der(cert)) == "User:duke"
    assert ssl_principal(mapper, None) == "User:ANONYMOUS"
    with pytest.raises(NoMatchingRule):
        ssl_principal(SslPrincipalMapper.from_rules("RULE:^O=(.*)$/$1/"), _der(cert))


def test_rule_built_directly() -> None:
    rule = MappingRule(re.compile(r"^CN=([^,]*).*$"), "$1", "U")
    assert rule.apply("CN=a,O=b") == "A"
    assert rule.apply("O=b") is None
    assert str(rule) == "RULE:^CN=([^,]*).*$/$1/U"
    assert MappingRule().apply("O=b") == "O=b"
    with pytest.raises(PrincipalMappingError):
        MappingRule(re.compile("^CN=.*$"), "$1")
