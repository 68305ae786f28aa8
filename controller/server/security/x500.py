"""A TLS client's principal as Kafka names it: the certificate subject as Java's
``X500Principal.getName()`` writes it (RFC 2253), character for character.

Kafka's default principal builder takes ``User:`` + that name, and ACLs, super users and
deny rules copied from a Kafka cluster must match it exactly: a name that differs fails an
allow ACL closed and a deny ACL open. So the subject is read from the certificate's DER
(Python's ``getpeercert()`` dict loses the value's ASN.1 type, which decides the form) and
written as Java 17's ``sun.security.x509.AVA.toRFC2253String`` does:

- RDNs from the last to the first, joined by ``,``; the values of one RDN in their DER
  order, joined by ``+``;
- the keywords of RFC 2253 only (CN, C, L, ST, O, OU, STREET, DC, UID); any other type
  (emailAddress, serialNumber, title, givenName, SN, ...) as its dotted OID, and then the
  value as ``#`` and the hex of its DER encoding; so too a value that is not one of the
  string types Java reads (PrintableString, T61String, IA5String, GeneralString, BMPString,
  UTF8String);
- a string value's bytes read as UTF-8 (BMPString's too, as Java 17 does), then each of
  ``,=+<>#;"\\`` escaped with a backslash, NUL written ``\\00``, every other character as
  it is; then each space or carriage return at the start or the end escaped too.

``tests/controller/server/security/test_x500.py`` compares these names with what Java itself prints
for the same certificates.
"""

from __future__ import annotations

#: Keywords Java writes in RFC 2253 names (AVAKeyword's rfc2253Compliant ones), by OID.
RFC2253_KEYWORDS = {
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
#: ASN.1 string types Java writes as text (DerValue tags, AVA.isDerString non-canonical):
#: UTF8String, PrintableString, T61String, IA5String, GeneralString, BMPString.
_STRING_TAGS = frozenset({0x0C, 0x13, 0x14, 0x16, 0x1B, 0x1E})
_ESCAPED = frozenset(',=+<>#;"\\')
_SEQUENCE, _SET, _OID = 0x30, 0x31, 0x06
_EXPLICIT_VERSION = 0xA0


class BadCertificate(ValueError):
    """The DER does not hold an X.509 certificate's subject where one must be."""


def _element(data: bytes, position: int) -> tuple[int, int, int]:
    """(tag, start of the content, end of the element) of the DER element at ``position``."""
    if position + 2 > len(data):
        raise BadCertificate(f"DER element at byte {position} is truncated")
    tag, length = data[position], data[position + 1]
    start = position + 2
    if length & 0x80:
        count = length & 0x7F
        if count == 0 or count > 4 or start + count > len(data):
            raise BadCertificate(f"DER length at byte {position} is not supported")
        length = int.from_bytes(data[start : start + count], "big")
        start += count
    end = start + length
    if end > len(data):
        raise BadCertificate(f"DER element at byte {position} runs past the end")
    return tag, start, end


def _children(data: bytes, start: int, end: int) -> list[tuple[int, int, int, int]]:
    """(tag, element start, content start, end) of each element in ``data[start:end]``."""
    children = []
    position = start
    while position < end:
        tag, content, after = _element(data, position)
        children.append((tag, position, content, after))
        position = after
    return children


def _oid(content: bytes) -> str:
    arcs: list[int] = []
    value = 0
    for byte in content:
        value = value << 7 | byte & 0x7F
        if not byte & 0x80:
            arcs.append(value)
            value = 0
    if not arcs:
        raise BadCertificate("empty object identifier")
    first = arcs[0]
    head = [0, first] if first < 40 else [1, first - 40] if first < 80 else [2, first - 80]
    return ".".join(map(str, head + arcs[1:]))


def subject_der(certificate: bytes) -> tuple[int, int]:
    """(start, end) of the subject Name's content in a certificate's DER."""
    _, content, _ = _element(certificate, 0)  # Certificate
    tag, tbs, tbs_end = _element(certificate, content)  # TBSCertificate
    fields = _children(certificate, tbs, tbs_end)
    if fields and fields[0][0] == _EXPLICIT_VERSION:
        fields = fields[1:]
    # serialNumber, signature, issuer, validity, subject
    if tag != _SEQUENCE or len(fields) < 5 or fields[4][0] != _SEQUENCE:
        raise BadCertificate("no subject where a certificate has it")
    return fields[4][2], fields[4][3]


def rfc2253_name(certificate: bytes) -> str:
    """The subject of a DER certificate as Java's ``X500Principal.getName()`` writes it."""
    start, end = subject_der(certificate)
    rdns = []
    for tag, _, content, after in _children(certificate, start, end):
        if tag != _SET:
            raise BadCertificate("a subject RDN is not a SET")
        values = []
        for ava_tag, _, ava, ava_end in _children(certificate, content, after):
            parts = _children(certificate, ava, ava_end)
            if ava_tag != _SEQUENCE or len(parts) != 2 or parts[0][0] != _OID:
                raise BadCertificate("a subject attribute is not (OID, value)")
            oid = _oid(certificate[parts[0][2] : parts[0][3]])
            value_tag, value_start, value_content, value_end = parts[1]
            keyword = RFC2253_KEYWORDS.get(oid)
            if keyword is None or value_tag not in _STRING_TAGS:
                encoded = certificate[value_start:value_end].hex()
                values.append(f"{keyword or oid}=#{encoded}")
            else:
                text = certificate[value_content:value_end].decode("utf-8", "replace")
                values.append(f"{keyword}={_escape(text)}")
        rdns.append("+".join(values))
    return ",".join(reversed(rdns))


def _escape(value: str) -> str:
    escaped = "".join("\\" + c if c in _ESCAPED else "\\00" if c == "\0" else c for c in value)
    lead = 0
    while lead < len(escaped) and escaped[lead] in " \r":
        lead += 1
    trail = len(escaped) - 1
    while trail >= lead and escaped[trail] in " \r":
        trail -= 1
    return "".join("\\" + c if i < lead or i > trail else c for i, c in enumerate(escaped))


def principal_from_certificate(certificate: bytes | None) -> str | None:
    """``User:<subject>`` as Kafka's default principal builder names a TLS client with
    this DER certificate, or None without one (or with an empty subject)."""
    if not certificate:
        return None
    name = rfc2253_name(certificate)
    return f"User:{name}" if name else None
