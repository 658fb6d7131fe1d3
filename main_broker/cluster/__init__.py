"""A main's part in a fleet of mains: the cluster metadata document and its sync, the controller
lease and membership, partition reassignment and the handoff of partitions between mains, the
role that ties them together, and the main's view of the fleet's zones.

May import main_broker's core modules and `main_broker.objects` (a handoff takes over a
partition's objects); never main_broker.broker (`ClusterRole` and `Handoff` see it through the
`RoleHost` and `HandoffHost` protocols).
"""
