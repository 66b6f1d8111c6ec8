// Drives ciproxy with the OpenAI Agents SDK for JavaScript (@openai/agents), the way an agent
// author would: an Agent with the hosted code interpreter tool, its model provider pointed at the
// proxy. The Go test in test/e2e starts the proxy in front of a scripted upstream that speaks only
// Chat Completions (its model runs `print(6 * 7)` and then answers) and runs this file with
// node's own test runner.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Agent, OpenAIProvider, Runner, codeInterpreterTool } from '@openai/agents';

const provider = new OpenAIProvider({
  baseURL: process.env.CIPROXY_BASE_URL,
  apiKey: process.env.CIPROXY_API_KEY ?? 'sk-test',
  useResponses: true,
});
const runner = new Runner({ modelProvider: provider, tracingDisabled: true });
const agent = new Agent({
  name: 'Calculator',
  instructions: 'Use python for every calculation.',
  model: process.env.CIPROXY_AGENTS_MODEL ?? 'gpt-4.1',
  tools: [codeInterpreterTool({ container: { type: 'auto' }, includeOutputs: true })],
});
const question = 'What is 6 times 7? Use python.';

// checkRun asserts what the run produced: the model's answer, and the code interpreter call as a
// hosted tool call item carrying the code, the container and the outputs.
function checkRun(result) {
  assert.match(String(result.finalOutput), /42/);
  const calls = result.newItems.filter((item) => item.type === 'tool_call_item');
  assert.equal(calls.length, 1, `one tool call item; got ${result.newItems.map((i) => i.type).join(', ')}`);
  const raw = calls[0].rawItem;
  assert.equal(raw.type, 'hosted_tool_call');
  assert.equal(raw.name, 'code_interpreter_call');
  assert.equal(raw.status, 'completed');
  assert.match(raw.id, /^ci_/);
  assert.equal(raw.providerData.code, 'print(6 * 7)');
  assert.match(raw.providerData.container_id, /^cntr_/);
  assert.deepEqual(raw.providerData.outputs, [{ type: 'logs', logs: '42\n' }]);
  for (const item of result.newItems) {
    assert.notEqual(item.rawItem?.type, 'function_call', 'the stand-in call never reaches the agent');
  }
  assert.equal(result.newItems.filter((item) => item.type === 'message_output_item').length, 1);
  assert.ok(result.rawResponses.at(-1).usage.totalTokens > 0, 'usage is reported');
}

test('an agent with codeInterpreterTool runs the code and answers', async () => {
  const result = await runner.run(agent, question);
  checkRun(result);
});

test('a streamed agent run delivers the code interpreter events and the same items', async () => {
  const stream = await runner.run(agent, question, { stream: true });
  const raw = [];
  const items = [];
  for await (const event of stream) {
    if (event.type === 'raw_model_stream_event' && event.data.type === 'model') raw.push(event.data.event.type);
    if (event.type === 'run_item_stream_event') items.push(event.name);
  }
  await stream.completed;
  assert.equal(stream.error ?? null, null);
  checkRun(stream);
  for (const want of [
    'response.created',
    'response.code_interpreter_call_code.delta',
    'response.code_interpreter_call.interpreting',
    'response.code_interpreter_call.completed',
    'response.output_text.delta',
    'response.completed',
  ]) {
    assert.ok(raw.includes(want), `raw event ${want}; got ${raw.join(', ')}`);
  }
  assert.ok(items.includes('tool_called') && items.includes('message_output_created'), `run items: ${items.join(', ')}`);
});
