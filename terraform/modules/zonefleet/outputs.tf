output "bootstrap" {
  description = "Zone => \"ip:port\": the bootstrap address of that zone's clients (its NLB, forwarding to its proxy)."
  value       = module.layout.bootstrap
}

output "bucket" {
  description = "The S3 bucket (objects, metadata and ledgers under s3_prefix/, flow logs under flow-logs/)."
  value       = aws_s3_bucket.fleet.id
}

output "object_store_url" {
  description = "The fleet TOML's [storage] object_store; also the cost report's --accounting source."
  value       = local.object_store_url
}

output "metadata_url" {
  description = "The fleet TOML's [metadata] url."
  value       = local.metadata_url
}

output "file_system_dns_name" {
  description = "DNS name of the shared WAL's NFS endpoint (the FSx SVM's, or the EFS file system's)."
  value       = local.wal_host
}

output "file_system_id" {
  description = "The FSx for ONTAP or EFS file system id."
  value       = local.fsx ? aws_fsx_ontap_file_system.wal[0].id : aws_efs_file_system.wal[0].id
}

output "wal_url" {
  description = "The fleet TOML's [wal] url."
  value       = local.wal_url
}

output "flow_log_location" {
  description = "Where the VPC flow logs land: give it (or a local copy) to the cost report's --flow-logs, with --zones and a node's fleet TOML."
  value       = local.flow_log_location
}

output "cur_location" {
  description = "Where the CUR 2.0 export lands (null unless cur_export), for the cost report's --cur."
  value       = var.cur_export ? "s3://${aws_s3_bucket.fleet.id}/cur/${var.cluster_id}-cur/data/" : null
}

output "secret_ssm_parameter" {
  description = "Name of the SSM SecureString parameter holding the internal RPC secret."
  value       = aws_ssm_parameter.internal_secret.name
}

output "mains" {
  description = "Node key => { node_id, zone, private_ip, instance_id } of each main broker."
  value = {
    for k, m in module.layout.mains : k => {
      node_id     = m.node_id
      zone        = m.zone
      private_ip  = m.host
      instance_id = aws_instance.main[k].id
    }
  }
}

output "proxies" {
  description = "Zone => { node_id, bootstrap, autoscaling_group, nlb_arn } of each zone's proxy."
  value = {
    for z, p in module.layout.proxies : z => {
      node_id           = p.node_id
      bootstrap         = module.layout.bootstrap[z]
      autoscaling_group = aws_autoscaling_group.proxy[z].name
      nlb_arn           = aws_lb.bootstrap[z].arn
    }
  }
}

output "fleet_toml" {
  description = "Node key => the fleet TOML that node boots with (no secret in it)."
  value       = module.layout.fleet_toml
}

output "node_role_arn" {
  description = "The nodes' IAM role."
  value       = aws_iam_role.node.arn
}

output "kms_key_arn" {
  description = "The fleet's KMS key (bucket, WAL file system, SSM secret)."
  value       = aws_kms_key.fleet.arn
}

output "security_group_ids" {
  description = "The fleet's security groups: nodes, proxies, nlb, wal."
  value = {
    nodes   = aws_security_group.nodes.id
    proxies = aws_security_group.proxies.id
    nlb     = aws_security_group.nlb.id
    wal     = aws_security_group.wal.id
  }
}
