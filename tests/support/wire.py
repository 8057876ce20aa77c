"""The relay's wire seen raw: a stand-in upstream that records what arrives, and a client
that sends one startup-phase packet and reads the whole answer."""

from __future__ import annotations

import socket
import struct
import threading

from receivewal.relay.protocol import SSL_REQUEST, build_error_response


class CapturingUpstream:
    """A listener standing in for the upstream: records what each connection sends first (and
    how many SSLRequests, answered N, came before it) and answers with a FATAL ErrorResponse."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self.received: list[bytes] = []
        self.ssl_requests: list[int] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                packet, asked = self._first_packet(conn)
                if packet is not None:
                    self.received.append(packet)
                    self.ssl_requests.append(asked)
                    conn.sendall(build_error_response("upstream"))

    @staticmethod
    def _first_packet(conn: socket.socket) -> tuple[bytes | None, int]:
        """The first packet that is not an SSLRequest (those are answered N, and counted);
        None when the relay gave up first (sslmode require after our N)."""
        asked = 0
        while len(header := conn.recv(4, socket.MSG_WAITALL)) == 4:
            (length,) = struct.unpack(">I", header)
            packet = header + conn.recv(length - 4, socket.MSG_WAITALL)
            if packet != struct.pack(">II", 8, SSL_REQUEST):
                return packet, asked
            asked += 1
            conn.sendall(b"N")
        return None, asked

    def close(self) -> None:
        self.sock.close()


def raw_startup(port: int, packet: bytes, source: str = "127.0.0.1") -> bytes:
    """Send a startup packet from ``source``; everything the relay answered."""
    with socket.create_connection(("127.0.0.1", port), timeout=30,
                                  source_address=(source, 0)) as sock:
        sock.sendall(packet)
        reply = b""
        while chunk := sock.recv(4096):
            reply += chunk
        return reply
