# terraform test for the provider-free layout: run with `terraform test` in this module's
# directory (tests/test_terraform.py runs it in `make test`).

variables {
  cluster_id           = "zonefleet-test"
  region               = "us-east-1"
  object_store_url     = "s3://zf-bucket/zonefleet-test/objects?region=us-east-1"
  metadata_url         = "s3://zf-bucket/zonefleet-test/metadata?region=us-east-1"
  wal_url              = "nfs://svm.example.internal/zonefleet?version=4.1"
  secret_ssm_parameter = "/zonefleet/zonefleet-test/internal-secret"
  # Declared out of order on purpose: zone K follows the sorted AZ names.
  zones = {
    "us-east-1c" = { az_id = "use1-az4", subnet_cidr = "10.42.32.0/20" }
    "us-east-1a" = { az_id = "use1-az1", subnet_cidr = "10.42.0.0/20" }
    "us-east-1b" = { az_id = "use1-az2", subnet_cidr = "10.42.16.0/20" }
  }
}

run "defaults" {
  command = apply

  assert {
    condition     = output.zone_index == { "us-east-1a" = 1, "us-east-1b" = 2, "us-east-1c" = 3 }
    error_message = "zone K must follow the sorted AZ names"
  }
  assert {
    condition     = output.node_keys == ["main-1", "main-2", "main-3", "proxy-us-east-1a", "proxy-us-east-1b", "proxy-us-east-1c"]
    error_message = "one main per zone by default, then one proxy per zone"
  }
  assert {
    condition     = keys(output.proxies) == ["us-east-1a", "us-east-1b", "us-east-1c"]
    error_message = "exactly one proxy per zone"
  }
  assert {
    condition = output.mains["main-2"] == {
      node_id = 2, zone = "us-east-1b", host = "10.42.16.20", port = 9192, admin_port = 9193, rpc_port = 9194
    }
    error_message = "main 2: zone 2's first main, at cidrhost(subnet, 20), default main ports"
  }
  assert {
    condition = output.proxies["us-east-1c"] == {
      node_key = "proxy-us-east-1c", node_id = 103, zone = "us-east-1c", bootstrap_host = "10.42.32.10", port = 9092, admin_port = 9093
    }
    error_message = "proxy of zone 3: node 103, bootstrap at cidrhost(subnet, 10), default proxy ports"
  }
  assert {
    condition     = output.bootstrap == { "us-east-1a" = "10.42.0.10:9092", "us-east-1b" = "10.42.16.10:9092", "us-east-1c" = "10.42.32.10:9092" }
    error_message = "bootstrap: each zone's bootstrap address and the proxy port"
  }
  assert {
    condition     = output.zonefleet_package == "zonefleet==0.1.0"
    error_message = "the package defaults to the pinned version"
  }
  # Every node's TOML says zone = "auto" exactly once, in the node's own entry.
  assert {
    condition     = alltrue([for k in output.node_keys : length(regexall("(?m)^zone = \"auto\"$", output.fleet_toml[k])) == 1])
    error_message = "each fleet TOML has exactly one zone = \"auto\""
  }
  assert {
    condition = alltrue([for k, m in output.mains :
    strcontains(output.fleet_toml[k], "[[main_brokers]]\nnode_id = ${m.node_id}\nzone = \"auto\"\n")])
    error_message = "a main's own entry is the one with zone = \"auto\""
  }
  assert {
    condition = alltrue([for z, p in output.proxies :
    strcontains(output.fleet_toml[p.node_key], "[[proxies]]\nnode_id = ${p.node_id}\nzone = \"auto\"\nhost = \"0.0.0.0\"\n")])
    error_message = "a proxy's own entry says zone = \"auto\" and binds 0.0.0.0"
  }
  # Elsewhere a proxy is listed at its bootstrap address, never at a wildcard.
  assert {
    condition     = alltrue([for k, m in output.mains : !strcontains(output.fleet_toml[k], "host = \"0.0.0.0\"")])
    error_message = "no wildcard address in a main's fleet TOML"
  }
  assert {
    condition     = alltrue([for k in output.node_keys : strcontains(output.fleet_toml[k], "advertised_host = \"10.42.16.10\"\nadvertised_port = 9092\n")])
    error_message = "every TOML advertises zone 2's proxy at its bootstrap address"
  }
  assert {
    condition     = alltrue([for k in output.node_keys : strcontains(output.fleet_toml[k], "[[cidrs]]\ncidr = \"10.42.32.0/20\"\nzone = \"us-east-1c\"\n")])
    error_message = "each zone's subnet maps to the zone in [[cidrs]]"
  }
  assert {
    condition     = alltrue([for k in output.node_keys : strcontains(output.user_data[k], output.fleet_toml[k])])
    error_message = "each node's user data carries its own fleet TOML"
  }
  # EC2 takes at most 16 KiB of user data (before base64).
  assert {
    condition     = alltrue([for k in output.node_keys : length(output.user_data[k]) < 16384])
    error_message = "user data over EC2's 16 KiB limit"
  }
}

run "two_mains_per_zone_and_other_ports" {
  command = plan

  variables {
    mains_per_zone        = 2
    main_host_base        = 100
    bootstrap_host_number = 5
    ports                 = { proxy_kafka = 29092, main_rpc = 29194 }
    zonefleet_package     = "zonefleet @ https://example.com/zonefleet-0.2.0-py3-none-any.whl"
    config_dir            = "/tmp/sim/etc"
  }

  assert {
    condition     = [for k in output.node_keys : k if startswith(k, "main-")] == ["main-1", "main-2", "main-3", "main-11", "main-12", "main-13"]
    error_message = "mains numbered K + 10*i: the first main of each zone keeps its id when mains_per_zone grows"
  }
  assert {
    condition     = output.mains["main-12"].zone == "us-east-1b" && output.mains["main-12"].host == "10.42.16.101"
    error_message = "main 12 is zone 2's second main, at cidrhost(subnet, main_host_base + 1)"
  }
  assert {
    condition     = output.mains["main-2"].zone == "us-east-1b" && output.mains["main-2"].host == "10.42.16.100"
    error_message = "main 2 is zone 2's first main whatever mains_per_zone is"
  }
  assert {
    condition     = output.mains["main-13"].rpc_port == 29194 && output.mains["main-13"].port == 9192
    error_message = "port overrides apply, the rest keep their defaults"
  }
  assert {
    condition     = output.bootstrap["us-east-1a"] == "10.42.0.5:29092"
    error_message = "bootstrap follows bootstrap_host_number and the proxy port"
  }
  assert {
    condition     = [for z in keys(output.proxies) : output.proxies[z].node_id] == [101, 102, 103]
    error_message = "proxy ids stay 100+K whatever the number of mains"
  }
  assert {
    condition     = output.zonefleet_package == "zonefleet @ https://example.com/zonefleet-0.2.0-py3-none-any.whl"
    error_message = "an explicit package wins over the version"
  }
  assert {
    condition     = strcontains(output.user_data["main-1"], "/tmp/sim/etc")
    error_message = "host paths reach the user data"
  }
}

run "ports_must_differ" {
  command = plan
  variables {
    ports = { proxy_kafka = 9192 }
  }
  expect_failures = [var.ports]
}

run "bootstrap_must_not_be_a_main" {
  command = plan
  variables {
    bootstrap_host_number = 21
    mains_per_zone        = 2
  }
  expect_failures = [output.mains]
}

run "mains_must_fit_the_subnet" {
  command = plan
  variables {
    zones = {
      "us-east-1a" = { az_id = "use1-az1", subnet_cidr = "10.42.0.0/28" }
    }
    mains_per_zone = 2
    main_host_base = 14
  }
  expect_failures = [output.mains]
}

run "reserved_addresses" {
  command = plan
  variables {
    bootstrap_host_number = 3
  }
  expect_failures = [var.bootstrap_host_number]
}
