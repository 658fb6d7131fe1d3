"""Cost reports: PySpark jobs that turn traffic-accounting logs into cross-AZ traffic
and cost reports. Reads files only. (Arrives with the cost-report issue.)
"""
