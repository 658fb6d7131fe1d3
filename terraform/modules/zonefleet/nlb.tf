# The per-zone bootstrap address: an internal NLB in each zone's subnet at the layout's fixed
# address, with cross-zone load balancing off (on, it would forward across AZs and bill the
# transfer). It forwards to that zone's proxy only; the proxy advertises this address.

resource "aws_lb" "bootstrap" {
  for_each = toset(local.zone_names)
  #checkov:skip=CKV_AWS_152: cross-zone load balancing stays off on purpose: each zone's NLB forwards only to its own zone's proxy, so no client byte crosses an AZ (on, it would, and AWS bills that transfer)
  #checkov:skip=CKV_AWS_91: NLB access logs exist only for TLS listeners; these are TCP, and the VPC flow logs record every connection
  name               = "${var.cluster_id}-z${module.layout.zone_index[each.key]}"
  internal           = true
  load_balancer_type = "network"
  security_groups    = [aws_security_group.nlb.id]

  enable_cross_zone_load_balancing = false
  enable_deletion_protection       = var.deletion_protection

  subnet_mapping {
    subnet_id            = var.subnet_ids[each.key]
    private_ipv4_address = module.layout.proxies[each.key].bootstrap_host
  }

  tags = merge(local.tags, { "zonefleet:zone" = each.key })
}

resource "aws_lb_target_group" "proxy_kafka" {
  for_each    = toset(local.zone_names)
  name        = "${var.cluster_id}-k${module.layout.zone_index[each.key]}"
  port        = local.ports.proxy_kafka
  protocol    = "TCP"
  target_type = "instance"
  vpc_id      = var.vpc_id
  # Kafka clients reconnect on their own; a proxy being replaced need not wait long.
  deregistration_delay = 30

  health_check {
    protocol            = "HTTP"
    port                = tostring(local.ports.proxy_admin)
    path                = "/healthz"
    interval            = 10
    healthy_threshold   = 2
    unhealthy_threshold = 2
  }

  tags = local.tags
}

# The proxy's admin endpoint (/healthz, /metrics, /status) at the same stable address, for the
# fleet's own nodes only (the NLB's security group).
resource "aws_lb_target_group" "proxy_admin" {
  for_each             = toset(local.zone_names)
  name                 = "${var.cluster_id}-a${module.layout.zone_index[each.key]}"
  port                 = local.ports.proxy_admin
  protocol             = "TCP"
  target_type          = "instance"
  vpc_id               = var.vpc_id
  deregistration_delay = 30

  health_check {
    protocol            = "HTTP"
    port                = tostring(local.ports.proxy_admin)
    path                = "/healthz"
    interval            = 10
    healthy_threshold   = 2
    unhealthy_threshold = 2
  }

  tags = local.tags
}

resource "aws_lb_listener" "proxy_kafka" {
  for_each          = toset(local.zone_names)
  load_balancer_arn = aws_lb.bootstrap[each.key].arn
  port              = local.ports.proxy_kafka
  protocol          = "TCP"

  default_action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.proxy_kafka[each.key].arn
  }

  tags = local.tags
}

resource "aws_lb_listener" "proxy_admin" {
  for_each          = toset(local.zone_names)
  load_balancer_arn = aws_lb.bootstrap[each.key].arn
  port              = local.ports.proxy_admin
  protocol          = "TCP"

  default_action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.proxy_admin[each.key].arn
  }

  tags = local.tags
}
