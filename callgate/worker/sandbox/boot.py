"""The program the sandboxed interpreter runs first (``python -I -S -B -c BOOT ...``).

It runs the snippet (``/sandbox/snippet.py``) as ``__main__``, keeps the value of a last
expression, and then writes a report to the file descriptor it was given: one JSON line
(``exit``, ``value``, ``error``), then one line per file found in ``/output``. It follows no
symbolic link, skips what is not a regular file, and stops past the caps it was given: the
worker checks every cap again while reading. Everything here runs beside the snippet, in
the same process, so nothing it reports is trusted: it is untrusted output like stdout.
"""

from __future__ import annotations

BOOT = r"""
import ast, base64, json, os, signal, stat, sys
# PID 1 of its namespace ignores signals it has no handler for: end at once at the CPU
# limit's soft warning, as any other process would (the hard limit follows a second later).
signal.signal(signal.SIGXCPU, lambda *_: os._exit(128 + signal.SIGXCPU))
fd, max_files, max_bytes, max_value = (int(a) for a in sys.argv[1:5])
report = os.fdopen(fd, "w", closefd=True)
os.set_inheritable(fd, False)
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
