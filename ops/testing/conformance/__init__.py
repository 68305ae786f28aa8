"""Conformance against Kafka's own answers.

A corpus of request sequences (:mod:`.corpus`) is replayed (:mod:`.replay`) against a real
Kafka node, whose normalised answers are kept as golden files (:mod:`.golden`, re-recorded
with ``python -m ops.testing.conformance record``), and against pidctl; every difference
must be one declared deliberate (:mod:`.differences`, docs/kafka-conformance.md).
"""
