"""The Kafka request handlers, one module per API family (each a function of the broker, the
request context and the decoded request), the group requests' glue, config change validation,
and the zone proxies' confirm.

The top layer, next to main_broker.broker: may import the core modules and every other
sub-package, and main_broker.broker under TYPE_CHECKING only (broker.py imports the handlers).
"""
