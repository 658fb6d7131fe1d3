variable "zones" {
  description = "The fleet's availability zones: AZ name => { az_id, subnet_cidr } (the subnet holding that zone's nodes). Zone K (1..N) is the K-th AZ name in sorted order."
  type = map(object({
    az_id       = string
    subnet_cidr = string
  }))

  validation {
    condition     = length(var.zones) >= 1 && length(var.zones) <= 9
    error_message = "The fleet needs one to nine zones (main node ids are K + 10*i)."
  }
  validation {
    condition     = alltrue([for z in values(var.zones) : can(cidrhost(z.subnet_cidr, 0))])
    error_message = "Every zone's subnet_cidr must be a CIDR block."
  }
}

variable "mains_per_zone" {
  description = "Main brokers in each zone."
  type        = number
  default     = 1

  validation {
    condition     = var.mains_per_zone >= 1 && var.mains_per_zone <= 9 && floor(var.mains_per_zone) == var.mains_per_zone
    error_message = "mains_per_zone must be a whole number from 1 to 9 (main node ids are K + 10*i, below the proxies' 100+K)."
  }
}

variable "ports" {
  description = "TCP ports by role. Distinct per role, so one zone's proxy and mains can share a host (a one-machine simulation)."
  type = object({
    proxy_kafka = optional(number, 9092)
    proxy_admin = optional(number, 9093)
    main_kafka  = optional(number, 9192)
    main_admin  = optional(number, 9193)
    main_rpc    = optional(number, 9194)
  })
  default = {}

  validation {
    condition = length(distinct([
      var.ports.proxy_kafka, var.ports.proxy_admin, var.ports.main_kafka, var.ports.main_admin,
      var.ports.main_rpc,
    ])) == 5
    error_message = "The five role ports must all differ."
  }
}

variable "bootstrap_host_number" {
  description = "Host number, inside each zone's subnet, of that zone's bootstrap address (cidrhost(subnet_cidr, N)): the per-zone NLB in AWS."
  type        = number
  default     = 10

  # AWS keeps the first four addresses of every subnet (network, router, DNS, future use).
  validation {
    condition     = var.bootstrap_host_number >= 4
    error_message = "bootstrap_host_number must be at least 4: AWS reserves .0 to .3 of a subnet."
  }
}

variable "main_host_base" {
  description = "The i-th main broker of a zone (i = 0..mains_per_zone-1) gets the fixed address cidrhost(subnet_cidr, main_host_base + i)."
  type        = number
  default     = 20

  validation {
    condition     = var.main_host_base >= 4
    error_message = "main_host_base must be at least 4: AWS reserves .0 to .3 of a subnet."
  }
}

variable "cluster_id" {
  description = "The fleet's cluster id ([fleet] cluster_id); also names its resources."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,22}[a-z0-9]$", var.cluster_id))
    error_message = "cluster_id: 2-24 lowercase letters, digits and hyphens, starting with a letter (it prefixes AWS names with short limits)."
  }
}

variable "region" {
  description = "AWS region of the fleet (the user data reads the SSM parameter there)."
  type        = string
}

variable "object_store_url" {
  description = "[storage] object_store: where committed data goes (s3://bucket/prefix?region=...)."
  type        = string
}

variable "metadata_url" {
  description = "[metadata] url: the cluster metadata store shared by every node (s3://bucket/prefix?region=...)."
  type        = string
}

variable "wal_url" {
  description = "[wal] url: the shared WAL file system (nfs://host/export/dir?version=4.1, or osfs:///path for a kernel mount)."
  type        = string
}

variable "secret_ssm_parameter" {
  description = "Name of the SSM SecureString parameter holding the internal RPC secret; the user data writes it to <config_dir>/internal.secret."
  type        = string
}

variable "client_zone_cidrs" {
  description = "More client networks per zone for [cidrs] (zone name => CIDR list), beside each zone's own subnet."
  type        = map(list(string))
  default     = {}
}

variable "ledger_upload_interval_s" {
  description = "[accounting] upload_interval_s: how often each node uploads its traffic ledger to the object store (at most 3600)."
  type        = number
  default     = 600

  validation {
    condition     = var.ledger_upload_interval_s > 0 && var.ledger_upload_interval_s <= 3600
    error_message = "ledger_upload_interval_s must be in (0, 3600]."
  }
}

variable "zonefleet_version" {
  description = "The zonefleet release the nodes run."
  type        = string
  default     = "0.1.0"
}

variable "zonefleet_package" {
  description = "pip requirement the nodes install; null: zonefleet==<zonefleet_version>. A wheel URL or path works too."
  type        = string
  default     = null
}

variable "config_dir" {
  description = "Where a node keeps fleet.toml and internal.secret."
  type        = string
  default     = "/etc/zonefleet"
}

variable "data_dir" {
  description = "[fleet] data_dir: a node's local state (traffic ledgers)."
  type        = string
  default     = "/var/lib/zonefleet"
}

variable "install_dir" {
  description = "Where the user data installs zonefleet (a virtualenv)."
  type        = string
  default     = "/opt/zonefleet"
}

variable "systemd_dir" {
  description = "Where the user data writes the node's systemd unit."
  type        = string
  default     = "/etc/systemd/system"
}
