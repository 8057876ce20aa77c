# Sourced by scripts/demo and scripts/test: makes sure this machine can run receivewal, and says
# what it installs (each Debian package with what it is for) before it installs it.
# RECEIVEWAL_SETUP=test (scripts/test, the default): everything the test suite uses
# - PostgreSQL server binaries, pgbench, pglogical, rsync, age... (apt-get when missing and root)
# - Java for the Spark pipeline's tests (apt-get install when missing and we are root)
# - a virtual environment in .venv with receivewal and its test, s3, delta and spark extras
# RECEIVEWAL_SETUP=demo (scripts/demo): only what the demo runs: the PostgreSQL server
# binaries, pgbench, runuser as root, and .venv with receivewal alone (no extras).
# RECEIVEWAL_SETUP_PLAN=1: print what would be installed, install nothing, and exit.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
SETUP_MODE="${RECEIVEWAL_SETUP:-test}"
EXTRAS="${RECEIVEWAL_EXTRAS-test}"  # pip's extras of receivewal ("" for none)

need_apt=()
need_why=()
# need PACKAGE WHY: install PACKAGE (for WHY) with apt-get
need() { need_apt+=("$1"); need_why+=("$1: $2"); }
pg_bin_dir() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1; }
if [ -z "$(pg_bin_dir)" ] || [ ! -x "$(pg_bin_dir)/initdb" ]; then
  need postgresql "the PostgreSQL server (initdb, pg_ctl) that receivewal streams from"
fi
command -v pgbench >/dev/null 2>&1 || [ -x "$(pg_bin_dir)/pgbench" ] || \
  need postgresql-contrib "pgbench, which writes the WAL"
if [ "$(id -u)" = 0 ]; then
  command -v runuser >/dev/null 2>&1 || need util-linux "runuser: the server runs as postgres"
fi
apt_update=0
if [ "$SETUP_MODE" != demo ]; then
if [ "${RECEIVEWAL_NEEDS_JAVA:-0}" = 1 ] && ! command -v java >/dev/null 2>&1; then
  need default-jre-headless "Java for the Spark tests (receivewal analyze)"
fi
# pglogical's output plugin for the logical change stream's tests (tests/test_logical_pglogical.py):
# Debian's package for the server's major version (15 when the server is not installed yet)
pg_major=15
if [ -n "$(pg_bin_dir)" ]; then pg_major="$(basename "$(dirname "$(pg_bin_dir)")")"; fi
if [ ! -e "/usr/lib/postgresql/$pg_major/lib/pglogical_output.so" ]; then
  if [ "$(id -u)" = 0 ]; then
    need "postgresql-$pg_major-pglogical" "pglogical_output, for the tests of receivewal logical"
  else
    echo "setup: postgresql-$pg_major-pglogical is missing: its tests will fail until it is installed" >&2
  fi
fi
command -v chattr >/dev/null 2>&1 || need e2fsprogs "chattr, for the tests of a read-only file"
command -v runuser >/dev/null 2>&1 || need util-linux "runuser, for the tests as the postgres user"
command -v rsync >/dev/null 2>&1 || need rsync "barman recover, in tests/test_barman.py"
# the age command line: tests/test_encryption.py decrypts what receivewal encrypts with it, and
# the other way round (bench/encryption_throughput.py measures against it)
command -v age >/dev/null 2>&1 || need age "the age command line, for the encryption tests"
# bench/slow_link.py (root only: network namespaces and tc) shapes a veth link with ip and tc
if [ "$(id -u)" = 0 ] && ! { command -v ip && command -v tc; } >/dev/null 2>&1; then
  need iproute2 "ip and tc, for bench/slow_link.py"
fi
# As root (CI): the package test (tests/test_package.py) needs dpkg-deb and apt-get, the unit
# test under a real systemd (tests/test_systemd_real.py) needs systemd, unshare and nsenter.
if [ "$(id -u)" = 0 ]; then
  command -v dpkg-deb >/dev/null 2>&1 || need dpkg "dpkg-deb, for the package test"
  [ -x /lib/systemd/systemd ] || need systemd "a private systemd, for the unit's tests"
  command -v nsenter >/dev/null 2>&1 || need util-linux "nsenter, for the unit's tests"
  # PostgreSQL's own TAP test of pg_receivewal runs on the drop-in (tests/test_dropin_tap.py):
  # the installed harness needs prove, IPC::Run, pg_config.h, gzip and lz4, and the test
  # script comes from the installed server's Debian source package (a deb-src entry).
  command -v prove >/dev/null 2>&1 || need perl "prove, for PostgreSQL's TAP test of the drop-in"
  perl -MIPC::Run -e 1 >/dev/null 2>&1 || need libipc-run-perl "IPC::Run, for the TAP test"
  [ -e /usr/include/postgresql/pg_config.h ] || need libpq-dev "pg_config.h, for the TAP test"
  command -v lz4 >/dev/null 2>&1 || need lz4 "lz4, for the TAP test"
  deb_src=/etc/apt/sources.list.d/receivewal-deb-src.sources
  release=$(. /etc/os-release 2>/dev/null && echo "${ID:-}:${VERSION_CODENAME:-}")
  if [ ! -e "$deb_src" ] && [ "${release%%:*}" = debian ] && [ -n "${release#*:}" ]; then
    echo "setup: adding the apt source $deb_src (deb-src, Debian ${release#*:}): the TAP test's" \
      "script comes from the server's source package" >&2
    if [ "${RECEIVEWAL_SETUP_PLAN:-0}" != 1 ]; then
      printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: %s\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
        "${release#*:}" > "$deb_src"
    fi
    apt_update=1
  fi
fi
fi

if [ "${RECEIVEWAL_SETUP_PLAN:-0}" = 1 ]; then
  echo "setup ($SETUP_MODE): apt-get would install: ${need_apt[*]:-nothing}"
  for line in "${need_why[@]}"; do echo "  $line"; done
  echo "setup ($SETUP_MODE): pip would install into $VENV: receivewal${EXTRAS:+[$EXTRAS]} and its dependencies"
  exit 0
fi

if [ ${#need_apt[@]} -gt 0 ] || [ "$apt_update" = 1 ]; then
  if [ "$(id -u)" = 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    if [ ${#need_apt[@]} -gt 0 ]; then
      echo "setup: installing with apt-get:" >&2
      for line in "${need_why[@]}"; do echo "  $line" >&2; done
      apt-get install -y -qq "${need_apt[@]}" >/dev/null
    fi
    # Debian's postgresql package starts a cluster; receivewal's tests start their own.
    command -v pg_ctlcluster >/dev/null 2>&1 && pg_lsclusters -h 2>/dev/null | while read -r ver name _; do
      pg_ctlcluster "$ver" "$name" stop 2>/dev/null || true; done
  else
    echo "setup: missing ${need_apt[*]}: install them (e.g. sudo apt-get install ${need_apt[*]}) and run again" >&2
    exit 1
  fi
fi
export PG_BIN="$(pg_bin_dir)"

PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "setup: receivewal needs Python 3.11 or newer ($PYTHON is $("$PYTHON" --version 2>&1))" >&2
  exit 1
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating the virtual environment $VENV" >&2
  "$PYTHON" -m venv "$VENV"
fi
# Reinstall when the package definition or a C extension's source changes: the editable
# install compiles receivewal/wal/_scan.c, receivewal/replication/_recv.c and
# receivewal/logical/_rows.c in place
# (optional: without a compiler they are skipped and the pure-Python paths run).
stamp="$VENV/.installed-$(cat "$ROOT/pyproject.toml" "$ROOT/setup.py" "$ROOT"/receivewal/wal/_scan.c \
  "$ROOT"/receivewal/replication/_recv.c "$ROOT"/receivewal/logical/_rows.c | sha256sum | cut -c1-16)-$EXTRAS"
if [ "$SETUP_MODE" = demo ] && compgen -G "${stamp%-*}-*" >/dev/null; then
  :  # the demo runs with any extras already installed for this source
elif [ ! -e "$stamp" ]; then
  echo "setup: pip installs receivewal${EXTRAS:+[$EXTRAS]} and its dependencies into $VENV" >&2
  "$VENV/bin/pip" install -q --disable-pip-version-check -e "$ROOT${EXTRAS:+[$EXTRAS]}"
  touch "$stamp"
fi
# tests/support (servers, archives, streams) is importable as `support` in this venv, so that the
# benchmarks in bench/ share the tests' helpers without editing sys.path.
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
[ -e "$site/receivewal-test-support.pth" ] || echo "$ROOT/tests" > "$site/receivewal-test-support.pth"
export PATH="$VENV/bin:$PATH"
