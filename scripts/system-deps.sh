#!/usr/bin/env bash
# Debian packages the tests use for real: promtool/Prometheus, amtool/Alertmanager, Chromium,
# npm and Node.js (Grafana's published dashboard schema for the dashboard tests; npm's
# pprof-format decoder, an independent reference for our pprof).
set -euo pipefail
need=()
command -v promtool >/dev/null || need+=(prometheus)
command -v amtool >/dev/null || need+=(prometheus-alertmanager)
command -v chromium >/dev/null || need+=(chromium)
command -v node >/dev/null || need+=(nodejs)
command -v npm >/dev/null || need+=(npm)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "missing Debian packages: ${need[*]} (run: sudo apt-get install ${need[*]})" >&2
  exit 1
fi
echo "installing Debian packages: ${need[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
# The Debian packages start services; the tests start their own on free ports.
for svc in prometheus prometheus-alertmanager prometheus-node-exporter; do
  (systemctl stop "$svc" || service "$svc" stop) >/dev/null 2>&1 || true
done
