"""A stand-in for the node agent's signal endpoint, for the library's tests."""

import http.server
import json
import threading


class AgentStub:
    """AgentStub serves GET /v1/signal with whatever answer the test sets."""

    def __init__(self):
        self.answer = {"action": "none", "reason": "", "deadline": "", "source": ""}
        self.raw = None  # bytes to answer instead of JSON (malformed answers)
        self.requests = []
        self.bodies = []
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                stub.requests.append((self.path, self.headers.get("Authorization")))
                body = stub.raw if stub.raw is not None else json.dumps(stub.answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                stub.requests.append((self.path, self.headers.get("Authorization")))
                n = int(self.headers.get("Content-Length", "0"))
                stub.bodies.append(json.loads(self.rfile.read(n) or b"{}"))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.addr = "127.0.0.1:%d" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
