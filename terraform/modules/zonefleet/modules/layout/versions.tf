# Provider-free on purpose: everything here is locals, variables and outputs, so the layout can
# be planned, applied and tested (`terraform test`) on a machine with no provider and no cloud.
terraform {
  required_version = ">= 1.5"
}
