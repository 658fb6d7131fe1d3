terraform {
  required_version = ">= 1.5"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 5.0"
    }
    # The internal RPC secret is generated here and kept in SSM (and in the state: keep the
    # state encrypted and private).
    random = {
      source  = "hashicorp/random"
      version = "~> 3.5"
    }
  }
}
