# The object store: one bucket for the fleet's objects, cluster metadata and traffic ledgers
# (under <s3_prefix>/), its VPC flow logs (flow-logs/) and, optionally, the CUR export (cur/).

resource "aws_s3_bucket" "fleet" {
  #checkov:skip=CKV_AWS_18: no server access logs: the nodes' traffic ledgers book every request they make (channels s3-put/s3-get), and access logs of a bucket written every few seconds would cost more than they tell
  #checkov:skip=CKV_AWS_21: no versioning: objects are immutable and retention and compaction delete them on purpose; versions would keep every deleted object billed (the metadata document changes only by compare-and-swap)
  #checkov:skip=CKV_AWS_144: no cross-region replication: the data is a log with a retention; a second region doubles storage and transfer for a fleet that lives in one region
  #checkov:skip=CKV2_AWS_62: no event notifications: nothing consumes them
  bucket = local.bucket
  tags   = local.tags
}

resource "aws_s3_bucket_public_access_block" "fleet" {
  bucket                  = aws_s3_bucket.fleet.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

# ACLs off: the bucket owner owns every object, flow-log deliveries included.
resource "aws_s3_bucket_ownership_controls" "fleet" {
  bucket = aws_s3_bucket.fleet.id
  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "fleet" {
  bucket = aws_s3_bucket.fleet.id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = "aws:kms"
      kms_master_key_id = aws_kms_key.fleet.arn
    }
    # A bucket key: KMS is called about once per bucket key lifetime, not once per object.
    bucket_key_enabled = true
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "fleet" {
  bucket = aws_s3_bucket.fleet.id

  # A node killed during a multipart upload leaves parts that are billed until aborted.
  rule {
    id     = "abort-incomplete-multipart-uploads"
    status = "Enabled"
    filter {}
    abort_incomplete_multipart_upload {
      days_after_initiation = 1
    }
  }

  rule {
    id     = "expire-flow-logs"
    status = "Enabled"
    filter {
      prefix = "flow-logs/"
    }
    expiration {
      days = var.flow_log_retention_days
    }
  }
}

# TLS only, for everyone; the flow-log delivery service may write under flow-logs/, and the
# CUR export (if on) under cur/. The nodes' access comes from their role (iam.tf).
data "aws_iam_policy_document" "bucket" {
  statement {
    sid       = "DenyInsecureTransport"
    effect    = "Deny"
    actions   = ["s3:*"]
    resources = [aws_s3_bucket.fleet.arn, "${aws_s3_bucket.fleet.arn}/*"]
    principals {
      type        = "*"
      identifiers = ["*"]
    }
    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }

  statement {
    sid       = "FlowLogsDeliveryWrite"
    effect    = "Allow"
    actions   = ["s3:PutObject"]
    resources = ["${aws_s3_bucket.fleet.arn}/flow-logs/AWSLogs/${local.account_id}/*"]
    principals {
      type        = "Service"
      identifiers = ["delivery.logs.amazonaws.com"]
    }
    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [local.account_id]
    }
    condition {
      test     = "ArnLike"
      variable = "aws:SourceArn"
      values   = ["arn:${local.partition}:logs:${local.region}:${local.account_id}:*"]
    }
  }

  statement {
    sid       = "FlowLogsDeliveryCheck"
    effect    = "Allow"
    actions   = ["s3:GetBucketAcl", "s3:ListBucket"]
    resources = [aws_s3_bucket.fleet.arn]
    principals {
      type        = "Service"
      identifiers = ["delivery.logs.amazonaws.com"]
    }
    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [local.account_id]
    }
    condition {
      test     = "ArnLike"
      variable = "aws:SourceArn"
      values   = ["arn:${local.partition}:logs:${local.region}:${local.account_id}:*"]
    }
  }

  dynamic "statement" {
    for_each = var.cur_export ? ["cur"] : []
    content {
      sid       = "DataExportsWrite"
      effect    = "Allow"
      actions   = ["s3:PutObject", "s3:GetBucketPolicy"]
      resources = [aws_s3_bucket.fleet.arn, "${aws_s3_bucket.fleet.arn}/cur/*"]
      principals {
        type        = "Service"
        identifiers = ["bcm-data-exports.amazonaws.com", "billingreports.amazonaws.com"]
      }
      condition {
        test     = "StringLike"
        variable = "aws:SourceAccount"
        values   = [local.account_id]
      }
      condition {
        test     = "StringLike"
        variable = "aws:SourceArn"
        values = [
          "arn:${local.partition}:cur:us-east-1:${local.account_id}:definition/*",
          "arn:${local.partition}:bcm-data-exports:us-east-1:${local.account_id}:export/*",
        ]
      }
    }
  }
}

resource "aws_s3_bucket_policy" "fleet" {
  bucket = aws_s3_bucket.fleet.id
  policy = data.aws_iam_policy_document.bucket.json

  depends_on = [aws_s3_bucket_public_access_block.fleet]
}
