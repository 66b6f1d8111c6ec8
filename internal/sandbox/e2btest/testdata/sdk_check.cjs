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
