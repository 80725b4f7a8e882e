"""The program the sandboxed interpreter runs first (``python -I -S -B -c BOOT ...``).

It starts as PID 1 of the sandbox's namespaces and stays there as a small init: it tells
the worker it has started (``R`` on the lifeline, a Unix socket whose other end only the
worker holds), waits for ``G`` (the worker has bounded the mounts' inodes meanwhile), then
forks the snippet's process and waits. When the snippet's process ends, it ends with the
same status; when the lifeline reads end of file (the worker died, however suddenly), it
ends at once. Either way the kernel then kills whatever is left in the namespace: nothing
outlives the worker or the run. The snippet cannot signal it (PID 1 of a namespace gets
no signal from inside it that it has no handler for) nor trace it (seccomp).

The snippet's process runs ``/sandbox/snippet.py`` as ``__main__``, keeps the value of a
last expression, and then writes a report to the file descriptor it was given: one JSON
line (``exit``, ``value``, ``error``), then one line per file found in ``/output``. It
follows no symbolic link, skips what is not a regular file, and stops past the caps it was
given: the worker checks every cap again while reading. Everything there runs beside the
snippet, in the same process, so nothing it reports is trusted: it is untrusted output
like stdout.
"""

from __future__ import annotations

BOOT = r"""
import ast, base64, json, os, select, signal, stat, sys
fd, life, max_files, max_bytes, max_value = (int(a) for a in sys.argv[1:6])
os.set_inheritable(fd, False)
os.set_inheritable(life, False)
os.write(life, b"R")
if os.read(life, 1) != b"G":  # end of file: the worker died before the run began
    os._exit(1)
wake_r, wake_w = os.pipe()
os.set_blocking(wake_w, False)
signal.set_wakeup_fd(wake_w)
signal.signal(signal.SIGCHLD, lambda *_: None)
snippet = os.fork()
if snippet:
    os.close(fd)
    while True:
        if life in select.select([life, wake_r], [], [])[0]:
            os._exit(1)  # the worker is gone: ending here ends the whole namespace
        os.read(wake_r, 4096)
        while True:  # reap every child: orphans of the snippet are re-parented here
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                os._exit(1)
            if pid == 0:
                break
            if pid == snippet:
                code = os.waitstatus_to_exitcode(status)
                os._exit(128 - code if code < 0 else code)
signal.set_wakeup_fd(-1)
signal.signal(signal.SIGCHLD, signal.SIG_DFL)
for unused in (wake_r, wake_w, life):
    os.close(unused)
report = os.fdopen(fd, "w", closefd=True)
sys.argv = ["<snippet>"]
sys.path[:0] = ["/opt/site"]
result = {"exit": 0}
try:
    with open("/sandbox/snippet.py", encoding="utf-8") as f:
        source = f.read()
    tree = ast.parse(source, "<snippet>")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    scope = {"__name__": "__main__", "__builtins__": __builtins__}
    exec(compile(tree, "<snippet>", "exec"), scope)
    if last is not None:
        value = eval(compile(last, "<snippet>", "eval"), scope)
        if value is not None:
            result["value"] = repr(value)[:max_value]
except SystemExit as exc:
    code = exc.code
    result["exit"] = code if isinstance(code, int) else (0 if code is None else 1)
except BaseException as exc:
    line = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<snippet>":
            line = tb.tb_lineno
        tb = tb.tb_next
    if isinstance(exc, SyntaxError) and exc.filename == "<snippet>":
        line = exc.lineno
    result["exit"] = 1
    eno = getattr(exc, "errno", None)
    result["error"] = {
        "type": type(exc).__name__,
        "message": str(exc)[:max_value],
        "line": line,
        "errno": eno if isinstance(eno, int) else None,
    }
for stream in (sys.stdout, sys.stderr):
    try:
        stream.flush()
    except BaseException:
        pass
try:
    report.write(json.dumps(result) + "\n")
    found, total = 0, 0
    pending = ["/output"]
    while pending:
        folder = pending.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                pending.append(entry.path)
                continue
            if not stat.S_ISREG(st.st_mode):
                report.write(json.dumps({"skipped": entry.path[len("/output/"):]}) + "\n")
                continue
            found += 1
            total += st.st_size
            if found > max_files or total > max_bytes:
                report.write(json.dumps({"over": True}) + "\n")
                pending = []
                break
            fd_in = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd_in, "rb") as f:
                data = f.read(max_bytes + 1)
            report.write(json.dumps({
                "name": entry.path[len("/output/"):],
                "data": base64.b64encode(data).decode(),
            }) + "\n")
    report.flush()
except BaseException:
    pass
os._exit(result["exit"] if 0 <= result["exit"] < 256 else 1)
"""
