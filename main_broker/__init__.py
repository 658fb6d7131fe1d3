"""The main broker: the real leader of its partitions. Runs the append logic
(validation, idempotent dedup, offsets), persists to its WAL, serves Fetch and ListOffsets,
hosts consumer-group coordinators and answers the cluster APIs to Kafka clients.

Layout, lowest first: the core modules at the top level (partition_log, producer_state,
log_store, state_stream, topic_config, config, accounting, append, ...); then the sub-packages
security, objects, groups, cluster and api, each importing only the core and the ones before
it; broker.py (`MainBroker`) on top imports everything. tests/test_layout.py checks it.
"""
