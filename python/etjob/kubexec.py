"""Run a command in a pod through the Kubernetes API: etjob's rsh agent.

horovodrun (and mpirun) start every remote rank with
``$OMPI_MCA_plm_rsh_agent HOST COMMAND``, and horovodrun honours an rsh agent
only at ``/etc/mpi/kubexec.sh`` (horovod/runner/util/remote.py; any other
path means ssh). etjob mounts a two-line ``kubexec.sh`` there (and at
``/etc/edl/kubexec.sh``, et-operator's name) that runs this file with the
launcher image's own Python, so the launcher image needs no kubectl: this is
an exec client of the API's WebSocket protocol (``v5.channel.k8s.io``, or
``v4``), standard library only, that authenticates with the launcher pod's
service-account token and is allowed by the launcher's namespaced Role to
exec into the job's pods and nothing else.

Usage: kubexec.py [--namespace NS] [--container NAME] POD COMMAND...

COMMAND (its words joined by spaces, as ssh does) runs as ``/bin/sh -c
COMMAND`` in the pod's container; its stdout and stderr are copied to ours
as they come (stderr line by line), and we exit with its exit code, which
the remote shell prints after a marker: 255 (ssh's code for an unreachable
host) when the pod could not be reached or the stream ended without it, as
when the pod's node vanished, which the API server reports as a success. The exec'd process inherits the container's own
environment, so a rank learns its own pod's name and node agent from
ETJOB_POD_NAME and ETJOB_AGENT_ADDR there: horovodrun's ``env K=V ...``
prefix copies only what the launcher has, and a horovod launcher carries no
per-pod identity (internal/render).
"""

import argparse
import base64
import json
import os
import signal
import socket
import ssl
import struct
import sys
import urllib.parse

SA = "/var/run/secrets/kubernetes.io/serviceaccount"
PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
STDOUT, STDERR, ERROR = 1, 2, 3
# ssh's exit code when it cannot reach the host.
EXIT_UNREACHABLE = 255


def log(msg):
    sys.stderr.write("kubexec: %s\n" % msg)
    sys.stderr.flush()


# MARKER starts the line the remote shell prints on stderr with the
# command's exit code. A stream that ends without it was cut: the API server
# answers an exec whose node vanished (its kubelet connection broke) with
# "Success", and horovodrun takes a rank that exited 0 for the end of the
# whole job (measured: a hard loss ended the job with "success count == 1").
MARKER = "\x1fetjob-kubexec-exit="


def wrap(command):
    """wrap runs command in a subshell and then prints its exit code after
    MARKER, on a line of its own, on stderr."""
    return "(%s); rc=$?; printf '\\n%s%%d\\n' \"$rc\" >&2; exit $rc" % (command, MARKER)


class StderrFilter:
    """StderrFilter forwards the remote stderr line by line and takes the exit
    marker line (and the line break printed before it) out."""

    def __init__(self, out):
        self.out = out
        self.pending = b""
        self.held_empty = 0
        self.code = None

    def write(self, data):
        self.pending += data
        *lines, self.pending = self.pending.split(b"\n")
        for line in lines:
            self._line(line)

    def _line(self, line):
        text = line.decode("utf-8", "replace")
        if text.startswith(MARKER):
            try:
                self.code = int(text[len(MARKER):])
            except ValueError:
                pass
            self.held_empty = max(self.held_empty - 1, 0)  # the break printed before the marker
            self._flush_empty()
            return
        if line == b"":
            self.held_empty += 1
            return
        self._flush_empty()
        self.out.write(line + b"\n")
        self.out.flush()

    def _flush_empty(self):
        if self.held_empty:
            self.out.write(b"\n" * self.held_empty)
            self.out.flush()
            self.held_empty = 0

    def close(self):
        self._flush_empty()
        if self.pending:
            self.out.write(self.pending)
            self.pending = b""
        self.out.flush()


def exec_url(namespace, pod, container, command):
    query = [("command", "/bin/sh"), ("command", "-c"), ("command", command),
             ("stdout", "true"), ("stderr", "true")]
    if container:
        query.append(("container", container))
    return "/api/v1/namespaces/%s/pods/%s/exec?%s" % (
        urllib.parse.quote(namespace), urllib.parse.quote(pod), urllib.parse.urlencode(query))


def connect(host, port, cafile, timeout):
    """connect opens a TLS connection to the API server."""
    ctx = ssl.create_default_context(cafile=cafile if cafile and os.path.exists(cafile) else None)
    raw = socket.create_connection((host, port), timeout=timeout)
    return ctx.wrap_socket(raw, server_hostname=host)


def handshake(sock, host, path, token):
    """handshake upgrades the request to a WebSocket; it returns the
    subprotocol the server chose, or raises with the server's answer."""
    key = base64.b64encode(os.urandom(16)).decode()
    lines = ["GET %s HTTP/1.1" % path, "Host: %s" % host, "Upgrade: websocket", "Connection: Upgrade",
             "Sec-WebSocket-Key: " + key, "Sec-WebSocket-Version: 13",
             "Sec-WebSocket-Protocol: " + ", ".join(PROTOCOLS)]
    if token:
        lines.append("Authorization: Bearer " + token)
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("the API server closed the connection during the handshake")
        head += chunk
    head, rest = head.split(b"\r\n\r\n", 1)
    status, *fields = head.decode("latin-1").split("\r\n")
    headers = {}
    for f in fields:
        k, _, v = f.partition(":")
        headers[k.strip().lower()] = v.strip()
    if not status.startswith("HTTP/1.1 101"):
        body = rest.decode("utf-8", "replace")
        try:
            body = json.loads(body).get("message", body)
        except ValueError:
            pass
        raise ConnectionError("%s: %s" % (status, body.strip()[:500]))
    return headers.get("sec-websocket-protocol", ""), rest


class Frames:
    """Frames reads WebSocket messages from a socket (RFC 6455: server frames
    are unmasked; fragments are joined; pings are answered)."""

    def __init__(self, sock, buffered=b""):
        self.sock = sock
        self.buf = buffered

    def _read(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _send(self, opcode, payload):
        mask = os.urandom(4)
        n = len(payload)
        if n < 126:
            head = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
        elif n < 1 << 16:
            head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(head + mask + masked)

    def message(self):
        """message returns the next data message's payload, or None at close."""
        data, first_opcode = b"", None
        while True:
            b0, b1 = self._read(2)
            fin, opcode, n = b0 & 0x80, b0 & 0x0F, b1 & 0x7F
            if n == 126:
                n = struct.unpack("!H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack("!Q", self._read(8))[0]
            mask = self._read(4) if b1 & 0x80 else None
            payload = self._read(n)
            if mask:
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            if opcode == 0x8:  # close
                try:
                    self._send(0x8, payload[:2])
                except OSError:
                    pass
                return None
            if opcode == 0x9:  # ping
                self._send(0xA, payload)
                continue
            if opcode == 0xA:  # pong
                continue
            if opcode != 0:
                first_opcode = opcode
            data += payload
            if fin:
                return first_opcode, data


def exit_code(status):
    """exit_code reads the command's exit code from the error channel's
    metav1.Status ("Success", or NonZeroExitCode with an ExitCode cause)."""
    if status.get("status") == "Success":
        return 0
    for cause in (status.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode":
            try:
                return int(cause.get("message"))
            except (TypeError, ValueError):
                break
    log("the exec failed: %s" % status.get("message", status))
    return EXIT_UNREACHABLE


def run(namespace, pod, container, command, host, port, token, cafile, out=None, err=None, timeout=30):
    """run executes command in the pod and returns its exit code."""
    out = out or sys.stdout.buffer
    err = err or sys.stderr.buffer
    errs = StderrFilter(err)
    try:
        sock = connect(host, port, cafile, timeout)
        _, rest = handshake(sock, "%s:%d" % (host, port), exec_url(namespace, pod, container, wrap(command)), token)
    except (OSError, ConnectionError) as e:
        log("exec into pod %s/%s: %s" % (namespace, pod, e))
        return EXIT_UNREACHABLE
    # The command may run for hours: no read timeout after the handshake.
    sock.settimeout(None)
    frames = Frames(sock, rest)
    status = None
    try:
        while True:
            m = frames.message()
            if m is None:
                break
            _, data = m
            if not data:
                continue
            channel, payload = data[0], data[1:]
            if channel == STDOUT:
                out.write(payload)
                out.flush()
            elif channel == STDERR:
                errs.write(payload)
            elif channel == ERROR and payload:
                status = json.loads(payload.decode("utf-8", "replace"))
    except (EOFError, OSError) as e:
        if status is None:
            log("the connection to pod %s/%s ended without an exit status (%s): the pod or its node is gone" % (
                namespace, pod, type(e).__name__))
    finally:
        errs.close()
        try:
            sock.close()
        except OSError:
            pass
    if errs.code is not None:
        return errs.code
    if status is not None and status.get("status") != "Success":
        return exit_code(status)  # the shell itself was killed, or the exec refused
    log("the exec into pod %s/%s ended without the command's exit code: its pod or node is gone" % (namespace, pod))
    return EXIT_UNREACHABLE


def main(argv=None):
    ap = argparse.ArgumentParser(prog="kubexec", description=__doc__.splitlines()[0])
    ap.add_argument("--namespace", default="")
    ap.add_argument("--container", default="")
    ap.add_argument("pod")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    if not args.command:
        ap.error("no COMMAND to run in pod %s" % args.pod)
    namespace = args.namespace
    if not namespace:
        try:
            with open(os.path.join(SA, "namespace")) as f:
                namespace = f.read().strip()
        except OSError:
            namespace = "default"
    host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
    port = int(os.environ.get("KUBERNETES_SERVICE_PORT", "443") or 443)
    if not host:
        log("KUBERNETES_SERVICE_HOST is not set: not in a pod, or the kubelet gave no service environment")
        return EXIT_UNREACHABLE
    try:
        with open(os.path.join(SA, "token")) as f:
            token = f.read().strip()
    except OSError as e:
        log("no service-account token (%s): the launcher pod needs its service account's token mounted" % e)
        return EXIT_UNREACHABLE
    # horovodrun stops a removed host's transport with SIGTERM: go at once.
    signal.signal(signal.SIGTERM, lambda *_: os._exit(128 + signal.SIGTERM))
    return run(namespace, args.pod, args.container, " ".join(args.command), host, port, token,
               os.path.join(SA, "ca.crt"))


if __name__ == "__main__":
    sys.exit(main())
