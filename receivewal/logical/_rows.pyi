# Types of the optional C extension receivewal/logical/_rows.c (see its header comment).

def plain_text_line(data: bytes, position: int, keys: tuple[bytes, ...], lead: bytes, lsn: int,
                    xid: int, table: bytes, tail: bytes, /) -> bytes | None: ...
