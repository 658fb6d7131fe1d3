# VPC Flow Logs for the cost report's --flow-logs (cost_report/flow_logs.py): text files with a
# header line, version 5 custom format. The report reads srcaddr dstaddr bytes start end az-id
# flow-direction (and log-status); the rest is AWS's default format, and pkt-srcaddr
# pkt-dstaddr name the packets' own ends where an NLB or NAT stands between. The whole VPC is
# logged, as the report's count-each-flow-once rule assumes.

locals {
  flow_log_fields = [
    "version", "account-id", "interface-id", "srcaddr", "dstaddr", "srcport", "dstport",
    "protocol", "packets", "bytes", "start", "end", "action", "log-status",
    "az-id", "flow-direction", "pkt-srcaddr", "pkt-dstaddr",
  ]
  flow_log_format = join(" ", [for f in local.flow_log_fields : "$${${f}}"])

  # AWS writes AWSLogs/<account>/vpcflowlogs/<region>/YYYY/MM/DD/*.log.gz under the prefix.
  flow_log_location = "s3://${aws_s3_bucket.fleet.id}/flow-logs/AWSLogs/${local.account_id}/vpcflowlogs/${local.region}/"
}

resource "aws_flow_log" "vpc" {
  vpc_id                   = var.vpc_id
  traffic_type             = "ALL"
  log_destination_type     = "s3"
  log_destination          = "${aws_s3_bucket.fleet.arn}/flow-logs/"
  log_format               = local.flow_log_format
  max_aggregation_interval = var.flow_log_max_aggregation_interval

  destination_options {
    file_format                = "plain-text"
    hive_compatible_partitions = false
    per_hour_partition         = false
  }

  tags = merge(local.tags, { Name = "${var.cluster_id}-flow-logs" })

  depends_on = [aws_s3_bucket_policy.fleet]
}

# Optional: a CUR 2.0 export (Parquet) for the cost report's --cur, with resource ids so the
# report can keep the fleet's own line items. AWS Data Exports is a us-east-1 service.
resource "aws_bcmdataexports_export" "cur" {
  count = var.cur_export ? 1 : 0

  export {
    name        = "${var.cluster_id}-cur"
    description = "zonefleet ${var.cluster_id}: CUR 2.0 for the cost report"

    data_query {
      query_statement = join(" ", [
        "SELECT identity_line_item_id, identity_time_interval,",
        "line_item_usage_type, line_item_operation, line_item_availability_zone,",
        "line_item_resource_id, line_item_usage_amount, line_item_unblended_cost,",
        "line_item_usage_start_date, product_from_region_code, resource_tags",
        "FROM COST_AND_USAGE_REPORT",
      ])
      table_configurations = {
        COST_AND_USAGE_REPORT = {
          TIME_GRANULARITY                      = "HOURLY"
          INCLUDE_RESOURCES                     = "TRUE"
          INCLUDE_MANUAL_DISCOUNT_COMPATIBILITY = "FALSE"
          INCLUDE_SPLIT_COST_ALLOCATION_DATA    = "FALSE"
        }
      }
    }

    destination_configurations {
      s3_destination {
        s3_bucket = aws_s3_bucket.fleet.id
        s3_prefix = "cur"
        s3_region = local.region
        s3_output_configurations {
          overwrite   = "OVERWRITE_REPORT"
          format      = "PARQUET"
          compression = "PARQUET"
          output_type = "CUSTOM"
        }
      }
    }

    refresh_cadence {
      frequency = "SYNCHRONOUS"
    }
  }

  tags = local.tags

  depends_on = [aws_s3_bucket_policy.fleet]
}
