"""The object tier: what a main uploads from its WAL into committed objects (upload), the tier
that uploads and serves reads from them (tier), the compaction of small objects, and retention
(the policy, and the task that applies it to objects and streams).

May import main_broker's core modules only: no other sub-package, never main_broker.broker
(the tier and retention see their broker through the `TierHost` and `RetentionHost` protocols).
"""
