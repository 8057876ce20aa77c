"""The systemd template unit: notify protocol, restart policy, hardening, secrets kept off argv."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.systemd import parse_unit

from receivewal.daemon.supervisor import EXIT_STAY_DOWN

SYSTEMD = Path(__file__).parent.parent / "systemd"
UNIT = SYSTEMD / "receivewal@.service"
ENV_EXAMPLE = SYSTEMD / "receivewal.env.example"


@pytest.fixture(scope="module")
def unit() -> dict[str, dict[str, list[str]]]:
    return parse_unit(UNIT.read_text())


def one(section: dict[str, list[str]], key: str) -> str:
    values = section[key]
    assert len(values) == 1, f"{key} set {len(values)} times"
    return values[0]


def test_unit_speaks_the_notify_protocol_with_a_watchdog(
    unit: dict[str, dict[str, list[str]]],
) -> None:
    service = unit["Service"]
    assert one(service, "Type") == "notify"
    assert one(service, "NotifyAccess") == "main"
    assert one(service, "WatchdogSec") == "60s"
    assert one(service, "KillSignal") == "SIGTERM"
    assert one(service, "TimeoutStopSec") == "60s"
    assert one(service, "Restart") == "on-failure"


def test_an_error_no_restart_can_fix_stays_down(
    unit: dict[str, dict[str, list[str]]],
) -> None:
    """The supervisor's exit status for an error that a new start cannot fix either is the
    one status the unit does not restart."""
    assert one(unit["Service"], "RestartPreventExitStatus") == str(EXIT_STAY_DOWN)


def test_unit_is_a_template_reading_its_instance_env_file(
    unit: dict[str, dict[str, list[str]]],
) -> None:
    service = unit["Service"]
    assert one(service, "EnvironmentFile") == "/etc/receivewal/%i.env"
    assert one(service, "ExecStart") == "/usr/bin/receivewal ${RECEIVEWAL_COMMAND}"
    assert "RECEIVEWAL_COMMAND=stream" in service["Environment"]  # the env file may say logical
    assert "RECEIVEWAL_DIRECTORY=/var/lib/receivewal/%i" in service["Environment"]
    assert "RECEIVEWAL_WAIT_FOR_SERVER=1" in service["Environment"]
    assert one(service, "ReadWritePaths") == "/var/lib/receivewal/%i"
    assert one(service, "StateDirectory") == "receivewal/%i"
    assert one(unit["Install"], "WantedBy") == "multi-user.target"


def test_password_comes_from_a_credential_passfile_never_argv(
    unit: dict[str, dict[str, list[str]]],
) -> None:
    service = unit["Service"]
    assert one(service, "LoadCredential") == "pgpass:/etc/receivewal/%i.pgpass"
    assert "PGPASSFILE=%d/pgpass" in service["Environment"]
    assert "password" not in one(service, "ExecStart").lower()
    example = ENV_EXAMPLE.read_text()
    settings = [line for line in example.splitlines() if line and not line.startswith("#")]
    assert not any("PASSWORD" in line.upper() for line in settings)


def test_unit_is_hardened(unit: dict[str, dict[str, list[str]]]) -> None:
    service = unit["Service"]
    expected = {
        "User": "receivewal",
        "Group": "receivewal",
        "UMask": "0027",  # group-readable, for restore_command as a member of the group
        "StateDirectoryMode": "0750",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "ProtectKernelTunables": "yes",
        "ProtectKernelModules": "yes",
        "ProtectKernelLogs": "yes",
        "ProtectControlGroups": "yes",
        "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
        "RestrictNamespaces": "yes",
        "LockPersonality": "yes",
        "MemoryDenyWriteExecute": "yes",
        "CapabilityBoundingSet": "",
        "AmbientCapabilities": "",
    }
    assert {key: one(service, key) for key in expected} == expected
    assert service["SystemCallFilter"][0] == "@system-service"


def test_env_example_documents_every_setting_the_unit_relies_on() -> None:
    example = ENV_EXAMPLE.read_text()
    for name in [
        "RECEIVEWAL_DIRECTORY", "RECEIVEWAL_DBNAME", "RECEIVEWAL_SLOT",
        "RECEIVEWAL_METRICS_ADDRESS", "RECEIVEWAL_COMPRESSION", "RECEIVEWAL_STATUS_INTERVAL",
        "RECEIVEWAL_SYNCHRONOUS", "RECEIVEWAL_WAIT_FOR_SERVER", "PGHOST", "PGUSER",
        "RECEIVEWAL_UPLOAD_TO", "RECEIVEWAL_CONFIRM_AFTER", "AWS_ENDPOINT_URL",
        "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "RECEIVEWAL_COMMAND",
        "RECEIVEWAL_PUBLICATION", "RECEIVEWAL_PLUGIN",
    ]:
        assert f"{name}=" in example, name


def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path) -> None:
    """systemd's own checker, on an instance whose ExecStart is this checkout's receivewal."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.fail("systemd-analyze is required for this test (apt-get install systemd)")
    receivewal = Path(sys.executable).parent / "receivewal"
    assert receivewal.exists(), receivewal
    instance = tmp_path / "receivewal@db1.service"
    instance.write_text(UNIT.read_text().replace("/usr/bin/receivewal", str(receivewal)))
    result = subprocess.run(
        [analyze, "verify", str(instance)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "receivewal@db1.service" not in result.stderr, result.stderr


BACKUP_SERVICE = SYSTEMD / "receivewal-backup@.service"
BACKUP_TIMER = SYSTEMD / "receivewal-backup@.timer"


def test_the_backup_service_is_a_oneshot_of_the_same_instance_and_user() -> None:
    """receivewal-backup@db1 reads db1's env file and passfile, runs receivewal backup as
    the stream daemon's user with its hardening, after the daemon, into its archive."""
    stream, backup = parse_unit(UNIT.read_text()), parse_unit(BACKUP_SERVICE.read_text())
    service = backup["Service"]
    assert one(service, "Type") == "oneshot"
    assert one(service, "ExecStart") == "/usr/bin/receivewal backup"
    assert "receivewal@%i.service" in one(backup["Unit"], "After").split()
    for key in ("EnvironmentFile", "LoadCredential", "User", "Group", "UMask",
                "ReadWritePaths", "StateDirectory", "NoNewPrivileges", "ProtectSystem",
                "ProtectHome", "PrivateTmp", "RestrictAddressFamilies", "SystemCallFilter",
                "MemoryDenyWriteExecute", "CapabilityBoundingSet"):
        assert service[key] == stream["Service"][key], key
    assert "RECEIVEWAL_DIRECTORY=/var/lib/receivewal/%i" in service["Environment"]
    assert "PGPASSFILE=%d/pgpass" in service["Environment"]
    example = ENV_EXAMPLE.read_text()
    for name in ("RECEIVEWAL_BACKUP_DIRECTORY", "RECEIVEWAL_BACKUP_COMPRESS",
                 "RECEIVEWAL_BACKUP_MAX_RATE", "RECEIVEWAL_WAL_WAIT"):
        assert f"{name}=" in example, name


def test_the_backup_timer_runs_nightly_and_catches_up() -> None:
    timer = parse_unit(BACKUP_TIMER.read_text())
    assert one(timer["Timer"], "OnCalendar") == "*-*-* 02:00:00"
    assert one(timer["Timer"], "Persistent") == "true"
    assert one(timer["Install"], "WantedBy") == "timers.target"


def test_systemd_analyze_verify_accepts_the_backup_units(tmp_path: Path) -> None:
    """systemd's own checker, on the timer and its service (ExecStart this checkout's)."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.fail("systemd-analyze is required for this test (apt-get install systemd)")
    receivewal = Path(sys.executable).parent / "receivewal"
    service = tmp_path / "receivewal-backup@db1.service"
    service.write_text(BACKUP_SERVICE.read_text().replace("/usr/bin/receivewal",
                                                          str(receivewal)))
    timer = tmp_path / "receivewal-backup@db1.timer"
    timer.write_text(BACKUP_TIMER.read_text())
    result = subprocess.run([analyze, "verify", str(timer), str(service)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "receivewal-backup@db1" not in result.stderr, result.stderr


APPLY_SERVICE = SYSTEMD / "receivewal-apply@.service"


def test_the_apply_service_follows_the_change_log_and_stays_down_on_a_conflict() -> None:
    """receivewal-apply@db1 applies db1's change log with --follow, as the daemon's user with
    its hardening, the target's password from a credential passfile; exit 4 (a conflict, a
    gap) is not restarted, anything else is."""
    stream, apply = parse_unit(UNIT.read_text()), parse_unit(APPLY_SERVICE.read_text())
    service = apply["Service"]
    assert one(service, "ExecStart") == "/usr/bin/receivewal apply --follow"
    assert one(service, "EnvironmentFile") == "/etc/receivewal/apply-%i.env"
    assert "RECEIVEWAL_DIRECTORY=/var/lib/receivewal/%i" in service["Environment"]
    assert one(service, "LoadCredential") == "pgpass:/etc/receivewal/apply-%i.pgpass"
    assert "PGPASSFILE=%d/pgpass" in service["Environment"]
    assert one(service, "Restart") == "on-failure"
    assert one(service, "RestartPreventExitStatus") == str(EXIT_STAY_DOWN)
    assert "receivewal@%i.service" in one(apply["Unit"], "After")
    for key in ("User", "Group", "NoNewPrivileges", "ProtectSystem", "ProtectHome",
                "PrivateTmp", "CapabilityBoundingSet", "SystemCallArchitectures"):
        assert service[key] == stream["Service"][key], key


def test_systemd_analyze_verify_accepts_the_apply_unit(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.fail("systemd-analyze is required for this test (apt-get install systemd)")
    receivewal = Path(sys.executable).parent / "receivewal"
    instance = tmp_path / "receivewal-apply@db1.service"
    instance.write_text(APPLY_SERVICE.read_text().replace("/usr/bin/receivewal", str(receivewal)))
    result = subprocess.run([analyze, "verify", str(instance)], capture_output=True, text=True,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert "receivewal-apply@db1.service" not in result.stderr, result.stderr

