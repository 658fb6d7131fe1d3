# The fleet's layout: which nodes exist, their ids, zones, addresses and ports, and the fleet
# TOML and user data each one boots with. Pure functions of the inputs, so the AWS resources
# (../../*.tf) and a one-machine simulation build the very same fleet from it.

locals {
  # Zone K = 1..N in sorted AZ-name order: stable while the set of zones is.
  zone_names = sort(keys(var.zones))
  zone_index = { for i, z in local.zone_names : z => i + 1 }

  zonefleet_package = coalesce(var.zonefleet_package, "zonefleet==${var.zonefleet_version}")

  # Main i (0-based) of zone K is node K + 10*i, at a fixed address, so its id, WAL directory
  # and cluster registrations survive a replacement of the machine. The id depends on K and i
  # only: raising mains_per_zone adds ids and renumbers none (zones and mains per zone are at
  # most 9 each, so mains stay below the proxies' 100+K).
  mains = merge([
    for z in local.zone_names : {
      for i in range(var.mains_per_zone) :
      "main-${local.zone_index[z] + 10 * i}" => {
        node_id    = local.zone_index[z] + 10 * i
        zone       = z
        host       = cidrhost(var.zones[z].subnet_cidr, var.main_host_base + i)
        port       = var.ports.main_kafka
        admin_port = var.ports.main_admin
        rpc_port   = var.ports.main_rpc
      }
    }
  ]...)

  # One proxy per zone, node 100+K. Its machine comes and goes (an Auto Scaling group of one),
  # so it binds every address of whatever machine it is on, and advertises its zone's stable
  # bootstrap address (the zone's NLB in AWS) instead.
  proxies = {
    for z in local.zone_names : z => {
      node_key       = "proxy-${z}"
      node_id        = 100 + local.zone_index[z]
      zone           = z
      bootstrap_host = cidrhost(var.zones[z].subnet_cidr, var.bootstrap_host_number)
      port           = var.ports.proxy_kafka
      admin_port     = var.ports.proxy_admin
    }
  }

  bootstrap = { for z, p in local.proxies : z => "${p.bootstrap_host}:${p.port}" }

  # Mains in node-id order, then proxies in zone order.
  main_keys = [for id in sort([for m in values(local.mains) : format("%06d", m.node_id)]) : "main-${tonumber(id)}"]
  node_keys = concat(local.main_keys, [for z in local.zone_names : local.proxies[z].node_key])

  node_roles = merge(
    { for k in local.main_keys : k => { role = "main", node_id = local.mains[k].node_id } },
    { for z, p in local.proxies : p.node_key => { role = "proxy", node_id = p.node_id } },
  )

  # Client networks => zone for [cidrs]: each zone's subnet, plus what the caller adds.
  cidrs = flatten([
    for z in local.zone_names : [
      for c in distinct(concat([var.zones[z].subnet_cidr], lookup(var.client_zone_cidrs, z, []))) :
      { cidr = c, zone = z }
    ]
  ])

  # The fleet TOML of each node: the same fleet, in which only the node itself says
  # zone = "auto" (it asks IMDSv2 at start, so a mis-placed machine refuses to start rather
  # than serve another zone's clients). A proxy binds 0.0.0.0 in its own file; in everyone
  # else's it is described by where it is reached, its bootstrap address (its machine's own
  # address is unknown and changes with each replacement).
  fleet_toml = {
    for key in local.node_keys : key => templatefile("${path.module}/templates/fleet.toml.tftpl", {
      cluster_id               = var.cluster_id
      data_dir                 = var.data_dir
      zones                    = [for z in local.zone_names : { name = z, az_id = var.zones[z].az_id }]
      cidrs                    = local.cidrs
      wal_url                  = var.wal_url
      metadata_url             = var.metadata_url
      object_store_url         = var.object_store_url
      ledger_upload_interval_s = var.ledger_upload_interval_s
      mains = [
        for k in local.main_keys : merge(local.mains[k], { zone = k == key ? "auto" : local.mains[k].zone })
      ]
      proxies = [
        for z in local.zone_names : merge(local.proxies[z], {
          zone = local.proxies[z].node_key == key ? "auto" : z
          host = local.proxies[z].node_key == key ? "0.0.0.0" : local.proxies[z].bootstrap_host
        })
      ]
    })
  }

  # The template is the node-side engineer's; it gets exactly these variables.
  user_data = {
    for key in local.node_keys : key => templatefile("${path.module}/templates/user_data.sh.tftpl", {
      role                 = local.node_roles[key].role
      node_id              = local.node_roles[key].node_id
      node_key             = key
      fleet_toml           = local.fleet_toml[key]
      zonefleet_package    = local.zonefleet_package
      zonefleet_version    = var.zonefleet_version
      secret_ssm_parameter = var.secret_ssm_parameter
      region               = var.region
      config_dir           = var.config_dir
      data_dir             = var.data_dir
      install_dir          = var.install_dir
      systemd_dir          = var.systemd_dir
    })
  }
}
