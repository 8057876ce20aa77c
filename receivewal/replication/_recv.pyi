# Types of the optional C extension receivewal/replication/_recv.c (see its header comment).

def bind(libpq_path: str, /) -> None: ...
def read(pgconn_ptr: int, max_bytes: int, max_messages: int, until: int,
         scattered: bool = False, /
         ) -> tuple[int, int, list[memoryview] | list[bytes], int, bytes | int | None,
                    list[int] | None]: ...
