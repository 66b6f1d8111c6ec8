// Drives the official OpenSandbox JS SDK (@alibaba-group/opensandbox, pinned in sdk/package.json)
// against the double, whose lifecycle base comes from OSB_API_BASE and OSB_API_KEY. Prints one JSON
// report on stdout and exits non-zero on the first mismatch. Run by TestOfficialSDK.
import assert from 'node:assert/strict'
import { ConnectionConfig, Sandbox } from '@alibaba-group/opensandbox'

const token = 'sdk-check-execd-token-0123456789'
const connectionConfig = new ConnectionConfig({
  domain: process.env.OSB_API_BASE,
  apiKey: process.env.OSB_API_KEY,
  // The double's execd wants the sandbox's token; the SDK sends its headers everywhere.
  headers: { 'X-EXECD-ACCESS-TOKEN': token },
})

const report = {}
const sbx = await Sandbox.create({
  connectionConfig,
  image: 'opensandbox/code-interpreter:v1.1.0',
  entrypoint: ['/opt/code-interpreter/code-interpreter.sh'],
  env: { EXECD_ACCESS_TOKEN: token },
  metadata: { suite: 'sdk' },
  timeoutSeconds: 120,
  readyTimeoutSeconds: 30,
})
report.id = sbx.id
const info = await sbx.getInfo()
assert.equal(info.status.state, 'Running')
assert.equal(info.metadata.suite, 'sdk')
assert.ok(info.expiresAt, 'an expiry')

let ex = await sbx.commands.run('echo hi; echo oops >&2')
assert.deepEqual(ex.logs.stdout.map((m) => m.text), ['hi'])
assert.deepEqual(ex.logs.stderr.map((m) => m.text), ['oops'])
assert.equal(ex.exitCode, 0)
ex = await sbx.commands.run('exit 3')
assert.equal(ex.exitCode, 3)
assert.equal(ex.error.name, 'CommandExecError')

await sbx.files.createDirectories([{ path: '/mnt/data', mode: 755 }])
await sbx.files.writeFiles([{ path: '/mnt/data/a.txt', data: 'hello file', mode: 644 }])
assert.equal(await sbx.files.readFile('/mnt/data/a.txt'), 'hello file')
const infos = await sbx.files.getFileInfo(['/mnt/data/a.txt'])
assert.equal(infos['/mnt/data/a.txt'].size, 10)
assert.equal(infos['/mnt/data/a.txt'].type, 'file')
const listed = await sbx.files.listDirectory({ path: '/mnt/data', depth: 1 })
assert.deepEqual(listed.map((f) => f.path), ['/mnt/data/a.txt'])
await sbx.files.moveFiles([{ src: '/mnt/data/a.txt', dest: '/mnt/data/b.txt' }])
await sbx.files.deleteFiles(['/mnt/data/b.txt'])
assert.deepEqual(await sbx.files.listDirectory({ path: '/mnt/data', depth: 1 }), [])

const renewed = await sbx.renew(300)
assert.ok(renewed.expiresAt, 'renewed')
await sbx.kill()
await sbx.close()
report.ok = true
console.log(JSON.stringify(report))
