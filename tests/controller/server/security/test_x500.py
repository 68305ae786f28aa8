"""Principals from certificates are the names Java itself gives them: a tiny Java program,
compiled here, prints ``X500Principal.getName()`` of real certificates (made with the
``cryptography`` package), and ours must be the same, character for character."""

from __future__ import annotations

import datetime
import subprocess
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.name import _ASN1Type
from cryptography.x509.oid import NameOID

from ops.testing.java import compile_java, require_java
from pidctl.controller.server.security.x500 import (
    BadCertificate,
    principal_from_certificate,
    rfc2253_name,
)

NAMES_JAVA = """
import java.io.InputStream;
import java.io.PrintStream;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.security.cert.CertificateFactory;
import java.security.cert.X509Certificate;

/** Prints X500Principal.getName() of each certificate's subject, NUL-terminated. */
public class Names {
    public static void main(String[] paths) throws Exception {
        PrintStream out = new PrintStream(System.out, true, "UTF-8");
        CertificateFactory factory = CertificateFactory.getInstance("X.509");
        for (String path : paths) {
            try (InputStream in = Files.newInputStream(Paths.get(path))) {
                X509Certificate certificate = (X509Certificate) factory.generateCertificate(in);
                out.print(certificate.getSubjectX500Principal().getName());
                out.print('\\0');
            }
        }
    }
}
"""

A = x509.NameAttribute
RDN = x509.RelativeDistinguishedName
SUBJECTS: dict[str, list[RDN]] = {
    "kafka-style": [
        RDN([A(NameOID.COUNTRY_NAME, "DE")]),
        RDN([A(NameOID.ORGANIZATION_NAME, "acme")]),
        RDN([A(NameOID.ORGANIZATIONAL_UNIT_NAME, "brokers")]),
        RDN([A(NameOID.COMMON_NAME, "broker-1")]),
    ],
    "oid-types": [
        RDN([A(NameOID.COMMON_NAME, "a")]),
        RDN([A(NameOID.EMAIL_ADDRESS, "a@b.c")]),
        RDN([A(NameOID.SERIAL_NUMBER, "123")]),
        RDN([A(NameOID.TITLE, "boss")]),
        RDN([A(NameOID.GIVEN_NAME, "Al")]),
        RDN([A(NameOID.SURNAME, "Bo")]),
        RDN([A(NameOID.PSEUDONYM, "ps")]),
        RDN([A(NameOID.DN_QUALIFIER, "dq")]),
        RDN([A(NameOID.INITIALS, "ab")]),
    ],
    "escapes": [RDN([A(NameOID.COMMON_NAME, '#lead, "q" +<>;=\\ trail ')])],
    "spaces": [RDN([A(NameOID.COMMON_NAME, "  two  ")])],
    "all-spaces": [RDN([A(NameOID.COMMON_NAME, "   ")])],
    "carriage-returns": [RDN([A(NameOID.COMMON_NAME, "\r x \r")])],
    "hash-inside": [RDN([A(NameOID.COMMON_NAME, "a#b=c")])],
    "controls": [RDN([A(NameOID.COMMON_NAME, "a\x00b\nc\x7f\x00 ")])],
    "multi-valued": [
        RDN([A(NameOID.DOMAIN_COMPONENT, "example")]),
        RDN([A(NameOID.COMMON_NAME, "x"), A(NameOID.USER_ID, "u1")]),
    ],
    "unicode": [
        RDN([A(NameOID.STREET_ADDRESS, "Str. 1")]),
        RDN([A(NameOID.STATE_OR_PROVINCE_NAME, "NRW")]),
        RDN([A(NameOID.LOCALITY_NAME, "Köln")]),
        RDN([A(NameOID.COMMON_NAME, "José Ñ 日本 🙂")]),
    ],
    "string-types": [
        RDN([A(NameOID.COMMON_NAME, "p s", _ASN1Type.PrintableString)]),
        RDN([A(NameOID.ORGANIZATION_NAME, "bmp é", _ASN1Type.BMPString)]),
        RDN([A(NameOID.ORGANIZATIONAL_UNIT_NAME, "ia5", _ASN1Type.IA5String)]),
        RDN([A(NameOID.LOCALITY_NAME, "universal", _ASN1Type.UniversalString)]),
        RDN([A(NameOID.STATE_OR_PROVINCE_NAME, "t61", _ASN1Type.T61String)]),
    ],
}


def certificate(subject: list[RDN]) -> bytes:
    """A self-signed DER certificate with this subject."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(subject)
    now = datetime.datetime.now(datetime.UTC)
    built = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    return built.public_bytes(serialization.Encoding.DER)


def java_names(tmp_path: Path, certificates: list[bytes]) -> list[str]:
    """What Java's X500Principal.getName() says of each certificate's subject."""
    java = require_java()
    source = tmp_path / "Names.java"
    source.write_text(NAMES_JAVA)
    classes = compile_java([source], "", tmp_path / "java")
    paths = []
    for index, der in enumerate(certificates):
        path = tmp_path / f"{index}.der"
        path.write_bytes(der)
        paths.append(str(path))
    printed = subprocess.run(
        [java, "-cp", str(classes), "Names", *paths], capture_output=True, check=True
    ).stdout
    return printed.decode("utf-8").split("\0")[:-1]


def test_names_are_javas(tmp_path: Path) -> None:
    certificates = [certificate(subject) for subject in SUBJECTS.values()]
    expected = java_names(tmp_path, certificates)
    ours = [rfc2253_name(der) for der in certificates]
    assert dict(zip(SUBJECTS, ours, strict=True)) == dict(zip(SUBJECTS, expected, strict=True))
    # What used to differ, spelled out: OIDs and hex, not EMAILADDRESS=...; a leading '#'
    # and outer spaces escaped.
    named = dict(zip(SUBJECTS, ours, strict=True))
    assert "1.2.840.113549.1.9.1=#16056140622e63" in named["oid-types"]
    assert named["escapes"].startswith("CN=\\#lead\\,") and named["escapes"].endswith("\\ ")


def test_a_principal_is_user_and_the_name_or_none() -> None:
    der = certificate(SUBJECTS["kafka-style"])
    assert principal_from_certificate(der) == "User:CN=broker-1,OU=brokers,O=acme,C=DE"
    assert principal_from_certificate(None) is None
    assert principal_from_certificate(certificate([])) is None  # an empty subject


@pytest.mark.parametrize("cut", [1, 10, 100])
def test_a_truncated_certificate_is_refused(cut: int) -> None:
    der = certificate(SUBJECTS["kafka-style"])
    with pytest.raises(BadCertificate):
        rfc2253_name(der[:cut])
