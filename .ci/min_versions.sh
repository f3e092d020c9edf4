#!/usr/bin/env bash
# CI: a second fresh virtual environment with the LOWEST dependency versions pyproject.toml declares
# (pins generated from its '>=' floors by .ci/min_pins.py), autoprec installed without dependencies,
# then .ci/min_smoke.py: a fit with a plan, plan files, a 3-trial search (float16 emulated) and the CLI.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
export TF_CPP_MIN_LOG_LEVEL=3
start=$SECONDS
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT  # about 2 GB of wheels unpacked
venv_dir="$scratch/minvenv"
python3 -m venv "$venv_dir"
"$venv_dir/bin/python" -m pip install -q --upgrade pip
mapfile -t pins < <("$venv_dir/bin/python" .ci/min_pins.py)
echo "minimum versions: ${pins[*]}"
# Binary wheels only: a floor that needs a source build on this Python is not a floor we support.
"$venv_dir/bin/python" -m pip install -q --only-binary=:all: "${pins[@]}"
"$venv_dir/bin/python" -m pip install -q --no-deps .
"$venv_dir/bin/python" -m pip check
echo "installed in $((SECONDS - start)) s"
# From outside the checkout, so the installed package (not ./autoprec) is imported.
(cd "$venv_dir" && "$venv_dir/bin/python" "$root/.ci/min_smoke.py")
echo "minimum-version step: $((SECONDS - start)) s"
