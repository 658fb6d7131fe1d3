"""Kafka wire protocol: framing over trio streams, a thin codec facade over kio,
RecordBatch v2 parsing/validation/offset patching, hand-written hot-path codecs, a small
request client, the SASL server cores (`kafka_wire.sasl`) and the client quota cores
(`kafka_wire.quotas`). Imports no other zonefleet package.
"""
