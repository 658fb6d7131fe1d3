"""A certificate subject as the RFC 2253 string that Java's `X500Principal.getName()` prints,
which is what Kafka's `ssl.principal.mapping.rules` are matched against.

What Java does, checked against JDK 17:

- RDNs in reverse of the certificate's order (most specific first: "CN=alice,OU=eng,O=zf,C=US"
  for a subject encoded C, O, OU, CN), joined by ","; the values of a multi-valued RDN in
  encoded order, joined by "+".
- Keywords only for RFC 2253's attribute types: CN, C, L, ST, O, OU, STREET, DC, UID. Any other
  type (emailAddress, serialNumber, title, ...) is printed as its dotted OID and "#" followed
  by the hex of the DER value, e.g. "1.2.840.113549.1.9.1=#1611616c...".
- A keyword value that is not a directory string (UniversalString, VisibleString,
  NumericString, not a string at all) is printed as "#" hex too.
- In other values every one of `, = + < > # ; " \\` is escaped with a backslash (not only a
  leading "#"), NUL is printed "\\00", each leading or trailing space or CR is escaped.
  The value's bytes are read as UTF-8 whatever the string type (so a BMPString "ab" prints
  "\\00a\\00b").

`subject_dn_der` reads the certificate's DER (`getpeercert(binary_form=True)`) and is exact.
`subject_dn` works from `getpeercert()`'s dict, which has lost the string types: for the
non-keyword attributes it assumes the type OpenSSL and `cryptography` write (IA5String for
emailAddress, PrintableString for serialNumber and dnQualifier, UTF8String otherwise), and it
reads a value as Python decoded it.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["subject_dn", "subject_dn_der"]

# RFC 2253's keywords by OID: the only attribute types Java prints by name.
_KEYWORDS = {
    "2.5.4.3": "CN",
    "2.5.4.6": "C",
    "2.5.4.7": "L",
    "2.5.4.8": "ST",
    "2.5.4.10": "O",
    "2.5.4.11": "OU",
    "2.5.4.9": "STREET",
    "0.9.2342.19200300.100.1.25": "DC",
    "0.9.2342.19200300.100.1.1": "UID",
}
# getpeercert()'s names (OpenSSL's long names) for the same.
_KEYWORDS_BY_LONG_NAME = {
    "commonName": "CN",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}

_UTF8_STRING, _PRINTABLE_STRING, _T61_STRING, _IA5_STRING = 0x0C, 0x13, 0x14, 0x16
_GENERAL_STRING, _BMP_STRING = 0x1B, 0x1E
# The string types Java prints as text in RFC 2253 form; any other value is printed as hex.
_DIRECTORY_STRINGS = frozenset(
    {_UTF8_STRING, _PRINTABLE_STRING, _T61_STRING, _IA5_STRING, _GENERAL_STRING, _BMP_STRING}
)
# The string type assumed for a non-keyword attribute when only the decoded value is known.
_ASSUMED_TYPES = {
    "1.2.840.113549.1.9.1": _IA5_STRING,  # emailAddress (PKCS #9)
    "2.5.4.5": _PRINTABLE_STRING,  # serialNumber
    "2.5.4.46": _PRINTABLE_STRING,  # dnQualifier
    "1.3.6.1.4.1.311.60.2.1.3": _PRINTABLE_STRING,  # jurisdictionCountryName
}

_ESCAPED = frozenset(',=+<>#;"\\')


def _escape(value: str) -> str:
    chars: list[str] = []
    for c in value:
        if c in _ESCAPED:
            chars.append("\\" + c)
        elif c == "\0":
            chars.append("\\00")
        else:
            chars.append(c)
    text = "".join(chars)
    # Java escapes the whole run of leading and trailing spaces and CRs, one by one.
    body = text.strip(" \r")
    if not body:
        return "".join("\\" + c for c in text)
    lead = len(text) - len(text.lstrip(" \r"))
    trail = len(text) - len(text.rstrip(" \r"))
    head, tail = text[:lead], text[len(text) - trail :]
    return "".join("\\" + c for c in head) + body + "".join("\\" + c for c in tail)


def _der_length(n: int) -> bytes:
    if n < 0x80:
        return bytes([n])
    octets = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(octets)]) + octets


def _hex_value(tlv: bytes) -> str:
    return "#" + tlv.hex()


def _join(rdns: Iterable[Sequence[str]]) -> str:
    return ",".join("+".join(avas) for avas in reversed(list(rdns)))


def subject_dn(peer_cert: Mapping[str, Any]) -> str:
    """The RFC 2253 subject, as Java prints it, from `SSLSocket.getpeercert()`'s dict.

    Exact for the keyword attributes; see the module docstring for the others. Raises
    ValueError for a dict without a subject (`getpeercert()` of an unverified peer is {}).
    """
    subject = peer_cert.get("subject")
    if not subject:
        raise ValueError("the peer certificate dict has no subject")
    rdns: list[list[str]] = []
    for rdn in subject:
        avas: list[str] = []
        for name, value in rdn:
            keyword = _KEYWORDS_BY_LONG_NAME.get(name)
            if keyword is not None:
                avas.append(f"{keyword}={_escape(value)}")
                continue
            oid = name if name[:1].isdigit() else ssl._ASN1Object.fromname(name).oid
            tag = _ASSUMED_TYPES.get(oid, _UTF8_STRING)
            data = value.encode("utf-8")
            avas.append(f"{oid}={_hex_value(bytes([tag]) + _der_length(len(data)) + data)}")
        rdns.append(avas)
    return _join(rdns)


# A minimal DER reader: enough of X.509 to reach the subject Name and walk it.


def _read_tlv(buf: bytes, pos: int) -> tuple[int, int, int]:
    """(tag, start of contents, end) of the element at `pos`; the tag is its first octet."""
    tag = buf[pos]
    pos += 1
    if tag & 0x1F == 0x1F:  # high tag number: the number continues in base-128 octets
        while buf[pos] & 0x80:
            pos += 1
        pos += 1
    first = buf[pos]
    pos += 1
    if first < 0x80:
        length = first
    else:
        count = first & 0x7F
        if count == 0 or count > 4:
            raise ValueError("unsupported DER length")
        length = int.from_bytes(buf[pos : pos + count], "big")
        pos += count
    end = pos + length
    if end > len(buf):
        raise ValueError("DER element runs past the end of the certificate")
    return tag, pos, end


def _children(buf: bytes, start: int, end: int) -> list[tuple[int, int, int, int]]:
    """(tag, element start, contents start, end) of each element in `buf[start:end]`."""
    result = []
    pos = start
    while pos < end:
        tag, contents, element_end = _read_tlv(buf, pos)
        result.append((tag, pos, contents, element_end))
        pos = element_end
    return result


def _oid(data: bytes) -> str:
    arcs: list[int] = []
    value = 0
    for octet in data:
        value = (value << 7) | (octet & 0x7F)
        if not octet & 0x80:
            arcs.append(value)
            value = 0
    if not arcs:
        raise ValueError("empty OID")
    first = arcs[0]
    head = [0, first] if first < 40 else [1, first - 40] if first < 80 else [2, first - 80]
    return ".".join(str(a) for a in head + arcs[1:])


def subject_dn_der(cert_der: bytes) -> str:
    """The RFC 2253 subject, exactly as Java prints it, from a DER certificate
    (`getpeercert(binary_form=True)`). Raises ValueError if the DER is not a certificate."""
    try:
        _, cert_start, cert_end = _read_tlv(cert_der, 0)
        tbs_tag, _, tbs_start, tbs_end = _children(cert_der, cert_start, cert_end)[0]
        if tbs_tag != 0x30:
            raise ValueError("no TBSCertificate")
        fields = _children(cert_der, tbs_start, tbs_end)
        if fields[0][0] == 0xA0:  # [0] version, absent in v1 certificates
            fields = fields[1:]
        # serialNumber, signature, issuer, validity, subject
        _, _, name_start, name_end = fields[4]
        rdns: list[list[str]] = []
        for _, _, set_start, set_end in _children(cert_der, name_start, name_end):
            avas: list[str] = []
            for _, _, seq_start, seq_end in _children(cert_der, set_start, set_end):
                (_, _, oid_start, oid_end), (tag, value_pos, value_start, value_end) = _children(
                    cert_der, seq_start, seq_end
                )
                oid = _oid(cert_der[oid_start:oid_end])
                keyword = _KEYWORDS.get(oid)
                if keyword is None or tag not in _DIRECTORY_STRINGS:
                    avas.append(f"{keyword or oid}={_hex_value(cert_der[value_pos:value_end])}")
                else:
                    text = cert_der[value_start:value_end].decode("utf-8", "replace")
                    avas.append(f"{keyword}={_escape(text)}")
            rdns.append(avas)
    except (IndexError, ValueError) as e:
        raise ValueError(f"not a DER X.509 certificate: {e}") from e
    return _join(rdns)
