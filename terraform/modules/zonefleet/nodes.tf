# The machines. Each node's user data (from the layout) installs the pinned zonefleet, writes
# its fleet TOML and the internal secret from SSM, and runs the node under systemd.

data "aws_ssm_parameter" "al2023" {
  count = var.ami_id == null ? 1 : 0
  name  = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64"
}

locals {
  ami_id = var.ami_id != null ? var.ami_id : nonsensitive(data.aws_ssm_parameter.al2023[0].value)

  # IMDSv2 only: a token is required (zone discovery uses one), and one hop, so nothing
  # forwarded from the host (a container) can reach the metadata service.
  metadata_options = {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
  }
}

# ---------------------------------------------------------------- proxies: an ASG of one per AZ

resource "aws_launch_template" "proxy" {
  for_each    = toset(local.zone_names)
  name_prefix = "${var.cluster_id}-proxy-${module.layout.zone_index[each.key]}-"
  description = "zonefleet ${var.cluster_id}: the proxy of ${each.key}"

  image_id               = local.ami_id
  instance_type          = var.proxy_instance_type
  ebs_optimized          = true
  vpc_security_group_ids = [aws_security_group.nodes.id, aws_security_group.proxies.id]
  user_data              = base64encode(module.layout.user_data[module.layout.proxies[each.key].node_key])
  update_default_version = true

  iam_instance_profile {
    arn = aws_iam_instance_profile.node.arn
  }

  metadata_options {
    http_endpoint               = local.metadata_options.http_endpoint
    http_tokens                 = local.metadata_options.http_tokens
    http_put_response_hop_limit = local.metadata_options.http_put_response_hop_limit
  }

  block_device_mappings {
    device_name = "/dev/xvda"
    ebs {
      volume_size           = var.root_volume_gb
      volume_type           = "gp3"
      encrypted             = true
      delete_on_termination = true
    }
  }

  monitoring {
    enabled = var.detailed_monitoring
  }

  tag_specifications {
    resource_type = "instance"
    tags = merge(local.tags, {
      Name                = "${var.cluster_id}-${module.layout.proxies[each.key].node_key}"
      "zonefleet:role"    = "proxy"
      "zonefleet:node-id" = tostring(module.layout.proxies[each.key].node_id)
      "zonefleet:zone"    = each.key
    })
  }

  tag_specifications {
    resource_type = "volume"
    tags          = local.tags
  }

  tags = local.tags

  depends_on = [aws_ssm_parameter.internal_secret]
}

# One proxy per zone that heals itself: min = max = desired = 1, in the zone's subnet only,
# replaced when the NLB's health check (/healthz on the admin port) fails.
resource "aws_autoscaling_group" "proxy" {
  for_each = toset(local.zone_names)
  name     = "${var.cluster_id}-proxy-${each.key}"

  min_size                  = 1
  max_size                  = 1
  desired_capacity          = 1
  vpc_zone_identifier       = [var.subnet_ids[each.key]]
  target_group_arns         = [aws_lb_target_group.proxy_kafka[each.key].arn, aws_lb_target_group.proxy_admin[each.key].arn]
  health_check_type         = "ELB"
  health_check_grace_period = 300

  launch_template {
    id      = aws_launch_template.proxy[each.key].id
    version = aws_launch_template.proxy[each.key].latest_version
  }

  # A new launch template (new user data, new AMI) replaces the proxy: with one machine there
  # is nothing to keep healthy meanwhile, so the old one goes first.
  instance_refresh {
    strategy = "Rolling"
    preferences {
      min_healthy_percentage = 0
    }
  }

  dynamic "tag" {
    for_each = local.tags
    content {
      key                 = tag.key
      value               = tag.value
      propagate_at_launch = false
    }
  }
}

# ---------------------------------------------------------------- mains: fixed address, fixed id

resource "aws_instance" "main" {
  for_each = module.layout.mains
  #checkov:skip=CKV_AWS_126: detailed monitoring is the detailed_monitoring option (billed per metric); every node serves finer Prometheus metrics on its admin port

  ami                    = local.ami_id
  instance_type          = var.main_instance_type
  subnet_id              = var.subnet_ids[each.value.zone]
  private_ip             = each.value.host
  vpc_security_group_ids = [aws_security_group.nodes.id]
  iam_instance_profile   = aws_iam_instance_profile.node.name
  ebs_optimized          = true
  monitoring             = var.detailed_monitoring
  user_data_base64       = base64encode(module.layout.user_data[each.key])

  metadata_options {
    http_endpoint               = local.metadata_options.http_endpoint
    http_tokens                 = local.metadata_options.http_tokens
    http_put_response_hop_limit = local.metadata_options.http_put_response_hop_limit
  }

  root_block_device {
    volume_size           = var.root_volume_gb
    volume_type           = "gp3"
    encrypted             = true
    delete_on_termination = true
    tags                  = local.tags
  }

  # EC2 restarts the instance on a host failure, same id, address and volume.
  maintenance_options {
    auto_recovery = "default"
  }

  tags = merge(local.tags, {
    Name                = "${var.cluster_id}-${each.key}"
    "zonefleet:role"    = "main"
    "zonefleet:node-id" = tostring(each.value.node_id)
    "zonefleet:zone"    = each.value.zone
  })

  # A newer AMI must not replace a running main; roll mains one at a time on purpose
  # (terraform apply -replace=...).
  lifecycle {
    ignore_changes = [ami]
  }

  depends_on = [aws_ssm_parameter.internal_secret, aws_vpc_endpoint.s3]
}
