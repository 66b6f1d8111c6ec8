# The kernel daemon: keeps one kernel.py alive in a sandbox whose engine binds every process it
# starts to one call (agent-sandbox's sandboxd kills a process when its gRPC stream ends), so that
# any proxy replica can run the next cell in the same Python state with a short-lived client.
#
#   kerneld.py start   starts the daemon unless it runs, waits until its kernel is ready, prints
#                      one line {"kernel": <sha256 of kernel.py>, "daemon": <sha256 of this file>}
#   kerneld.py run     relays one request from stdin (a JSON object {"code": "..."}) to the
#                      daemon, starting it if needed, and the kernel's NDJSON replies to stdout up
#                      to and including end_of_execution; exit status 0 once that line came, else 1
#                      with the reason on stderr. SIGINT or SIGTERM interrupts the execution (the
#                      daemon forwards an interrupt to the kernel); a client that dies mid-cell
#                      (SIGKILL, a cut stream) interrupts it too.
#   kerneld.py relay   the same for every request line stdin brings, one after the other, until
#                      stdin ends: a client kept by one proxy replica for one sandbox.
#
# The daemon detaches (double fork, a session of its own, fds 0-2 on /dev/null) so that neither the
# engine's kill of the client's process group nor the end of its pipes reaches it. It starts
# kernel.py from the same directory with the client's working directory, serves its clients (any
# number, from any replica; the kernel runs their requests in turn) on a unix socket
# (CIPROXY_KERNELD_SOCKET, default /tmp/ciproxy-kerneld.sock) and ends when its kernel ends (code that called os._exit); the next client starts a fresh one, and puts a
# stderr message saying the earlier state is gone at the start of its execution's output.

# The client runs once per execution: it imports only what it needs (json, socket and the rest
# cost more than the interpreter's own start); the daemon imports the rest when it starts.
import _socket
import os
import signal
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
KERNEL = os.path.join(HERE, "kernel.py")
SOCKET = os.environ.get("CIPROXY_KERNELD_SOCKET") or "/tmp/ciproxy-kerneld.sock"
END = b'{"type": "end_of_execution"}'
# Left by the first daemon: a client that finds none running but this file knows the kernel ended
# (code that called os._exit, a kill) and says so before its cell's output.
STARTED = SOCKET + ".started"
LOST = (b'{"type": "stderr", "text": "[The Python kernel had ended; this code runs in a new one, '
        b'without the variables and imports of earlier executions.]\\n"}\n')
START_TIMEOUT = 60.0


def _sha256(path):
    import hashlib

    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _connect():
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        s.connect(SOCKET)
        return s
    except OSError:
        s.close()
        return None


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


# --- the daemon ------------------------------------------------------------------------------------


def _daemon(ready_fd):
    """Runs in the detached grandchild: starts the kernel, binds the socket once it is ready,
    reports on ready_fd, and serves until the kernel ends."""
    global fcntl, json, select, socket, subprocess, time
    import fcntl
    import json
    import select
    import socket
    import subprocess
    import time

    lock = os.open(SOCKET + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    existing = _connect()
    if existing is not None:  # another client started one meanwhile
        existing.close()
        _write_all(ready_fd, b"ok\n")
        os._exit(0)
    kernel = subprocess.Popen([sys.executable, KERNEL, "{}"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, close_fds=True, bufsize=0)
    out = kernel.stdout.fileno()
    buf = b""
    deadline = time.monotonic() + START_TIMEOUT
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([out], [], [], left)[0]:
            _write_all(ready_fd, b"the kernel did not get ready\n")
            kernel.kill()
            os._exit(1)
        chunk = os.read(out, 65536)
        if not chunk:
            _write_all(ready_fd, b"the kernel ended before it was ready\n")
            os._exit(1)
        buf += chunk
    first, buf = buf.split(b"\n", 1)
    try:
        ok = json.loads(first).get("type") == "ready"
    except ValueError:
        ok = False
    if not ok:
        _write_all(ready_fd, b"the kernel's first line is not ready\n")
        kernel.kill()
        os._exit(1)
    try:
        os.unlink(SOCKET)
    except FileNotFoundError:
        pass
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o077)
    srv.bind(SOCKET)
    os.umask(old)
    srv.listen(64)
    os.set_inheritable(srv.fileno(), False)
    open(STARTED, "w").close()
    _write_all(ready_fd, b"ok\n")
    os.close(ready_fd)
    fcntl.flock(lock, fcntl.LOCK_UN)
    try:
        _serve(srv, kernel, out, buf)
    finally:
        try:
            if os.stat(SOCKET).st_ino == os.fstat(srv.fileno()).st_ino:
                os.unlink(SOCKET)
        except OSError:
            pass
        kernel.kill()
    os._exit(0)


class _Conn:
    """One client: its socket, the bytes of an unfinished line, its executions in the kernel."""

    def __init__(self, sock):
        self.sock, self.buf, self.ids, self.open = sock, b"", [], True


def _serve(srv, kernel, out, kbuf):
    """Serves every client at once until the kernel ends. The kernel runs requests in the order
    they arrive; its replies go to the client of the execution they belong to (order), each up to
    its end_of_execution. A client's interrupt line interrupts its executions; a client that goes
    away interrupts them too, and their replies are dropped."""
    conns = []
    order = []  # (execution id, client), in the kernel's order
    next_id = 0

    def to_kernel(msg):
        _write_all(kernel.stdin.fileno(), (json.dumps(msg) + "\n").encode())

    def interrupt(c):
        for i in c.ids:
            to_kernel({"id": i, "interrupt": True})

    def gone(c):
        if c.open:
            c.open = False
            interrupt(c)
            c.sock.close()

    while True:
        socks = [srv, out] + [c.sock for c in conns if c.open]
        readable = select.select(socks, [], [])[0]
        if srv in readable:
            sock, _ = srv.accept()
            sock.setblocking(True)
            conns.append(_Conn(sock))
        for c in [c for c in conns if c.open and c.sock in readable]:
            try:
                data = c.sock.recv(1 << 20)
            except OSError:
                data = b""
            if not data:
                gone(c)
                continue
            c.buf += data
            while b"\n" in c.buf:
                line, c.buf = c.buf.split(b"\n", 1)
                try:
                    req = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(req, dict):
                    continue
                if req.get("interrupt"):
                    interrupt(c)
                elif "code" in req:
                    next_id += 1
                    c.ids.append(next_id)
                    order.append((next_id, c))
                    to_kernel({"id": next_id, "code": str(req.get("code", ""))})
        if out in readable:
            chunk = os.read(out, 1 << 20)
            if not chunk:
                for c in conns:
                    if c.open:
                        c.sock.close()
                return  # the kernel ended: its clients see no end_of_execution
            kbuf += chunk
            while b"\n" in kbuf:
                line, kbuf = kbuf.split(b"\n", 1)
                if not order:
                    continue
                exec_id, c = order[0]
                if c.open:
                    try:
                        c.sock.sendall(line + b"\n")
                    except OSError:
                        gone(c)
                if line.strip() == END:
                    order.pop(0)
                    c.ids.remove(exec_id)
        conns = [c for c in conns if c.open or c.ids]


def _start():
    """Returns a connection to a ready daemon, starting one if none answers, and whether an
    earlier daemon had run (and its kernel ended)."""
    s = _connect()
    if s is not None:
        return s, False
    restarted = os.path.exists(STARTED)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.setsid()
            if os.fork() != 0:
                os._exit(0)
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            os.close(devnull)
            os.closerange(3, w)
            os.closerange(w + 1, 1 << 16)
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, signal.SIG_DFL)
            _daemon(w)
        except BaseException:
            pass
        os._exit(1)
    os.close(w)
    os.waitpid(pid, 0)
    answer = b""
    while True:
        chunk = os.read(r, 4096)
        if not chunk:
            break
        answer += chunk
    os.close(r)
    if answer.strip() != b"ok":
        raise RuntimeError("kerneld: " + (answer.decode(errors="replace").strip() or "the daemon did not start"))
    s = _connect()
    if s is None:
        raise RuntimeError("kerneld: the daemon started but does not answer on " + SOCKET)
    return s, restarted


# --- the clients -----------------------------------------------------------------------------------


def _client(relay):
    """The clients. run: one request from stdin (all of it), its replies to stdout up to its
    end_of_execution. relay: request lines from stdin as they come, each one's replies in turn,
    until stdin ends. SIGINT or SIGTERM interrupts what runs."""
    holder = []
    pending = []

    def on_signal(signum, frame):
        if holder:
            try:
                holder[0].sendall(b'{"interrupt": true}\n')
            except OSError:
                pass
        else:
            pending.append(True)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    request = b""
    if not relay:
        request = sys.stdin.buffer.read().strip()
        if not request.startswith(b"{") or b"\n" in request:
            sys.stderr.write("kerneld: the request is not one JSON object on one line\n")
            return 1
    try:
        conn, restarted = _start()
    except RuntimeError as exc:
        sys.stderr.write("%s\n" % exc)
        return 1
    if request:
        conn.sendall(request + b"\n")
    holder.append(conn)
    if pending:
        conn.sendall(b'{"interrupt": true}\n')
    first = restarted
    tail = b""
    inputs = [0, conn] if relay else [conn]
    while True:
        readable = _select(inputs)
        if 0 in readable:
            line = os.read(0, 1 << 20)
            if not line:
                return 0  # the caller is done
            conn.sendall(line)
        if conn not in readable:
            continue
        chunk = conn.recv(1 << 20)
        if not chunk:
            break
        if first:
            # After the number_of_executions line, as a message of this execution.
            nl = chunk.find(b"\n")
            if nl < 0:
                _write_all(1, chunk)
                continue
            _write_all(1, chunk[:nl + 1] + LOST)
            chunk, first = chunk[nl + 1:], False
        _write_all(1, chunk)
        tail = (tail + chunk)[-(len(END) + 2):]
        if not relay and tail.rstrip(b"\n").endswith(END):
            return 0
    sys.stderr.write("kerneld: the kernel ended before the end of the execution\n")
    return 1


def _select(fds):
    import select

    while True:
        try:
            return select.select(fds, [], [])[0]
        except InterruptedError:
            continue


def _start_only():
    try:
        conn, _ = _start()
    except RuntimeError as exc:
        sys.stderr.write("%s\n" % exc)
        return 1
    conn.close()
    print('{"kernel": "%s", "daemon": "%s"}' % (_sha256(KERNEL), _sha256(os.path.abspath(__file__))))
    return 0


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode in ("run", "relay"):
        sys.exit(_client(mode == "relay"))
    if mode == "start":
        sys.exit(_start_only())
    sys.stderr.write("usage: kerneld.py start|run|relay\n")
    sys.exit(2)
