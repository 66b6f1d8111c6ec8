# execd's file operations, run as hidden cells in the sandbox's kernel (fs.go). execd runs as root
# and follows links except where noted; paths are absolute here (fs.go expands them). Each call
# prints one line: "\x02" followed by {"status": <HTTP status>, "body": ...} or
# {"status": ..., "code": ..., "message": ...}.
def __osb_fs(op, a):
    import base64, builtins, datetime, grp, json, os, pwd, stat, sys

    builtins._osb_hidden = True

    def owner(st):
        try:
            return pwd.getpwuid(st.st_uid).pw_name
        except KeyError:
            return str(st.st_uid)

    def group(st):
        try:
            return grp.getgrgid(st.st_gid).gr_name
        except KeyError:
            return str(st.st_gid)

    def when(t):
        return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat().replace("+00:00", "Z")

    def kind(st):
        if stat.S_ISLNK(st.st_mode):
            return "symlink"
        if stat.S_ISDIR(st.st_mode):
            return "directory"
        if stat.S_ISREG(st.st_mode):
            return "file"
        return "other"

    def info(p, st):
        return {"path": p, "type": kind(st), "size": st.st_size, "modified_at": when(st.st_mtime),
                "created_at": when(st.st_ctime), "owner": owner(st), "group": group(st),
                "mode": int(oct(stat.S_IMODE(st.st_mode))[2:])}

    def answer(status, body=None, code=None, message=None):
        out = {"status": status}
        if code is None:
            out["body"] = body
        else:
            out["code"], out["message"] = code, message
        sys.stdout.write("\x02" + json.dumps(out) + "\n")
        sys.stdout.flush()

    try:
        if op == "info":
            res = {}
            for p in a["paths"]:
                try:
                    res[p] = info(p, os.lstat(p))
                except FileNotFoundError as exc:
                    return answer(404, code="FILE_NOT_FOUND", message="file not found. %s" % exc)
            return answer(200, res)
        if op == "stat":  # following links, as the download's open does
            st = os.stat(a["path"])
            return answer(200, {"type": kind(st), "size": st.st_size})
        if op == "list":
            root, depth = a["path"], a["depth"]
            st = os.lstat(root)
            if stat.S_ISLNK(st.st_mode):
                return answer(400, code="INVALID_REQUEST_BODY", message="path is a symbolic link, refusing to traverse: %s" % root)
            if not stat.S_ISDIR(st.st_mode):
                return answer(400, code="INVALID_REQUEST_BODY", message="path is not a directory: %s" % root)
            out = []

            def walk(d, level):
                if level > depth:
                    return
                for name in sorted(os.listdir(d)):
                    p = os.path.join(d, name)
                    try:
                        est = os.lstat(p)
                    except OSError:
                        continue
                    out.append(info(p, est))
                    if stat.S_ISDIR(est.st_mode):
                        walk(p, level + 1)

            walk(root, 1)
            return answer(200, out)
        if op == "write":
            p = a["path"]
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "ab" if a["append"] else "wb") as f:
                f.write(base64.b64decode(a["data"]))
            if not a["append"]:
                os.chmod(p, int(str(a["mode"]), 8))
            return answer(200)
        if op == "read":
            with open(a["path"], "rb") as f:
                f.seek(a["offset"])
                return answer(200, base64.b64encode(f.read(a["n"])).decode("ascii"))
        if op == "delete":
            for p in a["paths"]:
                try:
                    st = os.lstat(p)
                except FileNotFoundError:
                    continue
                if stat.S_ISDIR(st.st_mode):
                    return answer(500, code="RUNTIME_ERROR", message="remove %s: is a directory" % p)
                os.remove(p)
            return answer(200)
        if op == "mkdir":
            for p, m in a["dirs"].items():
                os.makedirs(p, mode=int(str(m), 8), exist_ok=True)
            return answer(200)
        if op == "rmdir":
            import shutil
            for p in a["paths"]:
                shutil.rmtree(p, ignore_errors=True)
            return answer(200)
        if op == "mv":
            for m in a["moves"]:
                if not os.path.lexists(m["src"]):
                    return answer(404, code="FILE_NOT_FOUND", message="file not found. %s" % m["src"])
                if os.path.lexists(m["dest"]):
                    return answer(500, code="RUNTIME_ERROR", message="destination already exists: %s" % m["dest"])
                os.makedirs(os.path.dirname(m["dest"]), exist_ok=True)
                os.rename(m["src"], m["dest"])
            return answer(200)
        return answer(404, code="NOT_SUPPORTED", message="unknown operation")
    except FileNotFoundError as exc:
        return answer(404, code="FILE_NOT_FOUND", message="file not found. %s" % exc)
    except OSError as exc:
        return answer(500, code="RUNTIME_ERROR", message=str(exc))
