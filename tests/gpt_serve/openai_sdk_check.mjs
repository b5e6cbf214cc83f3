// Drives gpt_serve with the official OpenAI Node SDK (npm openai), as a user
// would: models, completions and chat, streamed and not, n > 1, stop,
// logprobs, an adapter by name, the SDK's chat stream helper, and the
// errors it must raise (unknown model, wrong key). Exits 1 on the first
// failed check, an unexpected throw, or anything the SDK or Node warns.
//
// Environment: OPENAI_SDK_DIR (holds node_modules/openai, as
// scripts/setup.sh installs it), GPT_SERVE_URL (http://127.0.0.1:PORT/v1),
// GPT_SERVE_KEY, GPT_SERVE_ADAPTER (a served LoRA adapter's model id).
import { createRequire } from 'node:module';
import assert from 'node:assert/strict';

const require = createRequire(`${process.env.OPENAI_SDK_DIR}/`);
const OpenAI = require('openai');

// Any warning fails the run: the SDK's logger, console, or Node's.
const warnings = [];
for (const level of ['warn', 'error']) {
  const original = console[level];
  console[level] = (...args) => {
    warnings.push(`console.${level}: ${args.join(' ')}`);
    original(...args);
  };
}
process.on('warning', (w) => warnings.push(`node warning: ${w.name}: ${w.message}`));
const logger = {
  error: (...args) => warnings.push(`sdk error: ${args.join(' ')}`),
  warn: (...args) => warnings.push(`sdk warn: ${args.join(' ')}`),
  info: () => {},
  debug: () => {},
};

const options = { baseURL: process.env.GPT_SERVE_URL, maxRetries: 0, timeout: 60000, logger };
const client = new OpenAI({ ...options, apiKey: process.env.GPT_SERVE_KEY });
const adapter = process.env.GPT_SERVE_ADAPTER;
const finishReasons = ['stop', 'length'];

function checkUsage(usage) {
  for (const key of ['prompt_tokens', 'completion_tokens', 'total_tokens']) {
    assert.equal(typeof usage[key], 'number', key);
  }
  assert.equal(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens);
}

async function models() {
  const ids = [];
  for await (const model of client.models.list()) {
    assert.equal(model.object, 'model');
    assert.equal(typeof model.created, 'number');
    ids.push(model.id);
  }
  assert.deepEqual(ids, ['gpt', adapter]);
  assert.equal((await client.models.retrieve(adapter)).id, adapter);
}

async function completions() {
  const request = { model: 'gpt', prompt: 'Once upon', max_tokens: 12, temperature: 0, seed: 3,
                    user: 'sdk-test' };
  const plain = await client.completions.create({ ...request, n: 2, logprobs: 2 });
  assert.equal(plain.object, 'text_completion');
  assert.equal(typeof plain.id, 'string');
  assert.equal(plain.choices.length, 2);
  for (const [i, choice] of plain.choices.entries()) {
    assert.equal(choice.index, i);
    assert.equal(typeof choice.text, 'string');
    assert.ok(finishReasons.includes(choice.finish_reason), choice.finish_reason);
    const lp = choice.logprobs;
    assert.equal(lp.tokens.length, lp.token_logprobs.length);
    assert.equal(lp.tokens.length, lp.top_logprobs.length);
    assert.ok(lp.token_logprobs.every((x) => typeof x === 'number' && x <= 0));
  }
  assert.equal(plain.choices[0].text, plain.choices[1].text);  // greedy
  checkUsage(plain.usage);

  // Streamed: the same text, and the usage chunk last.
  let text = '';
  let usage = null;
  const stream = await client.completions.create({
    ...request, stream: true, stream_options: { include_usage: true } });
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'text_completion');
    if (chunk.choices.length > 0) text += chunk.choices[0].text;
    if (chunk.usage) usage = chunk.usage;
  }
  assert.equal(text, plain.choices[0].text);
  checkUsage(usage);

  // A stop string out of the middle of the text ends it there, left out
  // (letters only, by logit_bias: the random model's other bytes are seldom
  // valid UTF-8).
  const letters = {};
  for (let c = 97; c <= 122; ++c) letters[String(c)] = 100;
  const lettered = { ...request, logit_bias: letters };
  const whole = (await client.completions.create(lettered)).choices[0].text;
  assert.match(whole, /^[a-z]{12}$/);
  const stop = whole.slice(5, 8);
  const stopped = await client.completions.create({ ...lettered, stop: [stop, 'never'] });
  assert.equal(stopped.choices[0].text, whole.slice(0, whole.indexOf(stop)));
  assert.equal(stopped.choices[0].finish_reason, 'stop');

  // The adapter by name, and prompt lists.
  const adapted = await client.completions.create({ ...request, model: adapter,
                                                    prompt: ['Once upon', 'A time'] });
  assert.equal(adapted.model, adapter);
  assert.equal(adapted.choices.length, 2);
  assert.notEqual(adapted.choices[0].text, plain.choices[0].text);
}

async function chat() {
  const messages = [{ role: 'system', content: 'You are terse.' },
                    { role: 'user', content: 'Hello there' }];
  const request = { model: 'gpt', messages, max_tokens: 10, temperature: 0, seed: 5 };
  const plain = await client.chat.completions.create({ ...request, n: 2, logprobs: true,
                                                       top_logprobs: 2 });
  assert.equal(plain.object, 'chat.completion');
  assert.equal(plain.choices.length, 2);
  for (const choice of plain.choices) {
    assert.equal(choice.message.role, 'assistant');
    assert.equal(typeof choice.message.content, 'string');
    assert.ok(finishReasons.includes(choice.finish_reason), choice.finish_reason);
    for (const entry of choice.logprobs.content) {
      assert.equal(typeof entry.token, 'string');
      assert.ok(Array.isArray(entry.bytes));
      assert.equal(entry.top_logprobs.length, 2);
    }
  }
  checkUsage(plain.usage);

  // Streamed, with include_usage.
  let content = '';
  let usage = null;
  const stream = await client.chat.completions.create({
    ...request, stream: true, stream_options: { include_usage: true } });
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.choices.length > 0 && chunk.choices[0].delta.content) {
      content += chunk.choices[0].delta.content;
    }
    if (chunk.usage) usage = chunk.usage;
  }
  assert.equal(content, plain.choices[0].message.content);
  checkUsage(usage);

  // The SDK's stream helper, which checks every chunk's shape, on the adapter.
  const runner = client.chat.completions.stream({ ...request, model: adapter });
  const final = await runner.finalChatCompletion();
  assert.equal(final.model, adapter);
  assert.equal(final.choices[0].message.role, 'assistant');
  assert.equal(typeof final.choices[0].message.content, 'string');
}

async function errors() {
  await assert.rejects(
    client.completions.create({ model: 'no-such-model', prompt: 'x', max_tokens: 1 }),
    (e) => e instanceof OpenAI.NotFoundError && e.code === 'model_not_found');
  const stranger = new OpenAI({ ...options, apiKey: 'not-the-key' });
  await assert.rejects(stranger.models.list(),
                       (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
  await assert.rejects(
    client.chat.completions.create({ model: 'gpt', messages: [], max_tokens: 1 }),
    (e) => e instanceof OpenAI.BadRequestError && /messages/.test(e.message));
}

try {
  await models();
  await completions();
  await chat();
  await errors();
} catch (e) {
  console.log(`FAILED: ${e.stack || e}`);
  process.exit(1);
}
if (warnings.length > 0) {
  console.log(`FAILED: warnings:\n${warnings.join('\n')}`);
  process.exit(1);
}
console.log('openai SDK checks passed');
