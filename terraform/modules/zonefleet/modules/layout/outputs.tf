# A contract: the AWS module and the one-machine simulation test read these names and shapes.

output "zone_index" {
  description = "Zone name => K (1..N, sorted AZ-name order)."
  value       = local.zone_index
}

output "mains" {
  description = "Node key main-<id> => { node_id, zone, host, port, admin_port, rpc_port }; host is the main's fixed address, which it binds."
  value       = local.mains

  precondition {
    condition     = length(local.zone_names) * var.mains_per_zone < 100
    error_message = "Main node ids must stay below the proxies' 100+K: fewer than 100 mains in all."
  }
  precondition {
    condition = alltrue([
      for z in local.zone_names :
      var.main_host_base + var.mains_per_zone - 1 < pow(2, 32 - tonumber(split("/", var.zones[z].subnet_cidr)[1])) - 1
    ])
    error_message = "The mains' host numbers (main_host_base + i) must fit inside every zone's subnet, below its broadcast address."
  }
  precondition {
    condition = (var.bootstrap_host_number < var.main_host_base
    || var.bootstrap_host_number >= var.main_host_base + var.mains_per_zone)
    error_message = "bootstrap_host_number falls on a main broker's address."
  }
}

output "proxies" {
  description = "Zone => { node_key (proxy-<zone>), node_id, zone, bootstrap_host, port, admin_port }. The proxy binds 0.0.0.0 (in its own fleet TOML) and advertises bootstrap_host:port; other nodes list it at bootstrap_host."
  value = {
    for z, p in local.proxies : z => {
      node_key       = p.node_key
      node_id        = p.node_id
      zone           = p.zone
      bootstrap_host = p.bootstrap_host
      port           = p.port
      admin_port     = p.admin_port
    }
  }
}

output "bootstrap" {
  description = "Zone => \"ip:port\" that the zone's clients bootstrap from."
  value       = local.bootstrap
}

output "node_keys" {
  description = "Every node key: mains in node-id order, then proxy-<zone> in zone order."
  value       = local.node_keys
}

output "fleet_toml" {
  description = "Node key => the fleet TOML that node boots with."
  value       = local.fleet_toml
}

output "user_data" {
  description = "Node key => the node's rendered user data script."
  value       = local.user_data
}

output "zonefleet_package" {
  description = "The pip requirement the nodes install."
  value       = local.zonefleet_package
}

output "ports" {
  description = "The role ports in use (defaults filled in): proxy_kafka, proxy_admin, main_kafka, main_admin, main_rpc."
  value       = var.ports
}
