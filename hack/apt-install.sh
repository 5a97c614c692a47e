#!/usr/bin/env bash
# apt-install.sh installs the Debian packages it is given that are not
# installed yet (one apt-get update first), as root; otherwise it says which
# are missing and the command to run, and fails. Usage: hack/apt-install.sh
# TAG PACKAGE... (TAG prefixes its messages, e.g. install-horovod).
set -euo pipefail
tag=$1
shift
need=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
done
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "[$tag] missing Debian packages: ${need[*]}; run as root: apt-get install -y --no-install-recommends ${need[*]}" >&2
  exit 1
fi
echo "[$tag] apt-get install ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
