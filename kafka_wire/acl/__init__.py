"""Kafka ACLs, the I/O-free core that main brokers and zone proxies share.

Main brokers store the bindings (CreateAcls / DeleteAcls); both main brokers and proxies must
enforce them on the requests they serve, and proxies may not import `main_broker`, so the rules
live here:

- `rules`: the binding and filter types with Kafka's wire codes, CreateAcls validation,
  DescribeAcls / DeleteAcls filter matching, and the decision (`decide`, `authorize`) as
  Kafka's StandardAuthorizer makes it;
- `authorizer`: `Authorizer`, that decision over bindings indexed by resource name and prefix,
  with super users, allow.everyone.if.no.acl.found and a bounded decision cache;
- `api_operations`: which checks each Kafka API needs and the error a denial returns.
"""

from kafka_wire.acl.api_operations import (
    API_ACLS,
    ApiAcl,
    Check,
    NameFrom,
    OnDeny,
    Rule,
    When,
    checks_for,
    denial_error,
)
from kafka_wire.acl.authorizer import Authorizer
from kafka_wire.acl.rules import (
    AUTHORIZED_OPERATIONS_OMITTED,
    CLUSTER_NAME,
    WILDCARD,
    WILDCARD_PRINCIPAL,
    AclBinding,
    AclFilter,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    authorize,
    authorized_operations,
)

__all__ = [
    "API_ACLS",
    "AUTHORIZED_OPERATIONS_OMITTED",
    "CLUSTER_NAME",
    "WILDCARD",
    "WILDCARD_PRINCIPAL",
    "AclBinding",
    "AclFilter",
    "ApiAcl",
    "Authorizer",
    "Check",
    "NameFrom",
    "OnDeny",
    "Operation",
    "PatternType",
    "Permission",
    "ResourceType",
    "Rule",
    "When",
    "authorize",
    "authorized_operations",
    "checks_for",
    "denial_error",
]
