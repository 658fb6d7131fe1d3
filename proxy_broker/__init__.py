"""Zone proxy broker: poses as the leader of remote partitions to clients in its
zone, writes payloads to the shared WAL and confirms them with the owning main broker.
(Arrives with the proxy issue.)
"""
