# One customer managed key for the fleet's data at rest: the bucket (objects, metadata,
# ledgers, flow logs, the CUR export), the WAL file system and the internal RPC secret. EBS
# root volumes use the account's EBS key instead: an Auto Scaling group launching from a
# customer key needs a grant to the Auto Scaling service-linked role, which may not exist yet.

resource "aws_kms_key" "fleet" {
  description             = "zonefleet ${var.cluster_id}: bucket, WAL file system, internal RPC secret"
  enable_key_rotation     = true
  deletion_window_in_days = 30

  policy = jsonencode({
    Version = "2012-10-17"
    Statement = concat([
      {
        # The account's IAM policies decide who else uses the key (the nodes' role does, for
        # S3 and SSM only).
        Sid       = "AccountAdministersTheKey"
        Effect    = "Allow"
        Principal = { AWS = "arn:${local.partition}:iam::${local.account_id}:root" }
        Action    = "kms:*"
        Resource  = "*"
      },
      {
        Sid       = "FlowLogsDeliveryEncrypts"
        Effect    = "Allow"
        Principal = { Service = "delivery.logs.amazonaws.com" }
        Action    = ["kms:Encrypt", "kms:Decrypt", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:DescribeKey"]
        Resource  = "*"
        Condition = { StringEquals = { "aws:SourceAccount" = local.account_id } }
      },
      ], var.cur_export ? [{
        Sid       = "DataExportsEncrypts"
        Effect    = "Allow"
        Principal = { Service = ["bcm-data-exports.amazonaws.com", "billingreports.amazonaws.com"] }
        Action    = ["kms:Encrypt", "kms:GenerateDataKey*", "kms:DescribeKey"]
        Resource  = "*"
        Condition = { StringEquals = { "aws:SourceAccount" = local.account_id } }
    }] : [])
  })

  tags = local.tags
}

resource "aws_kms_alias" "fleet" {
  name          = "alias/zonefleet-${var.cluster_id}"
  target_key_id = aws_kms_key.fleet.key_id
}
