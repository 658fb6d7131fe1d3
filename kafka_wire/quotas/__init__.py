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

Not wired to any listener yet: nothing records, throttles or mutes, and the quotas are not
stored in the cluster metadata.
"""
