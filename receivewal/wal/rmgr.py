"""PostgreSQL 15's resource managers: ids, the names pg_waldump prints, and the record kinds
the archive checks need to recognise (pure data).

The ids and names follow ``src/include/access/rmgrlist.h`` of PostgreSQL 15. Ids 128 to 255
belong to custom resource managers (extensions), which pg_waldump names ``custom###``.
"""

from __future__ import annotations

RMGR_NAMES: tuple[str, ...] = (
    "XLOG",  # 0
    "Transaction",  # 1
    "Storage",  # 2
    "CLOG",  # 3
    "Database",  # 4
    "Tablespace",  # 5
    "MultiXact",  # 6
    "RelMap",  # 7
    "Standby",  # 8
    "Heap2",  # 9
    "Heap",  # 10
    "Btree",  # 11
    "Hash",  # 12
    "Gin",  # 13
    "Gist",  # 14
    "Sequence",  # 15
    "SPGist",  # 16
    "BRIN",  # 17
    "CommitTs",  # 18
    "ReplicationOrigin",  # 19
    "Generic",  # 20
    "LogicalMessage",  # 21
)

RM_XLOG_ID = 0
RM_XACT_ID = 1
RM_MAX_BUILTIN_ID = len(RMGR_NAMES) - 1
RM_MIN_CUSTOM_ID = 128
RM_MAX_ID = 255

# xl_info values of the XLOG resource manager (high four bits; the low four are XLR_INFO_MASK).
XLR_RMGR_INFO_MASK = 0xF0
XLOG_CHECKPOINT_SHUTDOWN = 0x00
XLOG_CHECKPOINT_ONLINE = 0x10
XLOG_SWITCH = 0x40
XLOG_END_OF_RECOVERY = 0x90
XLOG_OVERWRITE_CONTRECORD = 0xD0


def rmgr_id_is_valid(rmid: int) -> bool:
    """Whether a record may carry ``rmid`` (built-in or custom range), as PostgreSQL 15 checks."""
    return rmid <= RM_MAX_BUILTIN_ID or RM_MIN_CUSTOM_ID <= rmid <= RM_MAX_ID


#: rmgr_id_is_valid as a table, indexed by xl_rmid (for the scanner's per-record fast path)
RMGR_ID_VALID = bytes(rmgr_id_is_valid(rmid) for rmid in range(RM_MAX_ID + 1))


def rmgr_name(rmid: int) -> str:
    """The name pg_waldump prints for a resource manager id."""
    if rmid <= RM_MAX_BUILTIN_ID:
        return RMGR_NAMES[rmid]
    if rmid >= RM_MIN_CUSTOM_ID:
        return f"custom{rmid:03d}"
    return f"unknown{rmid:03d}"


def rmgr_id(name: str) -> int:
    """The id of a resource manager named as pg_waldump names it; ValueError when unknown."""
    if name in RMGR_NAMES:
        return RMGR_NAMES.index(name)
    if name.startswith("custom") and name[6:].isdigit():
        return int(name[6:])
    raise ValueError(f"unknown resource manager {name!r}")


def is_switch_record(rmid: int, info: int) -> bool:
    """Whether a record is XLOG_SWITCH: the rest of its segment holds no records."""
    return rmid == RM_XLOG_ID and info & XLR_RMGR_INFO_MASK == XLOG_SWITCH
