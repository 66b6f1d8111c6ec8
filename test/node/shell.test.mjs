// Drives ciproxy's shell tool with the official openai npm package and the OpenAI Agents SDK
// (@openai/agents' shellTool), hosted in a container and local. The Go test in test/e2e starts
// the proxy in front of a scripted upstream whose model runs `echo hi from shell` with the shell
// stand-in and then answers with what it saw.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { Agent, OpenAIProvider, Runner, shellTool } from '@openai/agents';

const baseURL = process.env.CIPROXY_BASE_URL;
const apiKey = process.env.CIPROXY_API_KEY ?? 'sk-test';
const model = process.env.CIPROXY_MODEL ?? 'gpt-4.1';
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
const hosted = { type: 'shell', environment: { type: 'container_auto' } };

function checkHosted(output) {
  assert.deepEqual(output.map((i) => i.type), ['shell_call', 'shell_call_output', 'message']);
  const [call, out] = output;
  assert.match(call.id, /^sh_/);
  assert.deepEqual(call.action.commands, ['echo hi from shell']);
  assert.equal(call.environment.type, 'container_reference');
  assert.match(call.environment.container_id, /^cntr_/);
  assert.match(out.id, /^sho_/);
  assert.equal(out.call_id, call.call_id);
  assert.deepEqual(out.output, [{ outcome: { type: 'exit', exit_code: 0 }, stderr: '', stdout: 'hi from shell\n' }]);
}

test('responses.create runs a hosted shell call', async () => {
  const resp = await client.responses.create({ model, input: 'say hi', tools: [hosted] });
  checkHosted(resp.output);
  assert.match(resp.output_text, /hi from shell/);
});

// The stream is read as events: openai 6.x's responses.stream() helper (the last line for Node 20)
// throws on the shell events, which OpenAI itself sends, so a client iterates them.
test('a streamed response delivers the shell events live and the same items', async () => {
  const stream = await client.responses.create({ model, input: 'say hi', tools: [hosted], stream: true });
  const types = [];
  let stdout = '';
  let command = '';
  let final;
  for await (const ev of stream) {
    types.push(ev.type);
    if (ev.type === 'response.shell_call_command.delta') command += ev.delta;
    if (ev.type === 'response.shell_call_output_content.delta') stdout += ev.delta.stdout ?? '';
    if (ev.type === 'response.completed') final = ev.response;
  }
  checkHosted(final.output);
  assert.equal(command, 'echo hi from shell');
  assert.equal(stdout, 'hi from shell\n');
  for (const want of ['response.shell_call_command.added', 'response.shell_call_command.done', 'response.shell_call_output_content.done']) {
    assert.ok(types.includes(want), `${want} in ${types.join(', ')}`);
  }
});

const runner = new Runner({
  modelProvider: new OpenAIProvider({ baseURL, apiKey, useResponses: true }),
  tracingDisabled: true,
});

test('an agent with a hosted shellTool gets the call, its output and the answer', async () => {
  const agent = new Agent({ name: 'Sh', model, instructions: 'Use the shell.', tools: [shellTool({ environment: { type: 'container_auto' } })] });
  const result = await runner.run(agent, 'say hi');
  assert.match(String(result.finalOutput), /hi from shell/);
  const types = result.newItems.map((i) => i.rawItem?.type);
  assert.ok(types.includes('shell_call') && types.includes('shell_call_output'), `items ${types.join(', ')}`);
});

test('an agent with a local shellTool runs the command itself, and the proxy carries its output', async () => {
  const ran = [];
  const shell = {
    run: async (action) => {
      ran.push(...action.commands);
      return { output: action.commands.map(() => ({ stdout: 'hi from the client\n', stderr: '', outcome: { type: 'exit', exitCode: 0 } })) };
    },
  };
  const agent = new Agent({ name: 'Local', model, instructions: 'Use the shell.', tools: [shellTool({ shell })] });
  const result = await runner.run(agent, 'say hi');
  assert.deepEqual(ran, ['echo hi from shell']);
  assert.match(String(result.finalOutput), /hi from the client/);
});
