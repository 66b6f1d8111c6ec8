// Drives the Daytona double with Daytona's official TypeScript SDK (@daytonaio/sdk, pinned in
// test/node): create, the stateful code interpreter with streamed output, files, a command, a
// session, delete. DAYTONA_API_URL and DAYTONA_API_KEY point it at the double.
const assert = require("node:assert/strict");
const { Daytona } = require("@daytonaio/sdk");

async function main() {
  const daytona = new Daytona({ apiKey: process.env.DAYTONA_API_KEY, apiUrl: process.env.DAYTONA_API_URL });
  const sb = await daytona.create({ language: "python", labels: { suite: "sdk" }, autoDeleteInterval: 0 }, { timeout: 60 });
  try {
    assert.equal(sb.state, "started");

    const chunks = [];
    const r1 = await sb.codeInterpreter.runCode("x = 41\nprint('set')", { onStdout: (m) => chunks.push(m.output) });
    assert.equal(r1.stdout, "set\n");
    assert.deepEqual(chunks, ["set\n"]);
    const r2 = await sb.codeInterpreter.runCode("print(x + 1)");
    assert.equal(r2.stdout, "42\n");
    const r3 = await sb.codeInterpreter.runCode("1/0");
    assert.equal(r3.error.name, "ZeroDivisionError");

    const ctx = await sb.codeInterpreter.createContext("/tmp");
    const r4 = await sb.codeInterpreter.runCode("import os\nprint(os.getcwd())", { context: ctx });
    assert.equal(r4.stdout, "/tmp\n");
    await sb.codeInterpreter.deleteContext(ctx);

    await sb.fs.createFolder("/mnt/data/sdk", "755");
    await sb.fs.uploadFile(Buffer.from("hello sdk"), "/mnt/data/sdk/a.txt");
    const listed = await sb.fs.listFiles("/mnt/data/sdk");
    assert.deepEqual(listed.map((f) => [f.name, f.size, f.isDir]), [["a.txt", 9, false]]);
    const info = await sb.fs.getFileDetails("/mnt/data/sdk/a.txt");
    assert.equal(info.size, 9);
    // (downloadFile of this SDK uses POST /files/bulk-download, a multipart answer that the
    // double does not emulate: the backend downloads with GET /files/download.)
    const cat = await sb.process.executeCommand("cat /mnt/data/sdk/a.txt");
    assert.equal(cat.result, "hello sdk");

    const ex = await sb.process.executeCommand("echo hi; exit 3");
    assert.equal(ex.exitCode, 3);
    assert.equal(ex.result.trim(), "hi");

    await sb.process.createSession("s1");
    const cmd = await sb.process.executeSessionCommand("s1", { command: "echo out; echo err >&2", runAsync: true });
    let out = "", err = "";
    await sb.process.getSessionCommandLogs("s1", cmd.cmdId, (o) => (out += o), (e) => (err += e));
    assert.equal(out, "out\n");
    assert.equal(err, "err\n");
    await sb.process.deleteSession("s1");
    // (daytona.list of this SDK pages with a cursor, {items, nextCursor}, a newer listing than
    // the v0 GET /sandbox?labels= array that the backend calls and the double serves.)
  } finally {
    await sb.delete();
  }
  console.log("ok");
}

main().catch((e) => {
  console.error(e && e.stack ? e.stack : e);
  process.exit(1);
});
