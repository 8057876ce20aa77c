# Sourced by scripts/demo and scripts/test: makes sure this machine can run receivewal.
# - PostgreSQL server binaries (apt-get install when missing and we are root)
# - Java for the Spark pipeline's tests (apt-get install when missing and we are root)
# - a virtual environment in .venv with receivewal and its test, s3 and spark extras
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"

need_apt=()
pg_bin_dir() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1; }
if [ -z "$(pg_bin_dir)" ] || [ ! -x "$(pg_bin_dir)/initdb" ]; then need_apt+=(postgresql); fi
command -v pgbench >/dev/null 2>&1 || [ -x "$(pg_bin_dir)/pgbench" ] || need_apt+=(postgresql-contrib)
if [ "${RECEIVEWAL_NEEDS_JAVA:-0}" = 1 ] && ! command -v java >/dev/null 2>&1; then
  need_apt+=(default-jre-headless)
fi
# pglogical's output plugin for the logical change stream's tests (tests/test_logical_pglogical.py):
# Debian's package for the server's major version (15 when the server is not installed yet)
pg_major=15
if [ -n "$(pg_bin_dir)" ]; then pg_major="$(basename "$(dirname "$(pg_bin_dir)")")"; fi
if [ ! -e "/usr/lib/postgresql/$pg_major/lib/pglogical_output.so" ]; then
  if [ "$(id -u)" = 0 ]; then
    need_apt+=("postgresql-$pg_major-pglogical")
  else
    echo "setup: postgresql-$pg_major-pglogical is missing: its tests will fail until it is installed" >&2
  fi
fi
command -v chattr >/dev/null 2>&1 || need_apt+=(e2fsprogs)
command -v runuser >/dev/null 2>&1 || need_apt+=(util-linux)
command -v rsync >/dev/null 2>&1 || need_apt+=(rsync)  # barman recover, in tests/test_barman.py
# the age command line: tests/test_encryption.py decrypts what receivewal encrypts with it, and
# the other way round (bench/encryption_throughput.py measures against it)
command -v age >/dev/null 2>&1 || need_apt+=(age)
# bench/slow_link.py (root only: network namespaces and tc) shapes a veth link with ip and tc
if [ "$(id -u)" = 0 ] && ! { command -v ip && command -v tc; } >/dev/null 2>&1; then
  need_apt+=(iproute2)
fi
# As root (CI): the package test (tests/test_package.py) needs dpkg-deb and apt-get, the unit
# test under a real systemd (tests/test_systemd_real.py) needs systemd, unshare and nsenter.
apt_update=0
if [ "$(id -u)" = 0 ]; then
  command -v dpkg-deb >/dev/null 2>&1 || need_apt+=(dpkg)
  [ -x /lib/systemd/systemd ] || need_apt+=(systemd)
  command -v nsenter >/dev/null 2>&1 || need_apt+=(util-linux)
  # PostgreSQL's own TAP test of pg_receivewal runs on the drop-in (tests/test_dropin_tap.py):
  # the installed harness needs prove, IPC::Run, pg_config.h, gzip and lz4, and the test
  # script comes from the installed server's Debian source package (a deb-src entry).
  command -v prove >/dev/null 2>&1 || need_apt+=(perl)
  perl -MIPC::Run -e 1 >/dev/null 2>&1 || need_apt+=(libipc-run-perl)
  [ -e /usr/include/postgresql/pg_config.h ] || need_apt+=(libpq-dev)
  command -v lz4 >/dev/null 2>&1 || need_apt+=(lz4)
  deb_src=/etc/apt/sources.list.d/receivewal-deb-src.sources
  release=$(. /etc/os-release 2>/dev/null && echo "${ID:-}:${VERSION_CODENAME:-}")
  if [ ! -e "$deb_src" ] && [ "${release%%:*}" = debian ] && [ -n "${release#*:}" ]; then
    printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: %s\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
      "${release#*:}" > "$deb_src"
    apt_update=1
  fi
fi

if [ ${#need_apt[@]} -gt 0 ] || [ "$apt_update" = 1 ]; then
  if [ "$(id -u)" = 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    if [ ${#need_apt[@]} -gt 0 ]; then
      echo "setup: installing ${need_apt[*]} with apt-get" >&2
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
  "$PYTHON" -m venv "$VENV"
fi
# Reinstall when the package definition or a C extension's source changes: the editable
# install compiles receivewal/wal/_scan.c, receivewal/replication/_recv.c and
# receivewal/logical/_rows.c in place
# (optional: without a compiler they are skipped and the pure-Python paths run).
stamp="$VENV/.installed-$(cat "$ROOT/pyproject.toml" "$ROOT/setup.py" "$ROOT"/receivewal/wal/_scan.c \
  "$ROOT"/receivewal/replication/_recv.c "$ROOT"/receivewal/logical/_rows.c | sha256sum | cut -c1-16)-${RECEIVEWAL_EXTRAS:-test}"
if [ ! -e "$stamp" ]; then
  "$VENV/bin/pip" install -q --disable-pip-version-check -e "$ROOT[${RECEIVEWAL_EXTRAS:-test}]"
  touch "$stamp"
fi
# tests/support (servers, archives, streams) is importable as `support` in this venv, so that the
# benchmarks in bench/ share the tests' helpers without editing sys.path.
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
[ -e "$site/receivewal-test-support.pth" ] || echo "$ROOT/tests" > "$site/receivewal-test-support.pth"
export PATH="$VENV/bin:$PATH"
