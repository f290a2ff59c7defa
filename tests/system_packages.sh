#!/usr/bin/env bash
# The Debian packages the test suite needs (`make test` runs this before anything else): Chromium for the
# playground's browser tests, nginx for the deployment tests, curl for the README's examples, PostgreSQL's server
# for the tests of replicas sharing a database (its programs live in /usr/lib/postgresql/VERSION/bin), promtool
# (Prometheus's package) to check the shipped alert rules. As root they are
# installed when missing; otherwise this stops at once, naming the one command to run.
set -euo pipefail

# command:package pairs (PHI_API_SYSTEM_PACKAGES replaces them, for this script's own tests)
needed="${PHI_API_SYSTEM_PACKAGES:-chromium:chromium nginx:nginx curl:curl initdb:postgresql promtool:prometheus}"

missing_packages() {
  local pair command
  for pair in $needed; do
    command="${pair%%:*}"
    if ! command -v "$command" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$command" ] \
        && ! compgen -G "/usr/lib/postgresql/*/bin/$command" >/dev/null; then
      printf '%s\n' "${pair#*:}"
    fi
  done
}

mapfile -t missing < <(missing_packages)
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "Installing the Debian packages the tests need: ${missing[*]}"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
  # Only promtool is needed from Prometheus's package: its service, where systemd started it, is stopped.
  if [[ " ${missing[*]} " == *" prometheus "* ]] && command -v systemctl >/dev/null 2>&1; then
    systemctl disable --now prometheus >/dev/null 2>&1 || true
  fi
  mapfile -t missing < <(missing_packages)
  [ ${#missing[@]} -eq 0 ] && exit 0
  echo "apt-get ran, but these are still missing: ${missing[*]}" >&2
  exit 2
fi

echo "make test needs Debian packages that are not installed: ${missing[*]}" >&2
echo "Install them, then run make test again:" >&2
echo "    sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
exit 2
