"""The Kafka request handlers, one module per API family (each a function of the broker, the
request context and the decoded request), the group requests' glue, config change validation,
and the zone proxies' confirm.

The top layer, under main_broker.broker only: may import the core modules and every other
sub-package, never main_broker.broker (broker.py imports the handlers), not even under
TYPE_CHECKING: the handlers see the broker as `services.BrokerServices`, a Protocol that
`MainBroker` satisfies (mypy checks it where broker.py hands the handlers `self`).
"""
