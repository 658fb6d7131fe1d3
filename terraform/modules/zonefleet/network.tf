# The module creates no VPC, subnet or route: it takes the caller's, one subnet per AZ.

data "aws_subnet" "fleet" {
  for_each = var.subnet_ids
  id       = each.value

  lifecycle {
    postcondition {
      condition     = self.availability_zone == each.key
      error_message = "subnet_ids: the subnet given for ${each.key} is in ${self.availability_zone}."
    }
    postcondition {
      condition     = self.vpc_id == var.vpc_id
      error_message = "subnet_ids: the subnet given for ${each.key} is not in vpc_id."
    }
  }
}

# S3 through a gateway endpoint: free, and no byte of an upload or a read goes through a NAT
# gateway (billed per GB) or leaves the AZ.
resource "aws_vpc_endpoint" "s3" {
  vpc_id            = var.vpc_id
  service_name      = "com.amazonaws.${local.region}.s3"
  vpc_endpoint_type = "Gateway"
  route_table_ids   = var.route_table_ids
  tags              = merge(local.tags, { Name = "${var.cluster_id}-s3" })
}
