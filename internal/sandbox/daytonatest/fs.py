# The emulated daemon's file operations, run with python3 in the exec sandbox (files.go). As the
# daemon (root in Daytona's images, Go's os package), they follow links: stat, open, listing.
# argv[1] is the operation, argv[2] its arguments as base64 JSON; the answer is one JSON object
# {"status": <HTTP status>, "body": ..., "message": ...} on stdout.
import base64, datetime, json, os, shutil, stat, sys


def go_mode(m):
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
    if s == "": s = "-"
    for i, c in enumerate("rwxrwxrwx"):
        s += c if m & (1 << (8 - i)) else "-"
    return s


def info(p):
    st = os.stat(p)  # follows links, as the daemon's os.Stat
    t = datetime.datetime.fromtimestamp(st.st_mtime, datetime.timezone.utc)
    import grp, pwd
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        owner = str(st.st_uid)
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    return {"name": os.path.basename(p), "size": st.st_size, "mode": go_mode(st.st_mode),
            "permissions": "%04o" % stat.S_IMODE(st.st_mode), "owner": owner, "group": group,
            "isDir": stat.S_ISDIR(st.st_mode), "modTime": t.strftime("%Y-%m-%d %H:%M:%S.%f +0000 UTC"),
            "modifiedAt": t.isoformat().replace("+00:00", "Z")}


def answer(status, body=None, message=""):
    print(json.dumps({"status": status, "body": body, "message": message}))
    sys.exit(0)


def main():
    op, a = sys.argv[1], json.loads(base64.b64decode(sys.argv[2]))
    try:
        if op == "info":
            answer(200, info(a["path"]))
        if op == "list":
            out = []
            for n in sorted(os.listdir(a["path"])):
                try:
                    out.append(info(os.path.join(a["path"], n)))
                except OSError:
                    pass  # entries that cannot be stat'ed are skipped
            answer(200, out)
        if op == "mkdir":
            os.makedirs(a["path"], int(a.get("mode") or "0755", 8), exist_ok=True)
            answer(201)
        if op == "delete":
            p = a["path"]
            if os.path.isdir(p) and not os.path.islink(p):
                if not a.get("recursive"):
                    answer(400, message="cannot delete directory without recursive flag")
                shutil.rmtree(p)
            else:
                os.lstat(p)
                os.remove(p)
            answer(204)
        if op == "move":
            os.rename(a["source"], a["destination"])
            answer(200)
        if op == "put":  # an upload: the staged bytes into path, parents made, links followed
            os.makedirs(os.path.dirname(a["path"]) or "/", exist_ok=True)
            try:
                shutil.copyfile(a["stage"], a["path"])
            finally:
                os.remove(a["stage"])
            answer(200)
        if op == "get":  # a download: path (links followed) into the stage
            if os.path.isdir(a["path"]):
                answer(400, message="path is a directory")
            shutil.copyfile(a["path"], a["stage"])
            answer(200)
        answer(400, message="unknown operation")
    except FileNotFoundError as e:
        answer(404, message=str(e))
    except PermissionError as e:
        answer(403, message=str(e))
    except OSError as e:
        answer(400, message=str(e))


main()
