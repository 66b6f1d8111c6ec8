// Drives e2b's official JavaScript SDKs (e2b, @e2b/code-interpreter) against the emulator, whose
// URLs come from E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY. Prints one JSON report on stdout and
// exits non-zero on the first mismatch. Run by TestOfficialSDK.
const assert = require('node:assert/strict')
const { Sandbox } = require('@e2b/code-interpreter')

async function main() {
  const report = {}
  const sbx = await Sandbox.create({ timeoutMs: 120_000, metadata: { suite: 'sdk' } })
  report.sandboxId = sbx.sandboxId

  let ex = await sbx.runCode("print('hi')\n1+1")
  assert.deepEqual(ex.logs.stdout, ['hi\n'])
  assert.equal(ex.text, '2')
  assert.equal(ex.executionCount, 1)
  assert.equal(ex.error, undefined)

  ex = await sbx.runCode('x = 41\nundefined_name')
  assert.equal(ex.error.name, 'NameError')
  ex = await sbx.runCode('x + 1')
  assert.equal(ex.text, '42')

  const stdout = []
  ex = await sbx.runCode("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()", {
    onStdout: (m) => stdout.push(m.line),
  })
  assert.ok(ex.results.some((r) => typeof r.png === 'string' && r.png.length > 100), 'a png result')

  const ctx = await sbx.createCodeContext({ language: 'python' })
  ex = await sbx.runCode('x', { context: ctx })
  assert.equal(ex.error.name, 'NameError', 'a new context has its own state')
  const contexts = await sbx.listCodeContexts()
  assert.ok(contexts.length >= 3)
  await sbx.removeCodeContext(ctx)

  await sbx.files.write('notes/a.txt', 'hello from the sdk')
  assert.equal(await sbx.files.read('notes/a.txt'), 'hello from the sdk')
  ex = await sbx.runCode("open('notes/a.txt').read()")
  assert.equal(ex.text, 'hello from the sdk')

  // The filesystem as the SDK drives it: multipart writes, reads, listings with depth, stat, and
  // what sandboxed code may leave there (a link, a FIFO).
  const big = new Uint8Array(3 * 1024 * 1024 + 5).map((_, i) => (i * 7 + (i >> 10)) & 255)
  await sbx.files.write('/mnt/data/in/big.bin', big.buffer)
  const back = await sbx.files.read('/mnt/data/in/big.bin', { format: 'bytes' })
  assert.equal(Buffer.compare(Buffer.from(back), Buffer.from(big)), 0, 'a 3 MiB file comes back intact')
  await sbx.files.write([{ path: '/mnt/data/in/a.csv', data: 'a,b\n' }, { path: '/mnt/data/in/sub/b.txt', data: 'b' }])
  ex = await sbx.runCode("import os\nos.symlink('/etc/passwd', '/mnt/data/in/link')\nos.mkfifo('/mnt/data/in/fifo')")
  assert.equal(ex.error, undefined)
  let entries = await sbx.files.list('/mnt/data/in')
  // The SDK drops entries of no known type (the FIFO); a link shows its target's type.
  assert.deepEqual(entries.map((e) => e.name).sort(), ['a.csv', 'big.bin', 'link', 'sub'])
  const link = entries.find((e) => e.name === 'link')
  assert.equal(link.symlinkTarget, '/etc/passwd')
  assert.ok(link.permissions.startsWith('L'), link.permissions)
  const bigEntry = entries.find((e) => e.name === 'big.bin')
  assert.equal(bigEntry.type, 'file')
  assert.equal(bigEntry.size, big.length)
  assert.equal(bigEntry.path, '/mnt/data/in/big.bin')
  assert.ok(bigEntry.modifiedTime instanceof Date && !isNaN(bigEntry.modifiedTime))
  assert.equal(entries.find((e) => e.name === 'sub').type, 'dir')
  entries = await sbx.files.list('/mnt/data/in', { depth: 2 })
  assert.ok(entries.some((e) => e.path === '/mnt/data/in/sub/b.txt'), 'depth 2 reaches sub/b.txt')
  assert.equal((await sbx.files.getInfo('/mnt/data/in/link')).symlinkTarget, '/etc/passwd')
  assert.equal(await sbx.files.exists('/mnt/data/in/a.csv'), true)
  assert.equal(await sbx.files.exists('/mnt/data/none'), false)
  assert.equal(await sbx.files.makeDir('/mnt/data/made'), true)
  assert.equal(await sbx.files.makeDir('/mnt/data/made'), false)
  assert.equal((await sbx.files.rename('/mnt/data/in/a.csv', '/mnt/data/made/a.csv')).path, '/mnt/data/made/a.csv')
  await sbx.files.remove('/mnt/data/in/sub')
  assert.equal(await sbx.files.exists('/mnt/data/in/sub/b.txt'), false)
  await assert.rejects(sbx.files.read('/mnt/data/none'), (e) => e.name === 'FileNotFoundError')
  await assert.rejects(sbx.files.list('/mnt/data/none'), (e) => e.name === 'FileNotFoundError')
  report.files = entries.length

  await sbx.setTimeout(300_000)
  const info = await sbx.getInfo()
  assert.equal(info.sandboxId, sbx.sandboxId)
  assert.equal(info.metadata.suite, 'sdk')
  assert.equal(info.state, 'running')

  const page = await Sandbox.list({ query: { metadata: { suite: 'sdk' } } }).nextItems()
  assert.equal(page.length, 1)

  const again = await Sandbox.connect(sbx.sandboxId)
  ex = await again.runCode('x')
  assert.equal(ex.text, '41')

  // Commands, through envd's process service: output streamed to the callbacks, the exit code as
  // CommandExitError, the timeout as TimeoutError, background handles listed and killed.
  const streamed = []
  let exitErr = null
  try {
    await sbx.commands.run('echo hi; echo err >&2; exit 3', { onStdout: (d) => streamed.push(d) })
  } catch (e) {
    exitErr = e
  }
  assert.equal(exitErr && exitErr.name, 'CommandExitError')
  assert.equal(exitErr.exitCode, 3)
  assert.equal(exitErr.stdout, 'hi\n')
  assert.equal(exitErr.stderr, 'err\n')
  assert.deepEqual(streamed, ['hi\n'])
  let cmd = await sbx.commands.run('pwd; printf hé > made_by_shell.txt', { cwd: '/mnt/data' })
  assert.equal(cmd.exitCode, 0)
  assert.equal(cmd.stdout, '/mnt/data\n')
  assert.equal(await sbx.files.read('/mnt/data/made_by_shell.txt'), 'hé')
  await assert.rejects(sbx.commands.run('echo part; sleep 30', { timeoutMs: 1000 }), (e) => e.name === 'TimeoutError')
  const bg = await sbx.commands.run('sleep 30', { background: true })
  assert.ok((await sbx.commands.list()).some((p) => p.pid === bg.pid), 'the background command is listed')
  assert.equal(await bg.kill(), true)
  const killed = await bg.wait().catch((e) => e)
  assert.equal(killed.name, 'CommandExitError')
  assert.equal(await sbx.commands.kill(bg.pid), false)
  report.commandExit = exitErr.exitCode

  assert.equal(await sbx.isRunning(), true)
  assert.equal(await sbx.kill(), true)
  assert.equal(await sbx.isRunning(), false)
  assert.equal(await Sandbox.kill(sbx.sandboxId), false)

  let threw = null
  try {
    await sbx.runCode('1')
  } catch (e) {
    threw = e.name
  }
  assert.ok(threw, 'running in a killed sandbox throws')
  report.killedRunError = threw
  report.ok = true
  console.log(JSON.stringify(report))
}

// process.exit: the SDK leaves its 60 s execution timer running after a failed runCode.
main().then(() => process.exit(0), (e) => {
  console.error(e && e.stack ? e.stack : e)
  process.exit(1)
})
