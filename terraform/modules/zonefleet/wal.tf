# The shared WAL: a regional NFS file system every node reaches from its own AZ. The nodes open
# it with zonefleet's userspace NFSv4.1 client (nfs:// URLs), so no kernel mount is needed.

locals {
  fsx          = var.shared_wal == "fsx-ontap"
  fsx_zones    = local.fsx ? [local.fsx_preferred, [for z in local.zone_names : z if z != local.fsx_preferred][0]] : []
  fsx_junction = "/zonefleet"

  fsx_preferred = coalesce(var.fsx_preferred_zone, local.zone_names[0])

  # FSx: the SVM's NFS name (its floating endpoint, served in every zone through the route
  # tables); the volume's junction path is the export. EFS: the file system's name resolves to
  # the mount target in the caller's own AZ; its export is the root "/".
  wal_host = local.fsx ? aws_fsx_ontap_storage_virtual_machine.wal[0].endpoints[0].nfs[0].dns_name : aws_efs_file_system.wal[0].dns_name
  wal_url  = local.fsx ? "nfs://${local.wal_host}${local.fsx_junction}?version=4.1" : "nfs://${local.wal_host}/?export=/&version=4.1"
}

# ------------------------------------------------------------ FSx for NetApp ONTAP (default)

resource "aws_fsx_ontap_file_system" "wal" {
  count = local.fsx ? 1 : 0

  deployment_type     = "MULTI_AZ_1"
  storage_capacity    = var.fsx_storage_capacity_gb
  throughput_capacity = var.fsx_throughput_mbps
  subnet_ids          = [for z in local.fsx_zones : var.subnet_ids[z]]
  preferred_subnet_id = var.subnet_ids[local.fsx_preferred]
  # The floating NFS endpoint is routed in these tables, so nodes of every zone reach the
  # active file server, whichever AZ it is in after a failover.
  route_table_ids           = var.route_table_ids
  endpoint_ip_address_range = var.fsx_endpoint_ip_address_range
  security_group_ids        = [aws_security_group.wal.id]
  kms_key_id                = aws_kms_key.fleet.arn
  # The WAL holds only what S3 does not hold yet; S3 is the durable copy, so no backups.
  automatic_backup_retention_days = 0

  tags = merge(local.tags, { Name = "${var.cluster_id}-wal" })

  lifecycle {
    precondition {
      condition     = contains(local.zone_names, local.fsx_preferred)
      error_message = "fsx_preferred_zone must be one of the subnet_ids zones."
    }
  }
}

resource "aws_fsx_ontap_storage_virtual_machine" "wal" {
  count                      = local.fsx ? 1 : 0
  file_system_id             = aws_fsx_ontap_file_system.wal[0].id
  name                       = "zonefleet"
  root_volume_security_style = "UNIX"
  tags                       = local.tags
}

resource "aws_fsx_ontap_volume" "wal" {
  count                      = local.fsx ? 1 : 0
  name                       = "zonefleet_wal"
  storage_virtual_machine_id = aws_fsx_ontap_storage_virtual_machine.wal[0].id
  junction_path              = local.fsx_junction
  security_style             = "UNIX"
  size_in_megabytes          = var.fsx_wal_volume_gb * 1024
  # WAL segments are written once, read soon, and deleted: no deduplication pass, and no
  # tiering to the capacity pool (billed per GB and slower).
  storage_efficiency_enabled = false
  skip_final_backup          = true
  tiering_policy {
    name = "NONE"
  }
  tags = local.tags
}

# ------------------------------------------------------------ EFS (shared_wal = "efs")

resource "aws_efs_file_system" "wal" {
  count = local.fsx ? 0 : 1

  encrypted        = true
  kms_key_id       = aws_kms_key.fleet.arn
  performance_mode = "generalPurpose"
  throughput_mode  = var.efs_throughput_mode
  tags             = merge(local.tags, { Name = "${var.cluster_id}-wal" })
}

resource "aws_efs_mount_target" "wal" {
  for_each        = local.fsx ? {} : var.subnet_ids
  file_system_id  = aws_efs_file_system.wal[0].id
  subnet_id       = each.value
  security_groups = [aws_security_group.wal.id]
}
