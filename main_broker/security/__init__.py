"""Who may do what: ACL rules and their matching, SCRAM credentials, the documents that hold both,
and the document stores they are read from and changed in (the fleet's metadata store, or a lone
main's own WAL).

May import main_broker's core modules only: no other sub-package, never main_broker.broker
(`SecurityState` sees its broker through the `SecurityHost` protocol).
"""
