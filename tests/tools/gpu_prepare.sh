#!/usr/bin/env bash
# Before a device call (tests/tools/gpu_run.py), on a machine that reaches the package index: fill .gpu/ (ignored
# by git, carried to the device) with the wheels the device lacks and the data it cannot download.
#   tests/tools/gpu_prepare.sh [SHARED]      # SHARED: the shared folder beside the checkout (default ../shared)
set -euo pipefail
cd "$(dirname "$0")/../.."
shared=${1:-../shared}
mkdir -p .gpu/data/iwslt14
cp -r "$shared/data/multi30k" .gpu/data/
cp -r "$shared/data/iwslt14/hub" .gpu/data/iwslt14/
chmod -R u+w .gpu
[ -n "$(ls .gpu/wheels/*.whl 2>/dev/null)" ] || bash "$shared/device/wheels.sh" .gpu/wheels
du -sh .gpu
