"""A TCP proxy on loopback that can be told to stall (new and open connections then get no answer) or to cut
(open connections are closed and new ones closed at once, until it is mended).

It stands in front of a real server (moto's S3, Postgres) to reproduce a store that accepts connections and
never answers, the fault that must not freeze training, or a database that cannot be reached for a while.
"""

from __future__ import annotations

import socket
import threading


class StallingProxy:
    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.stalled = threading.Event()
        self.cutting = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, name="stalling-proxy", daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def port(self) -> int:
        return self._listener.getsockname()[1]

    def stall(self) -> None:
        """From now on nothing reaches the client: bytes sent either way are swallowed."""
        self.stalled.set()

    def cut(self) -> None:
        """Close every open connection; from now on a new one is closed as soon as it is accepted."""
        self.cutting.set()
        for sock in list(self._sockets):
            try:
                sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            except OSError:
                pass
        self._sockets.clear()

    def mend(self) -> None:
        """New connections reach the server again."""
        self.cutting.clear()

    def close(self) -> None:
        self._closed = True
        for sock in [self._listener, *self._sockets]:
            try:
                sock.close()
            except OSError:
                pass

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.cutting.is_set():
                client.close()
                continue
            self._sockets.append(client)
            if self.stalled.is_set():
                threading.Thread(target=self._swallow, args=(client,), daemon=True).start()
                continue
            server = socket.create_connection(self.upstream)
            self._sockets.append(server)
            threading.Thread(target=self._pipe, args=(client, server), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client), daemon=True).start()

    def _pipe(self, source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                if not self.stalled.is_set():
                    target.sendall(data)
        except OSError:
            pass

    @staticmethod
    def _swallow(sock: socket.socket) -> None:
        try:
            while sock.recv(65536):
                pass
        except OSError:
            pass
