"""The main broker: the real leader of its partitions. Runs the append logic
(validation, idempotent dedup, offsets), persists to its WAL, serves Fetch and ListOffsets,
hosts consumer-group coordinators and answers the cluster APIs to Kafka clients.
"""
