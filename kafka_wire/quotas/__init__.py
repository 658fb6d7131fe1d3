"""Client quotas (issue 15), the I/O-free core that main brokers and zone proxies share.

Quotas (core): produce and fetch byte rates and request-time percentages per user, per
client id, or both, as in Kafka (KIP-13, KIP-124, KIP-55):

- `entities`: the quota entities, `<default>` entries included, and which configured quota
  applies to a client, in Kafka's eight levels of precedence;
- `rate`: Kafka's sampled rate (`quota.window.num` samples of `quota.window.size.seconds`,
  11 of 1 s by default) and its throttle time, (rate - quota) / quota * span;
- `manager`: `ClientQuotaManager`, one rate per quota type and sensor, with
  `record_and_throttle_ms` and an hourly expiry of idle rates, on a clock the caller passes;
- `admin`: the checks of AlterClientQuotas and the filters of DescribeClientQuotas, with
  Kafka's error codes and messages.

Zone proxies enforce them (`proxy_broker.quotas`), from the `cluster/quotas.json` document
that mains keep (`main_broker.api.quotas`); the connection is muted through
`kafka_wire.server_loop.ConnectionMute`.
"""
