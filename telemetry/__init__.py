"""Telemetry: the metric registry with Prometheus exposition and cross-zone traffic
accounting. Records only; imports no other zonefleet package.
"""

from telemetry.metrics import (
    DEFAULT_LATENCY_BUCKETS,
    DEFAULT_SIZE_BUCKETS,
    BrokerMetrics,
    Counter,
    CounterChild,
    Gauge,
    GaugeChild,
    Histogram,
    HistogramChild,
    MetricsRegistry,
)
from telemetry.traffic import (
    JsonlTrafficSink,
    TrafficAccounting,
    TrafficKey,
    TrafficSink,
    minute_iso,
)

__all__ = [
    "DEFAULT_LATENCY_BUCKETS",
    "DEFAULT_SIZE_BUCKETS",
    "BrokerMetrics",
    "Counter",
    "CounterChild",
    "Gauge",
    "GaugeChild",
    "Histogram",
    "HistogramChild",
    "JsonlTrafficSink",
    "MetricsRegistry",
    "TrafficAccounting",
    "TrafficKey",
    "TrafficSink",
    "minute_iso",
]
