# The nodes' role: the bucket's fleet prefix, the one SSM parameter with the internal RPC
# secret, and the fleet key only as S3 and SSM use it on their behalf. Nothing else.

resource "aws_iam_role" "node" {
  name_prefix = "${var.cluster_id}-node-"
  description = "zonefleet ${var.cluster_id} nodes (proxies and mains)"
  assume_role_policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Effect    = "Allow"
      Principal = { Service = "ec2.${local.dns_suffix}" }
      Action    = "sts:AssumeRole"
    }]
  })
  tags = local.tags
}

resource "aws_iam_role_policy" "node" {
  name = "zonefleet-node"
  role = aws_iam_role.node.id
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [
      {
        Sid      = "ListTheFleetPrefix"
        Effect   = "Allow"
        Action   = "s3:ListBucket"
        Resource = aws_s3_bucket.fleet.arn
        Condition = {
          StringLike = { "s3:prefix" = ["${local.prefix}/*"] }
        }
      },
      {
        Sid    = "ObjectsUnderTheFleetPrefix"
        Effect = "Allow"
        Action = [
          "s3:GetObject",
          "s3:PutObject",
          "s3:DeleteObject",
          "s3:AbortMultipartUpload",
          "s3:ListMultipartUploadParts",
        ]
        Resource = "${aws_s3_bucket.fleet.arn}/${local.prefix}/*"
      },
      {
        Sid      = "TheInternalSecret"
        Effect   = "Allow"
        Action   = "ssm:GetParameter"
        Resource = aws_ssm_parameter.internal_secret.arn
      },
      {
        Sid      = "TheFleetKeyThroughS3AndSsm"
        Effect   = "Allow"
        Action   = ["kms:Decrypt", "kms:GenerateDataKey"]
        Resource = aws_kms_key.fleet.arn
        Condition = {
          StringEquals = {
            "kms:ViaService" = ["s3.${local.region}.${local.dns_suffix}", "ssm.${local.region}.${local.dns_suffix}"]
          }
        }
      },
    ]
  })
}

resource "aws_iam_instance_profile" "node" {
  name_prefix = "${var.cluster_id}-node-"
  role        = aws_iam_role.node.name
  tags        = local.tags
}
