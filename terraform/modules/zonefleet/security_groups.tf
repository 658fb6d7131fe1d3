# Who reaches which port. Clients reach only the proxies' Kafka port, through their zone's NLB;
# every other port (mains' Kafka, internal RPC, admin, NFS) is open only between the fleet's
# own security groups.

locals {
  ports = module.layout.ports

  # Ports every fleet node may reach on every other: the mains' Kafka, admin and internal RPC
  # ports, and the proxies' Kafka and admin ports.
  fleet_ports = {
    main_kafka  = local.ports.main_kafka
    main_admin  = local.ports.main_admin
    main_rpc    = local.ports.main_rpc
    proxy_kafka = local.ports.proxy_kafka
    proxy_admin = local.ports.proxy_admin
  }
  nfs_port = 2049 # NFSv4.1 needs nothing else (no portmapper, no mountd)
}

resource "aws_security_group" "nodes" {
  name_prefix = "${var.cluster_id}-nodes-"
  description = "zonefleet ${var.cluster_id}: every fleet node (proxies and mains)"
  vpc_id      = var.vpc_id
  tags        = merge(local.tags, { Name = "${var.cluster_id}-nodes" })

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_security_group" "proxies" {
  name_prefix = "${var.cluster_id}-proxies-"
  description = "zonefleet ${var.cluster_id}: the zone proxies' client-facing Kafka port"
  vpc_id      = var.vpc_id
  tags        = merge(local.tags, { Name = "${var.cluster_id}-proxies" })

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_security_group" "nlb" {
  name_prefix = "${var.cluster_id}-nlb-"
  description = "zonefleet ${var.cluster_id}: the per-zone bootstrap NLBs"
  vpc_id      = var.vpc_id
  tags        = merge(local.tags, { Name = "${var.cluster_id}-nlb" })

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_security_group" "wal" {
  name_prefix = "${var.cluster_id}-wal-"
  description = "zonefleet ${var.cluster_id}: the shared WAL file system (NFS)"
  vpc_id      = var.vpc_id
  tags        = merge(local.tags, { Name = "${var.cluster_id}-wal" })

  lifecycle {
    create_before_destroy = true
  }
}

# ---------------------------------------------------------------- between fleet nodes

resource "aws_vpc_security_group_ingress_rule" "nodes_from_nodes" {
  for_each                     = local.fleet_ports
  security_group_id            = aws_security_group.nodes.id
  referenced_security_group_id = aws_security_group.nodes.id
  ip_protocol                  = "tcp"
  from_port                    = each.value
  to_port                      = each.value
  description                  = "${each.key} from fleet nodes"
}

resource "aws_vpc_security_group_egress_rule" "nodes_to_nodes" {
  for_each                     = local.fleet_ports
  security_group_id            = aws_security_group.nodes.id
  referenced_security_group_id = aws_security_group.nodes.id
  ip_protocol                  = "tcp"
  from_port                    = each.value
  to_port                      = each.value
  description                  = "${each.key} to fleet nodes"
}

resource "aws_vpc_security_group_egress_rule" "nodes_to_wal" {
  security_group_id            = aws_security_group.nodes.id
  referenced_security_group_id = aws_security_group.wal.id
  ip_protocol                  = "tcp"
  from_port                    = local.nfs_port
  to_port                      = local.nfs_port
  description                  = "NFS to the shared WAL"
}

resource "aws_vpc_security_group_ingress_rule" "wal_from_nodes" {
  security_group_id            = aws_security_group.wal.id
  referenced_security_group_id = aws_security_group.nodes.id
  ip_protocol                  = "tcp"
  from_port                    = local.nfs_port
  to_port                      = local.nfs_port
  description                  = "NFS from fleet nodes"
}

# A node reaches another zone's proxy admin port (zonefleet status) through that zone's NLB.
resource "aws_vpc_security_group_egress_rule" "nodes_to_nlb" {
  for_each                     = { proxy_kafka = local.ports.proxy_kafka, proxy_admin = local.ports.proxy_admin }
  security_group_id            = aws_security_group.nodes.id
  referenced_security_group_id = aws_security_group.nlb.id
  ip_protocol                  = "tcp"
  from_port                    = each.value
  to_port                      = each.value
  description                  = "${each.key} through the bootstrap NLBs"
}

# HTTPS out: pip (through the caller's NAT), SSM, and S3 (through the gateway endpoint).
resource "aws_vpc_security_group_egress_rule" "nodes_https" {
  security_group_id = aws_security_group.nodes.id
  cidr_ipv4         = "0.0.0.0/0"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  description       = "HTTPS: package index, SSM, S3"
}

# ---------------------------------------------------------------- clients -> NLB -> proxies

resource "aws_vpc_security_group_ingress_rule" "nlb_kafka_from_clients" {
  for_each          = toset(var.client_cidrs)
  security_group_id = aws_security_group.nlb.id
  cidr_ipv4         = each.value
  ip_protocol       = "tcp"
  from_port         = local.ports.proxy_kafka
  to_port           = local.ports.proxy_kafka
  description       = "Kafka clients"
}

resource "aws_vpc_security_group_ingress_rule" "nlb_from_nodes" {
  for_each                     = { proxy_kafka = local.ports.proxy_kafka, proxy_admin = local.ports.proxy_admin }
  security_group_id            = aws_security_group.nlb.id
  referenced_security_group_id = aws_security_group.nodes.id
  ip_protocol                  = "tcp"
  from_port                    = each.value
  to_port                      = each.value
  description                  = "${each.key} from fleet nodes"
}

# Forwarded connections and health checks (HTTP /healthz on the admin port).
resource "aws_vpc_security_group_egress_rule" "nlb_to_proxies" {
  for_each                     = { proxy_kafka = local.ports.proxy_kafka, proxy_admin = local.ports.proxy_admin }
  security_group_id            = aws_security_group.nlb.id
  referenced_security_group_id = aws_security_group.proxies.id
  ip_protocol                  = "tcp"
  from_port                    = each.value
  to_port                      = each.value
  description                  = "${each.key} to the proxies"
}

resource "aws_vpc_security_group_ingress_rule" "proxies_from_nlb" {
  for_each                     = { proxy_kafka = local.ports.proxy_kafka, proxy_admin = local.ports.proxy_admin }
  security_group_id            = aws_security_group.proxies.id
  referenced_security_group_id = aws_security_group.nlb.id
  ip_protocol                  = "tcp"
  from_port                    = each.value
  to_port                      = each.value
  description                  = "${each.key} from the bootstrap NLB"
}

# The NLB keeps the client's address (client IP preservation), so the proxies also admit the
# client networks themselves on the Kafka port, and only there.
resource "aws_vpc_security_group_ingress_rule" "proxies_kafka_from_clients" {
  for_each          = toset(var.client_cidrs)
  security_group_id = aws_security_group.proxies.id
  cidr_ipv4         = each.value
  ip_protocol       = "tcp"
  from_port         = local.ports.proxy_kafka
  to_port           = local.ports.proxy_kafka
  description       = "Kafka clients"
}
