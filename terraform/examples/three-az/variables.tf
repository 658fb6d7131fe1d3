variable "region" {
  description = "AWS region."
  type        = string
  default     = "us-east-1"
}

variable "azs" {
  description = "The three AZs of the fleet, one private subnet each."
  type        = list(string)
  default     = ["us-east-1a", "us-east-1b", "us-east-1c"]
}

variable "vpc_cidr" {
  description = "CIDR of the new VPC; each AZ gets a /20 of it (10.42.0.0/20, 10.42.16.0/20, 10.42.32.0/20 by default)."
  type        = string
  default     = "10.42.0.0/16"
}

variable "cluster_id" {
  description = "The fleet's cluster id."
  type        = string
  default     = "zonefleet"
}

variable "client_cidrs" {
  description = "Networks of the Kafka clients; null: the whole VPC."
  type        = list(string)
  default     = null
}

variable "nat_gateway" {
  description = "One NAT gateway (in the first AZ) so the nodes can pip-install zonefleet and reach SSM at boot. Off: bring a pre-built AMI (ami_id) and an SSM interface endpoint yourself."
  type        = bool
  default     = true
}

variable "zonefleet_version" {
  description = "The zonefleet release the nodes install."
  type        = string
  default     = "0.1.0"
}

variable "shared_wal" {
  description = "\"fsx-ontap\" (default) or \"efs\"."
  type        = string
  default     = "fsx-ontap"
}

variable "deletion_protection" {
  description = "Deletion protection of the NLBs; set false before terraform destroy."
  type        = bool
  default     = true
}
