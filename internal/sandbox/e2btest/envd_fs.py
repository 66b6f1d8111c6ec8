# envd's file operations, run inside the emulated sandbox's kernel as hidden cells (files.go).
# Each call answers one JSON object: {"status": <HTTP status>, "body": ...} on success, or
# {"status": ..., "code": <Connect code>, "message": ...} on failure. Paths resolve as envd's
# ExpandAndResolve does: "~" and relative paths against the user's home, absolute ones as given.
# Entries are built as envd's GetEntryInfo builds them: from lstat, a link described by its
# target (type, mode) with symlinkTarget set and its own "L" permissions. The directories the
# template lacks (template.py) are missing until an operation makes them, as envd's EnsureDirs
# does: MakeDir, an upload, a move into them.
def __e2b_fs(op, a):
    import base64, builtins, os, pwd, grp, stat, time

    home = os.path.expanduser("~")
    absent = getattr(builtins, "__e2b_absent", set())

    def missing(p):
        p = os.path.normpath(p)
        return any(p == a or p.startswith(a + "/") for a in absent)

    def present(p):
        if missing(p):
            raise FileNotFoundError(2, "No such file or directory", p)

    def resolve(p):
        if p.startswith("~"):
            if len(p) > 1 and p[1] != "/":
                raise __E2bFsError(400, "invalid_argument", "cannot expand user-specific home dir")
            p = home + p[1:]
        if os.path.isabs(p):
            return p
        return os.path.normpath(os.path.join(home, p))

    def ensure_dirs(d):
        parts, cur = [], d
        while cur not in ("/", ""):
            parts.append(cur)
            cur = os.path.dirname(cur)
        for sub in reversed(parts):
            if sub in absent:
                absent.discard(sub)  # made now (the exec sandbox has it already)
                continue
            try:
                os.stat(sub)
            except FileNotFoundError:
                try:
                    os.mkdir(sub, 0o755)
                except FileExistsError:
                    pass

    def go_mode(m):
        # Go's os.FileMode.String for the mode os.Lstat reports.
        s = ""
        if stat.S_ISDIR(m): s += "d"
        if stat.S_ISLNK(m): s += "L"
        if stat.S_ISBLK(m) or stat.S_ISCHR(m): s += "D"
        if stat.S_ISFIFO(m): s += "p"
        if stat.S_ISSOCK(m): s += "S"
        if m & stat.S_ISUID: s += "u"
        if m & stat.S_ISGID: s += "g"
        if stat.S_ISCHR(m): s += "c"
        if m & stat.S_ISVTX: s += "t"
        s = s or "-"
        for i, c in enumerate("rwxrwxrwx"):
            s += c if m & (1 << (8 - i)) else "-"
        return s

    def file_type(m):
        if stat.S_ISREG(m): return "FILE_TYPE_FILE"
        if stat.S_ISDIR(m): return "FILE_TYPE_DIRECTORY"
        return None

    def timestamp(ns):
        # protojson's Timestamp: RFC 3339 in UTC with 0, 3, 6 or 9 fractional digits.
        sec, frac = divmod(ns, 1_000_000_000)
        out = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec))
        if frac % 1_000_000 == 0 and frac:
            out += ".%03d" % (frac // 1_000_000)
        elif frac % 1000 == 0 and frac:
            out += ".%06d" % (frac // 1000)
        elif frac:
            out += ".%09d" % frac
        return out + "Z"

    def name_of(uid, gid):
        try:
            owner = pwd.getpwuid(uid).pw_name
        except KeyError:
            owner = str(uid)
        try:
            group = grp.getgrgid(gid).gr_name
        except KeyError:
            group = str(gid)
        return owner, group

    def entry(p):
        present(p)
        st = os.lstat(p)
        m = st.st_mode
        e = {"name": os.path.basename(p)}
        typ, perm, target = file_type(m), stat.S_IMODE(m) & 0o777, None
        if stat.S_ISLNK(m):
            try:
                target = os.path.realpath(p, strict=True)
            except OSError:
                target = p
            try:
                tm = os.stat(target).st_mode
                typ, perm = file_type(tm), stat.S_IMODE(tm) & 0o777
            except OSError:
                typ, perm = None, 0
        if typ:
            e["type"] = typ
        e["path"] = p
        if st.st_size:
            e["size"] = str(st.st_size)
        if perm:
            e["mode"] = perm
        e["permissions"] = go_mode(m)
        e["owner"], e["group"] = name_of(st.st_uid, st.st_gid)
        e["modifiedTime"] = timestamp(st.st_mtime_ns)
        if target is not None:
            e["symlinkTarget"] = target
        return e

    def ok(body=None):
        return {"status": 200, "body": body}

    if op == "stat":  # GET /files: os.Stat, following links
        p = resolve(a["path"])
        try:
            present(p)
            st = os.stat(p)
        except FileNotFoundError:
            raise __E2bFsError(404, "not_found", "path '%s' does not exist" % p)
        return ok({"path": p, "dir": stat.S_ISDIR(st.st_mode), "size": st.st_size, "mtime": st.st_mtime_ns})
    if op == "read":
        with open(a["path"], "rb") as f:
            f.seek(a["offset"])
            return ok({"data": base64.b64encode(f.read(a["n"])).decode("ascii")})
    def no_space(err):
        # envd's upload answers 507 when the disk is full.
        if err.errno in (28, 122):  # ENOSPC, EDQUOT
            raise __E2bFsError(507, "insufficient_storage", "not enough disk space available: %s" % err)
        raise err

    if op == "create":  # POST /files: parents made, the file truncated
        p = resolve(a["path"])
        ensure_dirs(os.path.dirname(p))
        if os.path.isdir(p):
            raise __E2bFsError(400, "invalid_argument", "path is a directory: %s" % p)
        try:
            open(p, "wb").close()
        except OSError as err:
            no_space(err)
        return ok({"path": p})
    if op == "append":
        try:
            with open(a["path"], "ab") as f:
                f.write(base64.b64decode(a["data"]))
        except OSError as err:
            no_space(err)
        return ok()
    if op == "Stat":
        p = resolve(a.get("path", ""))
        try:
            return ok({"entry": entry(p)})
        except FileNotFoundError as err:
            raise __E2bFsError(404, "not_found", "file not found: %s" % err)
    if op == "ListDir":
        depth = a.get("depth") or 1
        requested = resolve(a.get("path", ""))
        try:
            present(requested)
            resolved = os.path.realpath(requested, strict=True)
        except FileNotFoundError as err:
            raise __E2bFsError(404, "not_found", "path not found: %s" % err)
        except OSError:
            raise __E2bFsError(400, "failed_precondition", "cyclic symlink or chain >255 links at %r" % requested)
        if not os.path.isdir(resolved):
            raise __E2bFsError(400, "invalid_argument", "path is not a directory: %s" % resolved)
        entries = []

        def walk(d, level):
            for n in sorted(os.listdir(d)):
                full = os.path.join(d, n)
                try:
                    e = entry(full)
                except FileNotFoundError:
                    continue
                e["path"] = os.path.join(requested, os.path.relpath(full, resolved))
                entries.append(e)
                if level + 1 < depth and stat.S_ISDIR(os.lstat(full).st_mode):
                    walk(full, level + 1)

        walk(resolved, 0)
        return ok({"entries": entries} if entries else {})
    if op == "MakeDir":
        p = resolve(a.get("path", ""))
        if not missing(p) and os.path.exists(p):
            if os.path.isdir(p):
                raise __E2bFsError(409, "already_exists", "directory already exists: %s" % p)
            raise __E2bFsError(400, "invalid_argument", "path already exists but it is not a directory: %s" % p)
        ensure_dirs(p)
        return ok({"entry": entry(p)})
    if op == "Move":
        src, dst = resolve(a.get("source", "")), resolve(a.get("destination", ""))
        try:
            present(src)
            ensure_dirs(os.path.dirname(dst))
            os.rename(src, dst)
        except FileNotFoundError as err:
            raise __E2bFsError(404, "not_found", "source file not found: %s" % err)
        return ok({"entry": entry(dst)})
    if op == "Remove":
        p = resolve(a.get("path", ""))
        if missing(p):
            return ok({})
        if os.path.isdir(p) and not os.path.islink(p):
            __import__("shutil").rmtree(p)
        elif os.path.lexists(p):
            os.remove(p)
        return ok({})
    raise __E2bFsError(501, "unimplemented", "filesystem.Filesystem/%s is not implemented by the emulator" % op)


class __E2bFsError(Exception):
    def __init__(self, status, code, message):
        self.answer = {"status": status, "code": code, "message": message}


def __e2b_fs_answer(op, args):
    import builtins, json
    builtins.__e2b_fs_busy = True  # envd's own operations pass template.py's hook
    try:
        out = __e2b_fs(op, args)
    except __E2bFsError as err:
        out = err.answer
    finally:
        builtins.__e2b_fs_busy = False
    print(json.dumps(out, separators=(",", ":")))
