"""Consumer groups: classic groups and their coordinator, KIP-848 consumer groups (assignor,
group, coordinator), committed offsets, the group admin operations, the groups' records on the
WAL and their persistence, and the wiring of both coordinators onto a `LogStore`.

May import main_broker's core modules and `main_broker.security` (ACL checks); never
main_broker.broker.
"""
