#!/bin/sh
# bench/setup.sh: installs what `npm run bench` needs beyond scripts/bootstrap (HAProxy for the
# download comparison, a C compiler for bench/trafgen) and checks the rest. Idempotent; run as root.
# The benchmark itself builds the generator and sink (bench/trafgen/*.c) into bench/out/bin.

set -eu

PACKAGES="haproxy gcc libc6-dev iproute2 nftables ethtool curl procps"

[ "$(id -u)" = 0 ] || {
	echo "bench/setup.sh: run as root" >&2
	exit 1
}

missing=""
for pkg in $PACKAGES; do
	status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
	[ "$status" = "install ok installed" ] || missing="$missing $pkg"
done
if [ -n "$missing" ]; then
	echo "==> installing:$missing"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q >/dev/null
	# shellcheck disable=SC2086 # one word per package
	apt-get install -y -q --no-install-recommends $missing >/dev/null
fi
# The Debian package enables and starts a system-wide HAProxy; the benchmark runs its own.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet haproxy 2>/dev/null; then
	systemctl stop haproxy || true
fi

for cmd in ip nft ethtool curl cc haproxy node; do
	command -v "$cmd" >/dev/null 2>&1 || {
		echo "bench/setup.sh: $cmd not found" >&2
		exit 1
	}
done
cd "$(dirname "$0")/.."
[ -f dist/cli/main.js ] || {
	echo "bench/setup.sh: dist/ missing: run npm run build (or scripts/bootstrap) first" >&2
	exit 1
}
echo "==> bench dependencies present ($(haproxy -v | head -n 1))"
