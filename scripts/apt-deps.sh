#!/usr/bin/env bash
# Install the Debian packages the lab and the tests need, without starting any daemon in the root namespace.
set -euo pipefail
PKGS=(iproute2 openssh-server openssh-client iptables nftables firewalld python3-firewall dbus chrony
      netcat-openbsd procps util-linux python3 python3-venv libfaketime sudo
      ipset  # ipset: the undecided-rule lab test matches a real ipset (`-m set`), as operators write it
      ufw  # ufw: the real-ruleset lab loads ufw configurations and runs ufw's own boot path on a node
      chromium fonts-dejavu-core)  # chromium: the HTML report is tested in a real headless browser
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "apt-deps: missing Debian packages ${missing[*]}: installing them as root" >&2
  . "$(dirname "$0")/as-root.sh"  # through sudo; without sudo: exit 4, "run it as root"
fi
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
  chmod +x /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "apt-deps: installed ${missing[*]}"
