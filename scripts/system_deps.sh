#!/usr/bin/env bash
# System packages the test suite needs. Idempotent: installs only what is missing, and
# does nothing (successfully) where apt-get is unavailable or we are not root.
# Append packages as "command:debian-package" pairs.
set -euo pipefail

NEEDED=(
  "redis-server:redis-server"
  "chromium:chromium"  # tests/test_web.py drives the page in headless Chromium (Playwright)
  "docker-compose:docker-compose"  # tests/test_compose_files.py validates the compose files (`config`, no engine)
  "node:nodejs"  # tests/worker/test_exports_splat_formats.py reads the splat exports with npm's readers
  "npm:npm"  # ... installed from tools/splat-readers/package-lock.json by the tests (`npm ci`)
)

missing=()
for pair in "${NEEDED[@]}"; do
  cmd="${pair%%:*}"; pkg="${pair#*:}"
  command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "system deps: all present"
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1 || [ "$(id -u)" != 0 ]; then
  echo "system deps: missing ${missing[*]} (no apt-get or not root); tests needing them will skip" >&2
  exit 0
fi
echo "system deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
