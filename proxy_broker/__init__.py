"""Zone proxy broker: poses as the leader of remote partitions to clients in its zone. It
prepares Produce payloads in the shared WAL and confirms them with the owning main, mirrors
each main's state and WAL to serve Fetch locally, and relays everything else with zone-aware
rewrites.
"""
