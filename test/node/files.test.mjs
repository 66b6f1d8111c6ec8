// The files round trip with the official openai npm package: upload a CSV with the Files API, let
// the code (the scripted model of test/e2e's TestNodeFilesRoundTrip) read it and write a CSV and a
// PNG, get an answer citing both with container_file_citation, download both with the Containers
// API and compare them with the checksums the code printed. JSON and streaming.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import OpenAI, { toFile } from 'openai';

const client = new OpenAI({
  baseURL: process.env.CIPROXY_BASE_URL,
  apiKey: process.env.CIPROXY_API_KEY ?? 'sk-test',
  maxRetries: 0,
});
const model = process.env.CIPROXY_MODEL ?? 'gpt-4.1';
const salesCSV = 'region,amount\nnorth,3\nsouth,7\nnorth,2\n';
const summaryCSV = 'region,total\r\nnorth,5\r\nsouth,7\r\n';

async function upload() {
  const f = await client.files.create({ file: await toFile(Buffer.from(salesCSV), 'sales.csv'), purpose: 'user_data' });
  assert.match(f.id, /^file-/);
  return f;
}

function request(fileID) {
  return {
    model,
    input: 'Sum the amounts per region and chart them.',
    tools: [{ type: 'code_interpreter', container: { type: 'auto', file_ids: [fileID] } }],
    include: ['code_interpreter_call.outputs'],
  };
}

async function checkAnswer(resp) {
  assert.equal(resp.status, 'completed');
  const call = resp.output.find((it) => it.type === 'code_interpreter_call');
  assert.ok(call, 'a code_interpreter_call');
  assert.equal(call.status, 'completed', JSON.stringify(call.outputs));
  const sums = {};
  for (const o of call.outputs) {
    if (o.type !== 'logs') continue;
    for (const line of o.logs.trim().split('\n')) {
      const [name, sum] = line.split(' ');
      sums[name] = sum;
    }
  }
  const images = call.outputs.filter((o) => o.type === 'image');
  assert.equal(images.length, 1, 'the figure is an output image too');
  const figure = Buffer.from(images[0].url.replace(/^data:image\/png;base64,/, ''), 'base64');
  const msg = resp.output.find((it) => it.type === 'message');
  const part = msg.content[0];
  const cites = part.annotations.filter((a) => a.type === 'container_file_citation');
  // The CSV and the PNG the code saved, and the displayed figure: a container file named by its id.
  assert.equal(cites.length, 3, part.text);
  const chars = Array.from(part.text); // indices count characters (code points)
  for (const c of cites) {
    assert.equal(c.container_id, call.container_id);
    assert.match(c.file_id, /^cfile_/);
    assert.equal(chars.slice(c.start_index, c.end_index).join(''), `sandbox:/mnt/data/${c.filename}`);
    const content = await client.containers.files.content.retrieve(c.file_id, { container_id: c.container_id });
    const bytes = Buffer.from(await content.arrayBuffer());
    const want = c.filename === `${c.file_id}.png` ? createHash('sha256').update(figure).digest('hex') : sums[c.filename];
    assert.equal(createHash('sha256').update(bytes).digest('hex'), want, `${c.filename} as downloaded`);
    if (c.filename === 'summary.csv') assert.equal(bytes.toString(), summaryCSV);
    if (c.filename === 'chart.png') assert.ok(bytes.subarray(0, 8).equals(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])));
  }
  return cites;
}

test('responses.create cites the files the code wrote, and the Containers API serves them', async () => {
  const f = await upload();
  await checkAnswer(await client.responses.create(request(f.id)));
});

test('responses.stream announces the citations before output_text.done', async () => {
  const f = await upload();
  const stream = client.responses.stream(request(f.id));
  const announced = [];
  let textDone = false;
  stream.on('event', (event) => {
    if (event.type === 'response.output_text.annotation.added') {
      assert.ok(!textDone, 'annotation after output_text.done');
      announced.push(event);
    }
    if (event.type === 'response.output_text.done') textDone = true;
  });
  const resp = await stream.finalResponse();
  const cites = await checkAnswer(resp);
  assert.deepEqual(announced.map((e) => e.annotation_index), cites.map((_, i) => i));
  assert.deepEqual(announced.map((e) => e.annotation), cites);
});
