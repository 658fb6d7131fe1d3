# The zonefleet module: one proxy per AZ behind that AZ's own NLB, the main brokers at fixed
# addresses, a shared WAL file system and an S3 bucket. Which nodes exist, and what each boots
# with, comes from the provider-free layout module (modules/layout), which a one-machine
# simulation renders the same way.

data "aws_caller_identity" "current" {}
data "aws_region" "current" {}
data "aws_partition" "current" {}

locals {
  account_id = data.aws_caller_identity.current.account_id
  region     = data.aws_region.current.name
  partition  = data.aws_partition.current.partition
  dns_suffix = data.aws_partition.current.dns_suffix

  zone_names = sort(keys(var.subnet_ids))
  bucket     = coalesce(var.bucket_name, "${var.cluster_id}-${local.account_id}-${local.region}")
  prefix     = var.s3_prefix

  object_store_url = "s3://${local.bucket}/${local.prefix}/objects?region=${local.region}"
  metadata_url     = "s3://${local.bucket}/${local.prefix}/metadata?region=${local.region}"

  secret_parameter = "/zonefleet/${var.cluster_id}/internal-secret"

  tags = merge(var.tags, { "zonefleet:cluster" = var.cluster_id })
}

module "layout" {
  source = "./modules/layout"

  zones = {
    for z in local.zone_names : z => {
      az_id       = data.aws_subnet.fleet[z].availability_zone_id
      subnet_cidr = data.aws_subnet.fleet[z].cidr_block
    }
  }
  mains_per_zone        = var.mains_per_zone
  ports                 = var.ports
  bootstrap_host_number = var.bootstrap_host_number
  main_host_base        = var.main_host_base
  client_zone_cidrs     = var.client_zone_cidrs

  cluster_id           = var.cluster_id
  region               = local.region
  object_store_url     = local.object_store_url
  metadata_url         = local.metadata_url
  wal_url              = local.wal_url
  secret_ssm_parameter = aws_ssm_parameter.internal_secret.name
  zonefleet_version    = var.zonefleet_version
  zonefleet_package    = var.zonefleet_package
}
