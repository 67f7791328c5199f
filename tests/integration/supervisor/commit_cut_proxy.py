"""A TCP proxy to PostgreSQL that loses the answer to a COMMIT the server received.

It forwards both ways until armed; then, once the client has sent a
statement starting with ``trigger`` (an ``INSERT INTO runs`` unless told
otherwise) and a COMMIT after it, it forwards that COMMIT, waits
for the server to commit, and cuts both sockets before the answer comes
back: the client's connection is lost with its transaction kept.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from urllib.parse import urlsplit

from herdsman.runtime.store.postgres import PostgresStore

#: The untyped requests a client may send before its startup packet (SSL, GSS).
_PRE_STARTUP = (80877103, 80877104)


class CommitCutProxy:
    """Listens on 127.0.0.1; each connection is forwarded to ``(host, port)``."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.armed = False
        #: The statement (upper case) whose transaction's COMMIT answer is lost.
        self.trigger = b"INSERT INTO RUNS"
        #: Lose the COMMIT itself (the server never gets it), not its answer.
        self.drop_commit = False
        #: Hang up on every new connection at once, as a server that is down.
        self.refuse = False
        self.cut = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        """Stop accepting connections."""
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.refuse:
                _hang_up(client)
                continue
            server = socket.create_connection(self.target)
            # This connection's own: one cut must not silence the
            # connections made after it (a client that connects again).
            cut = threading.Event()
            threading.Thread(target=self._up, args=(client, server, cut), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, cut), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket, cut: threading.Event) -> None:
        """Client to server, reading the protocol's messages to see the COMMIT go by."""
        statements: dict[bytes, bytes] = {}  # prepared statement name -> its SQL
        pending, started, inserted = b"", False, False
        try:
            while data := client.recv(65536):
                pending += data
                while not started and len(pending) >= 8:
                    size = int.from_bytes(pending[:4], "big")
                    code = int.from_bytes(pending[4:8], "big")
                    if len(pending) < size:
                        break
                    pending, started = pending[size:], code not in _PRE_STARTUP
                commit = False
                while started and len(pending) >= 5:
                    kind, size = pending[:1], int.from_bytes(pending[1:5], "big")
                    if len(pending) < size + 1:
                        break
                    body, pending = pending[5 : size + 1], pending[size + 1 :]
                    sql = b""
                    if kind == b"P":  # Parse: name, then the SQL
                        name, rest = body.split(b"\0", 1)
                        statements[name] = sql = rest.split(b"\0", 1)[0]
                    elif kind == b"B":  # Bind: portal, then the statement's name
                        sql = statements.get(body.split(b"\0", 2)[1], b"")
                    elif kind == b"Q":  # a simple query
                        sql = body.rstrip(b"\0")
                    sql = sql.strip(b" ;").upper()
                    inserted = inserted or (self.armed and sql.startswith(self.trigger))
                    commit = commit or sql == b"COMMIT"
                lose = commit and inserted and self.armed
                if not (lose and self.drop_commit):
                    server.sendall(data)
                if lose:
                    self.armed = False
                    cut.set()  # from now on no answer reaches the client
                    self.cut.set()
                    time.sleep(0.5)  # the server commits meanwhile (unless dropped)
                    client.shutdown(socket.SHUT_RDWR)
                    client.close()
                    server.close()
                    return
        except OSError:
            pass
        _hang_up(server)  # the client hung up, or the server went: end both ways

    def _down(self, server: socket.socket, client: socket.socket, cut: threading.Event) -> None:
        try:
            while (data := server.recv(65536)) and not cut.is_set():
                client.sendall(data)
        except OSError:
            pass
        # The server hung up (its session was ended): so does the proxy, as
        # the server's own socket would, or the client waits for ever.
        _hang_up(client)


def _hang_up(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # closed already (a cut)
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def proxied_store(postgres_url: str, proxy: CommitCutProxy) -> PostgresStore:
    """A sole supervisor's PostgreSQL store on ``postgres_url``'s database, through ``proxy``."""
    server = urlsplit(postgres_url)
    proxied = server._replace(netloc=f"{server.username}:{server.password}@127.0.0.1:{proxy.port}")
    return PostgresStore(proxied.geturl(), sole=True)
