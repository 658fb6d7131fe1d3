# The internal RPC secret (proxies <-> mains HMAC handshake): generated once, kept as an SSM
# SecureString under the fleet's key; each node's user data reads it at boot into
# <config_dir>/internal.secret. It is also in the Terraform state: keep the state private.

resource "random_password" "internal_secret" {
  length  = 64
  special = false
}

resource "aws_ssm_parameter" "internal_secret" {
  name        = local.secret_parameter
  description = "zonefleet ${var.cluster_id}: the internal RPC shared secret"
  type        = "SecureString"
  tier        = "Standard"
  key_id      = aws_kms_key.fleet.arn
  value       = random_password.internal_secret.result
  tags        = local.tags
}
