// Drives ciproxy with the official openai npm package, the way a Node user would: only the base URL
// changes. The Go test in test/e2e starts the proxy (with scripted upstreams whose model runs
// `print(6 * 7)` and then answers: one speaking the Responses API, one only Chat Completions) and
// runs this file with node's own test runner, once per model in CIPROXY_MODELS.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const client = new OpenAI({
  baseURL: process.env.CIPROXY_BASE_URL,
  apiKey: process.env.CIPROXY_API_KEY ?? 'sk-test',
  maxRetries: 0,
});
const models = (process.env.CIPROXY_MODELS ?? process.env.CIPROXY_MODEL ?? 'gpt-4.1').split(',');

const requestFor = (model) => ({
  model,
  input: 'What is 6 times 7? Use python.',
  tools: [{ type: 'code_interpreter', container: { type: 'auto' } }],
  include: ['code_interpreter_call.outputs'],
});

function checkResponse(resp, model) {
  assert.match(resp.id, /^resp_/);
  assert.equal(resp.status, 'completed');
  assert.equal(resp.model, model);
  assert.deepEqual(resp.tools.map((t) => t.type), ['code_interpreter']);
  const calls = resp.output.filter((item) => item.type === 'code_interpreter_call');
  assert.equal(calls.length, 1, 'one code_interpreter_call item');
  const call = calls[0];
  assert.match(call.id, /^ci_/);
  assert.match(call.container_id, /^cntr_/);
  assert.equal(call.status, 'completed');
  assert.equal(call.code, 'print(6 * 7)');
  assert.deepEqual(call.outputs, [{ type: 'logs', logs: '42\n' }]);
  assert.ok(!resp.output.some((item) => item.type === 'function_call'), 'the stand-in call never reaches the client');
  assert.match(resp.output_text, /42/);
  assert.ok(resp.usage.total_tokens > 0);
}

for (const model of models) {
  test(`${model}: responses.create runs the code and returns code_interpreter_call items`, async () => {
    const resp = await client.responses.create(requestFor(model));
    checkResponse(resp, model);
  });

  test(`${model}: responses.stream delivers the native events and the same final response`, async () => {
    const stream = client.responses.stream(requestFor(model));
    const types = [];
    let code = '';
    stream.on('event', (event) => {
      types.push(event.type);
      if (event.type === 'response.code_interpreter_call_code.delta') code += event.delta;
    });
    const resp = await stream.finalResponse();
    checkResponse(resp, model);
    assert.equal(code, 'print(6 * 7)');
    const order = [
      'response.created',
      'response.in_progress',
      'response.code_interpreter_call.in_progress',
      'response.code_interpreter_call_code.done',
      'response.code_interpreter_call.interpreting',
      'response.code_interpreter_call.completed',
      'response.output_text.delta',
      'response.completed',
    ];
    let at = -1;
    for (const want of order) {
      const next = types.indexOf(want, at + 1);
      assert.ok(next > at, `event ${want} after position ${at}; got ${types.join(', ')}`);
      at = next;
    }
    assert.equal(types.filter((t) => t === 'response.completed').length, 1);
  });

  test(`${model}: previous_response_id, retrieve, inputItems.list and delete on the proxy's ids`, async () => {
    const first = await client.responses.create(requestFor(model));
    const input = [
      { role: 'user', content: 'Again, please.' },
      { role: 'user', content: [{ type: 'input_text', text: requestFor(model).input }] },
    ];
    const next = await client.responses.create({ ...requestFor(model), input, previous_response_id: first.id });
    checkResponse(next, model);
    assert.equal(next.previous_response_id, first.id);
    const got = await client.responses.retrieve(first.id);
    assert.equal(got.id, first.id);
    assert.equal(got.output_text, first.output_text);
    const items = [];
    for await (const item of client.responses.inputItems.list(next.id, { limit: 1 })) items.push(item);
    // Newest first, one per page: the SDK follows has_more and after.
    assert.deepEqual(items.map((it) => [it.type, it.role, it.content[0].type, it.content[0].text]), [
      ['message', 'user', 'input_text', requestFor(model).input],
      ['message', 'user', 'input_text', 'Again, please.'],
    ]);
    assert.ok(items.every((it) => /^msg_/.test(it.id)), 'every item has an id');
    await client.responses.delete(first.id);
    await assert.rejects(client.responses.retrieve(first.id), (err) => err.status === 404);
  });
}
