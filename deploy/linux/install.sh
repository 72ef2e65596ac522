#!/bin/sh
# install.sh: installs dsrlb from this built checkout (scripts/bootstrap builds it) as a systemd
# service: code in /opt/dsrlb, /usr/local/bin/dsrlb, user dsrlb, /etc/dsrlb/dsrlb.yaml (never
# overwritten), the units and dsrlb-realserver. Idempotent. Exit 1 on a user error, 2 when the system refused.

set -eu
umask 022

PROG=install.sh

usage() {
	cat <<'EOF'
Usage: deploy/linux/install.sh [--root DIR]

Installs dsrlb from this checkout (build it first: scripts/bootstrap):
  /opt/dsrlb                           the code with its production npm dependencies
  /usr/local/bin/dsrlb                 -> /opt/dsrlb/bin/dsrlb.js
  /etc/dsrlb/dsrlb.yaml                from deploy/linux/dsrlb.yaml.sample, only when absent,
                                       with stateFile: /var/lib/dsrlb/dsrlb.state.json
  /etc/dsrlb/admin.token               a random admin API token (the sample's admin.tokenFile),
                                       only when absent; the daemon enforces it
  /etc/systemd/system/dsrlb.service    the unit (local changes: systemctl edit dsrlb)
  /etc/systemd/system/dsrlb-decap@.service
                                       user-space IPIP decapsulation on a real server
                                       whose kernel has no ipip (dsrlb-decap@eth0)
  /usr/local/lib/sysusers.d/dsrlb.conf the system user dsrlb, for systemd-sysusers
  /usr/local/sbin/dsrlb-realserver     real-server setup script (copy it to the real servers)
and creates the system user dsrlb, then runs systemctl daemon-reload when systemd runs.
It neither enables nor starts the service. A second run changes nothing unless
the checkout changed.

Options:
  --root DIR   install under DIR instead of / (image builds, tests). Then no user
               is created (systemd-sysusers does at the image's first boot), no
               ownership is set (systemd-tmpfiles sets it at boot from the
               installed tmpfiles.d entry, or: chown root:dsrlb /etc/dsrlb
               /etc/dsrlb/dsrlb.yaml /etc/dsrlb/admin.token) and systemctl is
               not run. Needs no root.
  -h, --help   this text
EOF
}

say() { printf '%s\n' "$*"; }
fail() {
	printf '%s: %s\n' "$PROG" "$2" >&2
	exit "$1"
}

ROOT=""
while [ $# -gt 0 ]; do
	case $1 in
	--root)
		[ $# -ge 2 ] || fail 1 "--root needs a directory"
		ROOT=$2
		shift 2
		;;
	--root=*)
		ROOT=${1#--root=}
		shift
		;;
	-h | --help)
		usage
		exit 0
		;;
	*) fail 1 "unknown argument: $1 (see --help)" ;;
	esac
done
if [ -n "$ROOT" ]; then
	[ -d "$ROOT" ] || fail 1 "--root $ROOT: no such directory"
	ROOT=$(cd "$ROOT" && pwd)
	[ "$ROOT" != / ] || ROOT=""
fi
[ -n "$ROOT" ] || [ "$(id -u)" = 0 ] || fail 1 "run as root (or give --root DIR)"

SRC=$(cd "$(dirname "$0")/../.." && pwd)
APP_DIR=/opt/dsrlb
BIN_LINK=/usr/local/bin/dsrlb
CONF_DIR=/etc/dsrlb
CONF=$CONF_DIR/dsrlb.yaml
UNIT=/etc/systemd/system/dsrlb.service
DECAP_UNIT=/etc/systemd/system/dsrlb-decap@.service
SYSUSERS=/usr/local/lib/sysusers.d/dsrlb.conf
TMPFILES=/usr/local/lib/tmpfiles.d/dsrlb.conf
REALSERVER=/usr/local/sbin/dsrlb-realserver
STATE_FILE=/var/lib/dsrlb/dsrlb.state.json
ADDON=native/build/Release/dsrlb_native.node
# What /opt/dsrlb holds besides node_modules: the runtime and the deploy files `dsrlb demo` uses.
PAYLOAD="README.md package.json package-lock.json bin dist deploy/linux $ADDON"

command -v node >/dev/null 2>&1 || fail 2 "node not found: Node.js 20 or later is required"
command -v npm >/dev/null 2>&1 || fail 2 "npm not found (it comes with Node.js)"
if [ ! -f "$SRC/dist/cli/main.js" ] || [ ! -f "$SRC/$ADDON" ]; then
	fail 1 "$SRC is not built (no dist/ or $ADDON): run scripts/bootstrap first"
fi

changed=0
note() {
	say "$*"
	changed=1
}

# Copies SRC to DST (mode MODE) only when the content or mode differs; written aside, then renamed.
install_file() {
	mode=$1 from=$2 to=$3
	if [ -f "$to" ] && cmp -s "$from" "$to"; then
		[ "$(stat -c %a "$to")" = "${mode#0}" ] && return 0
		chmod "$mode" "$to"
		note "mode $mode: $to"
		return 0
	fi
	mkdir -p "$(dirname "$to")"
	cp "$from" "$to.new.$$"
	chmod "$mode" "$to.new.$$"
	mv -f "$to.new.$$" "$to"
	note "installed $to"
}

# A digest of the code to install: unchanged code is not copied again. node_modules is stood for by
# the lockfile and Node's ABI (its addons are compiled for it).
code_stamp() {
	(
		cd "$SRC"
		# shellcheck disable=SC2086 # one word per path
		find $PAYLOAD -type f -exec sha256sum {} + | LC_ALL=C sort -k2
		node -p 'process.versions.modules'
	) | sha256sum | cut -d' ' -f1
}

install_app() {
	app=$ROOT$APP_DIR
	stamp=$(code_stamp)
	if [ -f "$app/.install-stamp" ] && [ "$(cat "$app/.install-stamp")" = "$stamp" ]; then
		return 0
	fi
	# Built beside the old tree and swapped in, so a running daemon never sees a half-copied one.
	stage=$(dirname "$app")/.dsrlb.new.$$
	rm -rf "$stage"
	mkdir -p "$stage"
	trap 'rm -rf "$stage"' EXIT
	# shellcheck disable=SC2086 # one word per path
	(cd "$SRC" && tar -cf - $PAYLOAD) | (cd "$stage" && tar --no-same-owner -xf -)
	if [ -d "$SRC/node_modules" ]; then
		# The checkout's modules are built for this machine; pruning drops the dev tools offline.
		cp -R "$SRC/node_modules" "$stage/node_modules"
		rm -f "$stage/node_modules/.dsrlb-bootstrap-stamp"
		(cd "$stage" && npm prune --omit=dev --offline --no-audit --no-fund >/dev/null) ||
			fail 2 "npm prune --omit=dev failed in $stage"
	else
		(cd "$stage" && npm ci --omit=dev --no-audit --no-fund >/dev/null) ||
			fail 2 "npm ci --omit=dev failed in $stage"
	fi
	printf '%s\n' "$stamp" >"$stage/.install-stamp"
	if [ -d "$app" ]; then
		mv "$app" "$stage.old"
		mv "$stage" "$app"
		rm -rf "$stage.old"
	else
		mv "$stage" "$app"
	fi
	trap - EXIT
	note "installed $app"
}

install_link() {
	link=$ROOT$BIN_LINK target=$APP_DIR/bin/dsrlb.js
	[ -L "$link" ] && [ "$(readlink "$link")" = "$target" ] && return 0
	mkdir -p "$(dirname "$link")"
	ln -sfn "$target" "$link"
	note "linked $link -> $target"
}

# From the sysusers.d entry when systemd-sysusers exists, so both ways give the same user.
create_user() {
	getent passwd dsrlb >/dev/null 2>&1 && return 0
	if command -v systemd-sysusers >/dev/null 2>&1; then
		systemd-sysusers "$SYSUSERS" >/dev/null || fail 2 "systemd-sysusers $SYSUSERS failed"
		note "created system user dsrlb"
		return 0
	fi
	useradd --system --user-group --home-dir /var/lib/dsrlb --no-create-home \
		--shell /usr/sbin/nologin --comment "dsrlb load balancer" dsrlb ||
		fail 2 "useradd dsrlb failed"
	note "created system user dsrlb"
}

# /etc is read-only to the service (ProtectSystem=strict), so operator intent must be kept under
# /var/lib/dsrlb: the sample's stateFile points there, and a sample without one gets it appended.
install_config() {
	conf=$ROOT$CONF
	mkdir -p "$ROOT$CONF_DIR"
	if [ -z "$ROOT" ]; then
		chown root:dsrlb "$ROOT$CONF_DIR"
		chmod 0750 "$ROOT$CONF_DIR"
	fi
	if [ -e "$conf" ]; then
		say "kept $conf (never overwritten)"
		return 0
	fi
	tmp=$conf.new.$$
	cp "$SRC/deploy/linux/dsrlb.yaml.sample" "$tmp"
	if ! grep -q '^stateFile:' "$tmp"; then
		printf '\n# Set by install.sh: /etc/dsrlb is read-only to the service.\nstateFile: %s\n' "$STATE_FILE" >>"$tmp"
	fi
	chmod 0640 "$tmp"
	[ -n "$ROOT" ] || chown root:dsrlb "$tmp"
	mv "$tmp" "$conf"
	note "installed $conf (edit it, then: dsrlb validate -c $CONF)"
}

# The sample config names admin.tokenFile, and a configured token file is enforced (on loopback
# too): without one the daemon would not start. 32 random bytes, hex; readable by root and dsrlb.
install_token() {
	token=$ROOT$CONF_DIR/admin.token
	[ -e "$token" ] && return 0
	tmp=$token.new.$$
	(umask 077 && od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >"$tmp") || fail 2 "cannot write $tmp"
	printf '\n' >>"$tmp"
	chmod 0640 "$tmp"
	[ -n "$ROOT" ] || chown root:dsrlb "$tmp"
	mv "$tmp" "$token"
	note "installed $token (a random admin API token; the dsrlb CLI reads it as root)"
}

install_file 0644 "$SRC/deploy/linux/dsrlb.sysusers.conf" "$ROOT$SYSUSERS"
install_file 0644 "$SRC/deploy/linux/dsrlb.tmpfiles.conf" "$ROOT$TMPFILES"
[ -n "$ROOT" ] || create_user
install_app
install_link
install_config
install_token
install_file 0644 "$SRC/deploy/linux/dsrlb.service" "$ROOT$UNIT"
install_file 0644 "$SRC/deploy/linux/dsrlb-decap@.service" "$ROOT$DECAP_UNIT"
install_file 0755 "$SRC/deploy/linux/dsrlb-realserver" "$ROOT$REALSERVER"

if [ -z "$ROOT" ]; then
	node_bin=$(command -v node)
	case ${node_bin%/*} in
	/usr/local/sbin | /usr/local/bin | /usr/sbin | /usr/bin | /sbin | /bin) ;;
	*) say "warning: node is $node_bin, outside systemd's PATH; the unit will not find it: ln -s $node_bin /usr/local/bin/node" >&2 ;;
	esac
	# sd_booted(3): systemd is the init system when this directory exists.
	if [ -d /run/systemd/system ]; then
		[ "$changed" = 0 ] || systemctl daemon-reload
		# /run/dsrlb now, not only from the next boot on (BIRD's include needs the directory), and
		# the service user's even when a run as root made it first (tmpfiles sets its owner).
		systemd-tmpfiles --create "$TMPFILES" || say "warning: systemd-tmpfiles --create $TMPFILES failed" >&2
		if [ "$changed" = 1 ] && systemctl is-active --quiet dsrlb; then
			say "dsrlb is running the previous version: systemctl restart dsrlb"
		fi
	fi
fi

if [ "$changed" = 0 ]; then
	say "dsrlb is up to date in ${ROOT:-/}"
else
	say "done; start with: systemctl enable --now dsrlb"
fi
