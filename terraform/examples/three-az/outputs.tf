output "bootstrap" {
  description = "Zone => bootstrap.servers of that zone's clients."
  value       = module.zonefleet.bootstrap
}

output "bucket" {
  description = "The fleet's S3 bucket."
  value       = module.zonefleet.bucket
}

output "file_system_dns_name" {
  description = "The shared WAL's NFS endpoint."
  value       = module.zonefleet.file_system_dns_name
}

output "flow_log_location" {
  description = "Where the VPC flow logs land (the cost report's --flow-logs)."
  value       = module.zonefleet.flow_log_location
}

output "object_store_url" {
  description = "The fleet's object store (the cost report's --accounting)."
  value       = module.zonefleet.object_store_url
}
