"""Kafka wire protocol: framing over trio streams, a thin codec facade over kio,
RecordBatch v2 parsing/validation/offset patching, hand-written hot-path codecs, a small
request client, and the SASL server cores (`kafka_wire.sasl`). Imports no other zonefleet
package.
"""
