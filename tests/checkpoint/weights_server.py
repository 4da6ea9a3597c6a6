"""A weights server on the loopback address for the download tests: the standard library's
ThreadingHTTPServer in a thread, serving files from a dict, with the failures a real transfer
meets on demand. Every request is recorded (path, Range header), so tests count downloads."""
import http.server
import socket
import threading
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple


@dataclass
class Behaviour:
    """What the server does for one path.

    cut_after: the next ``cuts`` responses send the headers of the whole file (or of its range)
        but only this many bytes, then close the connection.
    honour_range: answer a Range request with 206 and the rest (else 200 and the whole file).
    hold: an Event every response waits for before sending its body.
    """

    cut_after: Optional[int] = None
    cuts: int = 0
    honour_range: bool = True
    hold: Optional[threading.Event] = None


@dataclass
class WeightsServer:
    files: Dict[str, bytes] = field(default_factory=dict)
    behaviour: Dict[str, Behaviour] = field(default_factory=dict)
    requests: List[Tuple[str, Optional[str]]] = field(default_factory=list)
    url: str = ""

    def count(self, path: str) -> int:
        return sum(1 for p, _ in self.requests if p == path)


def _handler(state: WeightsServer):
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):  # keep the test output clean
            pass

        def do_GET(self):
            path = self.path.split("?", 1)[0]
            rng = self.headers.get("Range")
            state.requests.append((path, rng))
            data = state.files.get(path)
            if data is None:
                self.send_error(404, "Not Found")
                return
            how = state.behaviour.get(path, Behaviour())
            start = 0
            if rng and how.honour_range and rng.startswith("bytes=") and rng.endswith("-"):
                start = int(rng[len("bytes="):-1])
                if start >= len(data):
                    self.send_error(416, "Range Not Satisfiable")
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            else:
                self.send_response(200)
            body = data[start:]
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            if how.hold is not None:
                how.hold.wait(120)
            if how.cuts > 0 and how.cut_after is not None:
                how.cuts -= 1
                self.wfile.write(body[: how.cut_after])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            self.wfile.write(body)

    return Handler


class serve:
    """``with serve() as server:`` a WeightsServer listening on 127.0.0.1 (``server.url``)."""

    def __init__(self):
        self.state = WeightsServer()
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(self.state))
        self.httpd.daemon_threads = True
        self.state.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)

    def __enter__(self) -> WeightsServer:
        self.thread.start()
        return self.state

    def __exit__(self, *exc):
        for how in self.state.behaviour.values():
            if how.hold is not None:
                how.hold.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def refused_url() -> str:
    """An http:// address on the loopback where nothing listens: connecting is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"
