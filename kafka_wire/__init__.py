"""Kafka wire protocol: framing over trio streams, a thin codec facade over kio,
RecordBatch v2 parsing/validation/offset patching, hand-written hot-path codecs, a small
request client, named listeners and their TLS and SASL edge (`listeners`,
`secure_listeners`, `kafka_wire.tls`, `kafka_wire.sasl`), the ACL authorizer
(`kafka_wire.acl`), the ACL and SCRAM documents (`security_docs`) and the client quota cores
(`kafka_wire.quotas`). Of zonefleet's own packages it imports only `telemetry` (rate-limited
bad-input logging, metrics, the audit log).
"""
