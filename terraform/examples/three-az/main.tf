# A zonefleet in a new VPC: one private subnet per AZ (each with its own route table), an S3
# gateway endpoint (created by the module), and, for boot-time installs, one NAT gateway.
#
# Why one NAT gateway and not three: the nodes use the internet only at boot (pip install of
# the pinned zonefleet) and for SSM calls; their data goes to S3 through the gateway endpoint
# and to the WAL over NFS inside the VPC. A NAT gateway per AZ would triple a fixed cost
# ($0.045/h each) to save the inter-AZ transfer of a few hundred MB of packages per boot. Set
# nat_gateway = false for a fleet with no internet path at all (then give the module an AMI
# with zonefleet installed, and add an SSM interface endpoint).

locals {
  private_subnets = { for i, az in var.azs : az => cidrsubnet(var.vpc_cidr, 4, i) }
  public_subnet   = cidrsubnet(var.vpc_cidr, 8, 255) # 10.42.255.0/24: the NAT gateway only
}

resource "aws_vpc" "fleet" {
  cidr_block           = var.vpc_cidr
  enable_dns_support   = true
  enable_dns_hostnames = true # FSx and EFS endpoints are DNS names
  tags                 = { Name = var.cluster_id }
}

# The VPC's default security group admits nothing: every fleet resource has its own.
resource "aws_default_security_group" "fleet" {
  vpc_id = aws_vpc.fleet.id
}

resource "aws_subnet" "private" {
  for_each          = local.private_subnets
  vpc_id            = aws_vpc.fleet.id
  availability_zone = each.key
  cidr_block        = each.value
  tags              = { Name = "${var.cluster_id}-${each.key}" }
}

resource "aws_route_table" "private" {
  for_each = local.private_subnets
  vpc_id   = aws_vpc.fleet.id
  tags     = { Name = "${var.cluster_id}-${each.key}" }
}

resource "aws_route_table_association" "private" {
  for_each       = local.private_subnets
  subnet_id      = aws_subnet.private[each.key].id
  route_table_id = aws_route_table.private[each.key].id
}

# ---------------------------------------------------------------- boot-time internet access

resource "aws_internet_gateway" "fleet" {
  count  = var.nat_gateway ? 1 : 0
  vpc_id = aws_vpc.fleet.id
  tags   = { Name = var.cluster_id }
}

resource "aws_subnet" "public" {
  count                   = var.nat_gateway ? 1 : 0
  vpc_id                  = aws_vpc.fleet.id
  availability_zone       = var.azs[0]
  cidr_block              = local.public_subnet
  map_public_ip_on_launch = false
  tags                    = { Name = "${var.cluster_id}-nat" }
}

resource "aws_route_table" "public" {
  count  = var.nat_gateway ? 1 : 0
  vpc_id = aws_vpc.fleet.id
  tags   = { Name = "${var.cluster_id}-nat" }
}

resource "aws_route" "public_internet" {
  count                  = var.nat_gateway ? 1 : 0
  route_table_id         = aws_route_table.public[0].id
  destination_cidr_block = "0.0.0.0/0"
  gateway_id             = aws_internet_gateway.fleet[0].id
}

resource "aws_route_table_association" "public" {
  count          = var.nat_gateway ? 1 : 0
  subnet_id      = aws_subnet.public[0].id
  route_table_id = aws_route_table.public[0].id
}

resource "aws_eip" "nat" {
  count  = var.nat_gateway ? 1 : 0
  domain = "vpc"
  tags   = { Name = "${var.cluster_id}-nat" }
}

resource "aws_nat_gateway" "fleet" {
  count         = var.nat_gateway ? 1 : 0
  allocation_id = aws_eip.nat[0].id
  subnet_id     = aws_subnet.public[0].id
  tags          = { Name = var.cluster_id }

  depends_on = [aws_internet_gateway.fleet]
}

resource "aws_route" "private_nat" {
  for_each               = var.nat_gateway ? local.private_subnets : {}
  route_table_id         = aws_route_table.private[each.key].id
  destination_cidr_block = "0.0.0.0/0"
  nat_gateway_id         = aws_nat_gateway.fleet[0].id
}

# ---------------------------------------------------------------- the fleet

module "zonefleet" {
  source = "../../modules/zonefleet"

  cluster_id        = var.cluster_id
  zonefleet_version = var.zonefleet_version
  vpc_id            = aws_vpc.fleet.id
  subnet_ids        = { for az, s in aws_subnet.private : az => s.id }
  route_table_ids   = [for az in var.azs : aws_route_table.private[az].id]
  client_cidrs      = coalesce(var.client_cidrs, [var.vpc_cidr])

  shared_wal          = var.shared_wal
  deletion_protection = var.deletion_protection

  # Nodes boot only once their subnet routes to the NAT gateway (pip install at boot).
  depends_on = [aws_route.private_nat, aws_route_table_association.private]
}
