"""Telemetry: the metric registry with Prometheus exposition and cross-zone traffic
accounting. Records only; imports no other zonefleet package.
"""
