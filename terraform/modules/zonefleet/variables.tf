# ------------------------------------------------------------------ the fleet

variable "cluster_id" {
  description = "The fleet's cluster id ([fleet] cluster_id); prefixes the names of its AWS resources."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,22}[a-z0-9]$", var.cluster_id))
    error_message = "cluster_id: 2-24 lowercase letters, digits and hyphens, starting with a letter (NLB and target group names are at most 32 characters)."
  }
}

variable "zonefleet_version" {
  description = "The zonefleet release the nodes install."
  type        = string
  default     = "0.1.0"
}

variable "zonefleet_package" {
  description = "pip requirement the nodes install; null: zonefleet==<zonefleet_version>."
  type        = string
  default     = null
}

variable "mains_per_zone" {
  description = "Main brokers in each zone (each an EC2 instance with a fixed address and node id)."
  type        = number
  default     = 1
}

variable "ports" {
  description = "TCP ports by role: proxy_kafka (9092), proxy_admin (9093), main_kafka (9192), main_admin (9193), main_rpc (9194)."
  type = object({
    proxy_kafka = optional(number, 9092)
    proxy_admin = optional(number, 9093)
    main_kafka  = optional(number, 9192)
    main_admin  = optional(number, 9193)
    main_rpc    = optional(number, 9194)
  })
  default = {}
}

variable "bootstrap_host_number" {
  description = "Each zone's bootstrap address (its NLB) is cidrhost(zone subnet, bootstrap_host_number)."
  type        = number
  default     = 10
}

variable "main_host_base" {
  description = "The i-th main of a zone gets the fixed address cidrhost(zone subnet, main_host_base + i)."
  type        = number
  default     = 20
}

# ------------------------------------------------------------------ network

variable "vpc_id" {
  description = "The VPC the fleet lives in (this module creates no VPC or subnet)."
  type        = string
}

variable "subnet_ids" {
  description = "AZ name => the private subnet holding that zone's nodes and bootstrap NLB. One entry per zone of the fleet."
  type        = map(string)

  validation {
    condition     = length(var.subnet_ids) >= 2
    error_message = "A zone fleet needs at least two zones (FSx for ONTAP Multi-AZ spans two)."
  }
}

variable "route_table_ids" {
  description = "Route tables of those subnets: the S3 gateway endpoint is added to them, and FSx for ONTAP Multi-AZ puts its floating endpoint routes in them."
  type        = list(string)
}

variable "client_cidrs" {
  description = "Networks whose Kafka clients may reach the proxies' Kafka port (through each zone's NLB)."
  type        = list(string)

  validation {
    condition     = length(var.client_cidrs) > 0 && alltrue([for c in var.client_cidrs : can(cidrhost(c, 0)) && c != "0.0.0.0/0"])
    error_message = "client_cidrs: one or more CIDR blocks, and not 0.0.0.0/0 (the NLBs are internal; name your client networks)."
  }
}

variable "client_zone_cidrs" {
  description = "Client networks per zone (AZ name => CIDRs) for the fleet TOML's [cidrs], beside each zone's own subnet; lets the proxies and mains place clients that sit in other subnets."
  type        = map(list(string))
  default     = {}
}

# ------------------------------------------------------------------ machines

variable "proxy_instance_type" {
  description = "EC2 instance type of the proxies (one per zone)."
  type        = string
  default     = "m7i.large"
}

variable "main_instance_type" {
  description = "EC2 instance type of the main brokers."
  type        = string
  default     = "m7i.large"
}

variable "ami_id" {
  description = "AMI of every node; null: the latest Amazon Linux 2023 (x86_64) from its public SSM parameter. Mains ignore later AMI changes (no replacement on a new AMI)."
  type        = string
  default     = null
}

variable "root_volume_gb" {
  description = "Size of each node's encrypted gp3 root volume (the OS, the virtualenv and the node's traffic ledgers)."
  type        = number
  default     = 30
}

variable "detailed_monitoring" {
  description = "EC2 detailed (1-minute) CloudWatch monitoring, billed per metric; the nodes' own /metrics carry more."
  type        = bool
  default     = false
}

variable "deletion_protection" {
  description = "Deletion protection of the per-zone NLBs (turn off before terraform destroy)."
  type        = bool
  default     = true
}

# ------------------------------------------------------------------ shared WAL

variable "shared_wal" {
  description = "The shared WAL file system: \"fsx-ontap\" (FSx for NetApp ONTAP, Multi-AZ) or \"efs\" (EFS, a mount target per zone)."
  type        = string
  default     = "fsx-ontap"

  validation {
    condition     = contains(["fsx-ontap", "efs"], var.shared_wal)
    error_message = "shared_wal must be \"fsx-ontap\" or \"efs\"."
  }
}

variable "fsx_storage_capacity_gb" {
  description = "FSx for ONTAP SSD capacity in GiB (1024 is the minimum)."
  type        = number
  default     = 1024
}

variable "fsx_throughput_mbps" {
  description = "FSx for ONTAP provisioned throughput in MBps (MULTI_AZ_1: 128, 256, 512, 1024, 2048 or 4096)."
  type        = number
  default     = 128
}

variable "fsx_preferred_zone" {
  description = "AZ name of the FSx file server that is active in normal operation (the standby is in the next zone); null: the first zone."
  type        = string
  default     = null
}

variable "fsx_endpoint_ip_address_range" {
  description = "FSx Multi-AZ floating endpoint range (a /28 outside the VPC's CIDRs); null: FSx picks one in 198.19.0.0/16."
  type        = string
  default     = null
}

variable "fsx_wal_volume_gb" {
  description = "Size of the WAL volume inside the FSx file system, in GiB."
  type        = number
  default     = 512
}

variable "efs_throughput_mode" {
  description = "EFS throughput mode (\"elastic\": billed per GB read and written, as the cost report prices it)."
  type        = string
  default     = "elastic"
}

# ------------------------------------------------------------------ object store, logs

variable "bucket_name" {
  description = "Name of the S3 bucket to create; null: <cluster_id>-<account id>-<region>."
  type        = string
  default     = null
}

variable "s3_prefix" {
  description = "Key prefix of the fleet's objects, metadata and ledgers in the bucket; the nodes' role reaches nothing outside it."
  type        = string
  default     = "zonefleet"

  validation {
    condition     = can(regex("^[A-Za-z0-9][A-Za-z0-9._-]*$", var.s3_prefix))
    error_message = "s3_prefix: one path segment of letters, digits, '.', '_' and '-'."
  }
}

variable "flow_log_max_aggregation_interval" {
  description = "VPC Flow Logs aggregation interval in seconds (60 or 600); the cost report sums by day, 600 writes a tenth of the records."
  type        = number
  default     = 600

  validation {
    condition     = contains([60, 600], var.flow_log_max_aggregation_interval)
    error_message = "flow_log_max_aggregation_interval must be 60 or 600."
  }
}

variable "flow_log_retention_days" {
  description = "Days the flow logs stay in the bucket."
  type        = number
  default     = 90
}

variable "cur_export" {
  description = "Create a CUR 2.0 data export (Parquet, hourly, resource ids) into the bucket's cur/ prefix, for the cost report's --cur. AWS Data Exports lives in us-east-1: use a provider in us-east-1 for it."
  type        = bool
  default     = false
}

variable "tags" {
  description = "Tags added to every resource."
  type        = map(string)
  default     = {}
}
