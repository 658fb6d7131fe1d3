"""Kafka wire protocol: framing over trio streams, a thin codec facade over kio,
RecordBatch v2 parsing/validation/offset patching, hand-written hot-path codecs, and a small
request client. Imports no other zonefleet package.
"""
