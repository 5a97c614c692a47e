"""etjob.kubexec: the launcher's exec client (WebSocket frames, exit codes).

The end-to-end tests run it for real against the API server (real horovodrun
through /etc/mpi/kubexec.sh); these pin the protocol details."""

import socket
import struct
import unittest

from etjob import kubexec


def frame(opcode, payload, fin=True):
    head = bytes([(0x80 if fin else 0) | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([n])
    elif n < 1 << 16:
        head += bytes([126]) + struct.pack("!H", n)
    else:
        head += bytes([127]) + struct.pack("!Q", n)
    return head + payload


class KubexecTest(unittest.TestCase):
    def test_exit_codes(self):
        self.assertEqual(kubexec.exit_code({"status": "Success"}), 0)
        self.assertEqual(kubexec.exit_code({"status": "Failure", "reason": "NonZeroExitCode",
                                            "details": {"causes": [{"reason": "ExitCode", "message": "75"}]}}), 75)
        self.assertEqual(kubexec.exit_code({"status": "Failure", "message": "container not found"}), kubexec.EXIT_UNREACHABLE)

    def test_frames_join_fragments_answer_pings_and_stop_at_close(self):
        a, b = socket.socketpair()
        self.addCleanup(a.close)
        self.addCleanup(b.close)
        big = b"\x01" + b"x" * 70000
        b.sendall(frame(0x2, b"\x01hel", fin=False) + frame(0x9, b"p") + frame(0x0, b"lo") + frame(0x2, big) + frame(0x8, b"\x03\xe8"))
        f = kubexec.Frames(a)
        self.assertEqual(f.message(), (0x2, b"\x01hello"))
        self.assertEqual(f.message(), (0x2, big))
        self.assertIsNone(f.message())
        # The client answered the ping with a masked pong and the close with a close.
        got = b.recv(100)
        self.assertEqual(got[0], 0x80 | 0xA)
        self.assertTrue(got[1] & 0x80, "client frames must be masked")

    def test_exec_url(self):
        url = kubexec.exec_url("ns", "w-0", "worker", "cd /x ; env A=1 python t.py")
        self.assertTrue(url.startswith("/api/v1/namespaces/ns/pods/w-0/exec?command=%2Fbin%2Fsh&command=-c&command=cd+%2Fx"))
        self.assertIn("container=worker", url)
        self.assertIn("stdout=true", url)


if __name__ == "__main__":
    unittest.main()


class MarkerTest(unittest.TestCase):
    def run_wrapped(self, command):
        import io
        import subprocess
        p = subprocess.run(["/bin/sh", "-c", kubexec.wrap(command)], capture_output=True)
        out = io.BytesIO()
        f = kubexec.StderrFilter(out)
        # Split the stream at every byte: frames may cut anywhere.
        for i in range(len(p.stderr)):
            f.write(p.stderr[i:i + 1])
        f.close()
        return p.returncode, f.code, out.getvalue()

    def test_exit_code_comes_from_the_marker_and_stderr_is_unchanged(self):
        self.assertEqual(self.run_wrapped("echo oops >&2; exit 75"), (75, 75, b"oops\n"))
        self.assertEqual(self.run_wrapped("printf 'no newline' >&2; exit 0"), (0, 0, b"no newline\n"))
        self.assertEqual(self.run_wrapped("printf 'a\\n\\nb\\n' >&2"), (0, 0, b"a\n\nb\n"))
        self.assertEqual(self.run_wrapped("exit 3"), (3, 3, b""))

    def test_a_cut_stream_has_no_code(self):
        import io
        f = kubexec.StderrFilter(io.BytesIO())
        f.write(b"partial line")
        f.close()
        self.assertIsNone(f.code)
